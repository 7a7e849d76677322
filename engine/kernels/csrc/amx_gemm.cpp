// bf16 GEMM on AMX tiles (gemm.h's packed layout, read as it is: each block's pairs are B-tile rows).
//
// A register block is 32 rows x 32 columns: two A tiles (16 rows x 32 K values of x), two B tiles
// (16 pairs x 16 columns of the weight) and four fp32 C tiles; one `tdpbf16ps` is 16 x 16 x 32
// multiply-adds. x is first copied, a chunk of rows at a time, into a zero-padded buffer of whole
// tiles (rows to 16, K to 32), so every tile is full and no tile reads past a row. Threads split
// the columns into panels of 2 blocks, claimed chunk by chunk; every thread loads the tile
// configuration itself (it is per-thread state). Sums are fp32; the output is rounded once.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <vector>

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

constexpr int64_t kChunkBytes = 512 << 10;  // x rows per pass over the weight: about this many bytes

struct alignas(64) TileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// every tile 16 rows x 64 bytes: C tiles 0-3, A tiles 4-5, B tiles 6-7
void configure_tiles() {
  TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.colsb[t] = 64;
    config.rows[t] = 16;
  }
  _tile_loadconfig(&config);
}

// c (MA * NB tiles of 16 x 16 fp32, row-major) = x tiles (MA x 16 rows, stride x_stride) @ the
// weight's blocks (NB, stride w_stride), over `steps` of 32 K values
template <int MA, int NB>
void block(const uint16_t* x, int64_t x_stride, const uint16_t* w, int64_t w_stride, int64_t steps, float* c) {
  _tile_zero(0);
  if constexpr (NB == 2) _tile_zero(1);
  if constexpr (MA == 2) _tile_zero(2);
  if constexpr (MA == 2 && NB == 2) _tile_zero(3);
  const int64_t x_bytes = x_stride * 2;
  for (int64_t s = 0; s < steps; ++s) {
    _tile_loadd(4, x + 32 * s, x_bytes);
    if constexpr (MA == 2) _tile_loadd(5, x + 16 * x_stride + 32 * s, x_bytes);
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

using Block = void (*)(const uint16_t*, int64_t, const uint16_t*, int64_t, int64_t, float*);

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
  const int64_t num_blocks = op.num_blocks(), num_panels = (num_blocks + 1) / 2;
  const int64_t chunk_rows = std::max<int64_t>(32, kChunkBytes / (2 * k_pad) / 32 * 32);
  const int64_t chunk_panels = std::max<int64_t>(1, num_panels / 16);  // about 16 chunks of work
  const int64_t num_chunks = (num_panels + chunk_panels - 1) / chunk_panels;
  std::vector<uint16_t> x_tiles;
  for (int64_t m_chunk = 0; m_chunk < op.m; m_chunk += chunk_rows) {
    const int64_t rows = std::min(chunk_rows, op.m - m_chunk), rows_pad = (rows + 15) / 16 * 16;
    x_tiles.assign(rows_pad * k_pad, 0);
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(x_tiles.data() + r * k_pad, op.x + (m_chunk + r) * op.x_stride, op.k * sizeof(uint16_t));
    formwork::parallel_chunks(num_chunks, [&](int64_t chunk) {
      configure_tiles();
      alignas(64) float c[4 * 256];
      for (int64_t panel = chunk * chunk_panels; panel < std::min(num_panels, (chunk + 1) * chunk_panels); ++panel) {
        const int64_t b0 = 2 * panel, nb = std::min<int64_t>(2, num_blocks - b0);
        for (int64_t m0 = 0; m0 < rows_pad; m0 += 32) {
          const int64_t ma = std::min<int64_t>(2, (rows_pad - m0) / 16);
          block_for(ma, nb)(x_tiles.data() + m0 * k_pad, k_pad, op.w + b0 * stride, stride, steps, c);
          for (int64_t a = 0; a < ma; ++a)
            for (int64_t j = 0; j < nb; ++j) {
              const int64_t row = m0 + 16 * a, col = (b0 + j) * kBlock;
              const int64_t at = (m_chunk + row) * op.n + col;
              store(c + (a * 2 + j) * 256, std::min<int64_t>(16, rows - row), std::min<int64_t>(kBlock, op.n - col),
                    op.bias == nullptr ? nullptr : op.bias + col, op.y32 == nullptr ? op.y + at : nullptr,
                    op.y32 == nullptr ? nullptr : op.y32 + at, op.n);
            }
        }
      }
      _tile_release();
    });
  }
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
      for (int64_t r = 0; r < repeats; ++r) block<2, 2>(x.data(), k, w.data(), (k / 2) * 32, k / 32, c);
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
