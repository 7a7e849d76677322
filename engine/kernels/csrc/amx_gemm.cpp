// bf16 GEMM on AMX tiles (gemm.h's packed layout, read as it is: each block's pairs are B-tile rows).
//
// A register block is 32 rows x 32 columns: two A tiles (16 rows x 32 K values of x), two B tiles
// (16 pairs x 16 columns of the weight) and four fp32 C tiles; one `tdpbf16ps` is 16 x 16 x 32
// multiply-adds. A tiles are loaded straight from x's rows where a tile is 16 whole rows and K a
// multiple of 32; the rest (a last partial tile, an odd K) is first copied into a zero-padded
// buffer, so every tile is full and no tile reads past a row.
//
// Work is split into units of (a range of rows) x (a panel of up to 8 blocks), claimed one at a
// time by whichever thread is free. A unit walks its rows 32 at a time and, for each 32, every
// block pair of its panel: the 32 rows of x stay in L1 across the panel, and the panel (up to
// 8 x K x 32 bytes) stays in L2 across the rows. Row ranges are sized so that a range of x fits
// L2 beside its panel; small batches have one range and more, narrower panels (about 16 units),
// so both threads share the weight read. Every thread loads the tile configuration itself (it is
// per-thread state). Sums are fp32; the output is rounded once.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <vector>

#include "amx_tile_config.h"
#include "gemm.h"
#include "worker_pool.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define FORMWORK_AMX 1
#endif

namespace formwork::gemm {

#if defined(FORMWORK_AMX)
namespace {

constexpr int64_t kRangeBytes = 512 << 10;  // rows of x per unit: about this many bytes
constexpr int64_t kMaxPanelBlocks = 8;      // blocks per unit at most (8 x K x 32 bytes of weight)
constexpr int64_t kMinUnits = 16;           // units per call, at least, where the weight allows

// every tile 16 rows x 64 bytes: C tiles 0-3, A tiles 4-5, B tiles 6-7
void configure_tiles() {
  formwork::TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.colsb[t] = 64;
    config.rows[t] = 16;
  }
  _tile_loadconfig(&config);
}

// c (MA * NB tiles of 16 x 16 fp32, row-major) = x tiles (MA of them, each 16 rows at x0 / x1 with
// their row strides) @ the weight's blocks (NB, stride w_stride), over `steps` of 32 K values
template <int MA, int NB>
void block(const uint16_t* x0, int64_t x0_stride, const uint16_t* x1, int64_t x1_stride, const uint16_t* w,
           int64_t w_stride, int64_t steps, float* c) {
  _tile_zero(0);
  if constexpr (NB == 2) _tile_zero(1);
  if constexpr (MA == 2) _tile_zero(2);
  if constexpr (MA == 2 && NB == 2) _tile_zero(3);
  for (int64_t s = 0; s < steps; ++s) {
    _tile_loadd(4, x0 + 32 * s, x0_stride * 2);
    if constexpr (MA == 2) _tile_loadd(5, x1 + 32 * s, x1_stride * 2);
    _tile_loadd(6, w + 512 * s, 64);
    if constexpr (NB == 2) _tile_loadd(7, w + w_stride + 512 * s, 64);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (NB == 2) _tile_dpbf16ps(1, 4, 7);
    if constexpr (MA == 2) _tile_dpbf16ps(2, 5, 6);
    if constexpr (MA == 2 && NB == 2) _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, 64);
  if constexpr (NB == 2) _tile_stored(1, c + 256, 64);
  if constexpr (MA == 2) _tile_stored(2, c + 512, 64);
  if constexpr (MA == 2 && NB == 2) _tile_stored(3, c + 768, 64);
}

using Block = void (*)(const uint16_t*, int64_t, const uint16_t*, int64_t, const uint16_t*, int64_t, int64_t,
                       float*);

Block block_for(int64_t ma, int64_t nb) {
  if (ma == 2) return nb == 2 ? block<2, 2> : block<2, 1>;
  return nb == 2 ? block<1, 2> : block<1, 1>;
}

// one C tile (rows x cols of it valid) + bias, rounded to bf16 into y, or as it is into y32
void store(const float* c, int64_t rows, int64_t cols, const uint16_t* bias, uint16_t* y, float* y32,
           int64_t y_stride) {
  const __mmask16 mask = static_cast<__mmask16>((1u << cols) - 1);
  __m512 b = _mm512_setzero_ps();
  if (bias != nullptr)
    b = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, bias)), 16));
  for (int64_t r = 0; r < rows; ++r) {
    const __m512 sum = _mm512_add_ps(_mm512_loadu_ps(c + 16 * r), b);
    if (y32 != nullptr)
      _mm512_mask_storeu_ps(y32 + r * y_stride, mask, sum);
    else  // round to nearest even, as a bf16 matmul does
      _mm256_mask_storeu_epi16(y + r * y_stride, mask, (__m256i)_mm512_cvtneps_pbh(sum));
  }
}

}  // namespace

bool amx_ready() {
  // Linux hands out the 8 KiB tile state only to processes that ask (ARCH_REQ_XCOMP_PERM, XTILEDATA)
  static const bool ready = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
  return ready;
}

void multiply_amx(const Operands& op) {
  const int64_t k_pad = padded_pairs(op.k) * 2, steps = k_pad / 32, stride = op.block_stride();
  const int64_t num_blocks = op.num_blocks();
  // rows [0, direct) are read in place, 16 at a time; the others from `rest`, zero padded
  const int64_t direct = op.k % 32 == 0 ? op.m / 16 * 16 : 0;
  std::vector<uint16_t> rest((op.m - direct + 15) / 16 * 16 * k_pad, 0);
  for (int64_t r = direct; r < op.m; ++r)
    std::memcpy(rest.data() + (r - direct) * k_pad, op.x + r * op.x_stride, op.k * sizeof(uint16_t));
  const auto a_tile = [&](int64_t row, const uint16_t*& at, int64_t& row_stride) {
    if (row + 16 <= direct) {
      at = op.x + row * op.x_stride;
      row_stride = op.x_stride;
    } else {
      at = rest.data() + (row - direct) * k_pad;
      row_stride = k_pad;
    }
  };
  // units: row ranges of whole 32-row steps, each about kRangeBytes of x, times panels of blocks
  const int64_t ranges_wanted = std::max<int64_t>(1, (op.m * k_pad * 2 + kRangeBytes - 1) / kRangeBytes);
  const int64_t range_rows = ((op.m + ranges_wanted - 1) / ranges_wanted + 31) / 32 * 32;
  const int64_t num_ranges = (op.m + range_rows - 1) / range_rows;
  const int64_t panel_blocks =
      std::min(kMaxPanelBlocks, 2 * std::max<int64_t>(1, (num_blocks + 1) / 2 * num_ranges / kMinUnits));
  const int64_t num_panels = (num_blocks + panel_blocks - 1) / panel_blocks;
  formwork::parallel_chunks(num_ranges * num_panels, [&](int64_t unit) {
    configure_tiles();
    alignas(64) float c[4 * 256];
    const int64_t b_begin = unit % num_panels * panel_blocks, b_end = std::min(num_blocks, b_begin + panel_blocks);
    const int64_t m_begin = unit / num_panels * range_rows, m_end = std::min(op.m, m_begin + range_rows);
    for (int64_t m0 = m_begin; m0 < m_end; m0 += 32) {
      const int64_t ma = std::min<int64_t>(2, (m_end - m0 + 15) / 16);
      const uint16_t *x0 = nullptr, *x1 = nullptr;
      int64_t x0_stride = 0, x1_stride = 0;
      a_tile(m0, x0, x0_stride);
      if (ma == 2) a_tile(m0 + 16, x1, x1_stride);
      for (int64_t b0 = b_begin; b0 < b_end; b0 += 2) {
        const int64_t nb = std::min<int64_t>(2, b_end - b0);
        block_for(ma, nb)(x0, x0_stride, x1, x1_stride, op.w + b0 * stride, stride, steps, c);
        for (int64_t a = 0; a < ma; ++a)
          for (int64_t j = 0; j < nb; ++j) {
            const int64_t row = m0 + 16 * a, col = (b0 + j) * kBlock, at = row * op.n + col;
            store(c + (a * 2 + j) * 256, std::min<int64_t>(16, m_end - row), std::min<int64_t>(kBlock, op.n - col),
                  op.bias == nullptr ? nullptr : op.bias + col, op.y32 == nullptr ? op.y + at : nullptr,
                  op.y32 == nullptr ? nullptr : op.y32 + at, op.n);
          }
      }
    }
    _tile_release();
  });
}

double amx_inner_loop_gflops(int64_t repeats) {
  constexpr int64_t k = 256;  // x: 32 x 256 bf16 = 16 KiB; two blocks' 128 pairs: 16 KiB
  if (!amx_ready()) return 0.0;
  const int64_t threads = at::get_num_threads();
  const auto start = std::chrono::steady_clock::now();
  at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
    configure_tiles();
    std::vector<uint16_t> x(32 * k, 0x3F80), w(2 * (k / 2) * 32, 0x3F80);
    alignas(64) float c[4 * 256];
    for (int64_t t = begin; t < end; ++t)
      for (int64_t r = 0; r < repeats; ++r) block<2, 2>(x.data(), k, x.data() + 16 * k, k, w.data(), (k / 2) * 32, k / 32, c);
    _tile_release();
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return 2.0 * 32 * 32 * k * repeats * threads / seconds / 1e9;
}

#else  // no AMX in this build

bool amx_ready() { return false; }
void multiply_amx(const Operands&) { TORCH_CHECK(false, "this build has no AMX"); }
double amx_inner_loop_gflops(int64_t) { return 0.0; }

#endif

}  // namespace formwork::gemm
