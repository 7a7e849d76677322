// int8 GEMM on AMX tiles (int8_gemm.h's packed layout, read as it is: each block's quads are B-tile
// rows), for 16 rows and more.
//
// A register block is 32 rows x 32 columns: two A tiles (16 rows x one group of x's values), two B
// tiles (the group's quads x 16 columns, unsigned: w + 128) and four int32 C tiles; one `tdpbsud`
// is a whole group for 16 rows and 16 columns. The C tiles are stored after each group and scaled
// into fp32 sums exactly as the vector kernels scale theirs (int8_operands.h), so a row's output is
// the same bits whichever kernel computed it. The scaling, not the tiles, is most of the time: the
// stored sums of a span of groups are scaled together, each fp32 sum loaded and stored once a span.
//
// Work is split into units of (32 rows) x (2 blocks), claimed one at a time by whichever thread is
// free; every thread loads the tile configuration itself (it is per-thread state).
#include <torch/extension.h>

#include <cstdint>

#include "amx_tile_config.h"
#include "gemm.h"
#include "int8_operands.h"
#include "worker_pool.h"

#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AVX512F__)
#include <immintrin.h>

#include "amx_int8_products.h"
#define FORMWORK_AMX_INT8 1
#endif

namespace formwork::int8 {

#if defined(FORMWORK_AMX_INT8)
namespace {

constexpr int64_t kSpan = 4;  // groups multiplied before their sums are scaled
static_assert(kBlock == 16, "a block is one C tile's 16 int32 columns");

// C tiles 0-3: 16 rows x 16 int32; A tiles 4-5: 16 rows x one group's bytes; B tiles 6-7: the
// group's quads x 64 bytes
void configure_tiles(int64_t group) {
  formwork::TileConfig config;
  for (int t = 0; t < 4; ++t) {
    config.colsb[t] = 64;
    config.rows[t] = 16;
  }
  for (int t = 4; t < 6; ++t) {
    config.colsb[t] = static_cast<uint16_t>(group);
    config.rows[t] = 16;
  }
  for (int t = 6; t < 8; ++t) {
    config.colsb[t] = 64;
    config.rows[t] = static_cast<uint8_t>(group / 4);
  }
  _tile_loadconfig(&config);
}

// group g's int32 sums of rows [m0, m0 + 16 ma) x blocks [b0, b0 + nb), C tile t's into sums[t]
void multiply_group(const Operands& op, int64_t m0, int64_t ma, int64_t b0, int64_t nb, int64_t g,
                    int32_t (*sums)[16][kBlock]) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, op.x + m0 * op.kp + g * op.group, op.kp);
  if (ma == 2) _tile_loadd(5, op.x + (m0 + 16) * op.kp + g * op.group, op.kp);
  _tile_loadd(6, op.quad(b0, g * op.group_quads()), 4 * kBlock);
  if (nb == 2) _tile_loadd(7, op.quad(b0 + 1, g * op.group_quads()), 4 * kBlock);
  store_tile_products(ma, nb, sums);
}

// rows [m0, m0 + 16 ma) x blocks [b0, b0 + nb), ma and nb 1 or 2
void unit(const Operands& op, int64_t m0, int64_t ma, int64_t b0, int64_t nb) {
  alignas(64) int32_t sums[kSpan][4][16][kBlock];
  alignas(64) float scaled[4][16][kBlock] = {};
  for (int64_t g0 = 0; g0 < op.groups(); g0 += kSpan) {
    const int64_t span = std::min(kSpan, op.groups() - g0);
    for (int64_t s = 0; s < span; ++s) multiply_group(op, m0, ma, b0, nb, g0 + s, sums[s]);
    for (int64_t a = 0; a < ma; ++a)
      for (int64_t j = 0; j < nb; ++j) {
        __m512 w_scale[kSpan];
        for (int64_t s = 0; s < span; ++s) w_scale[s] = op.w_scales16(b0 + j, g0 + s);
        for (int64_t r = 0; r < 16; ++r) {
          const int64_t at = (m0 + 16 * a + r) * op.groups() + g0;
          const int32_t* x_offsets = op.x_offsets + at;
          const float* x_scales = op.x_scales + at;
          __m512 sum = _mm512_load_ps(scaled[2 * a + j][r]);
          for (int64_t s = 0; s < span; ++s) {
            const __m512i offset = _mm512_set1_epi32(x_offsets[s]);
            const __m512 scale = _mm512_mul_ps(w_scale[s], _mm512_set1_ps(x_scales[s]));
            const __m512i group_sum = _mm512_load_si512(sums[s][2 * a + j][r]);
            sum = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(group_sum, offset)), scale, sum);
          }
          _mm512_store_ps(scaled[2 * a + j][r], sum);
        }
      }
  }
  for (int64_t a = 0; a < ma; ++a)
    for (int64_t j = 0; j < nb; ++j)
      for (int64_t r = 0; r < std::min<int64_t>(16, op.m - m0 - 16 * a); ++r)
        store(op, m0 + 16 * a + r, (b0 + j) * kBlock, scaled[2 * a + j][r]);
}

}  // namespace

bool amx_int8_ready() { return formwork::gemm::amx_ready(); }

void multiply_amx(const Operands& op) {
  const int64_t num_steps = (op.m + 31) / 32, num_pairs = (op.num_blocks() + 1) / 2;
  // consecutive units share a block pair: its weights stay in L2 while the row steps pass over them
  formwork::parallel_chunks(num_steps * num_pairs, [&](int64_t chunk) {
    configure_tiles(op.group);
    const int64_t m0 = chunk % num_steps * 32, b0 = chunk / num_steps * 2;
    unit(op, m0, std::min<int64_t>(2, (op.m - m0 + 15) / 16), b0, std::min<int64_t>(2, op.num_blocks() - b0));
    _tile_release();
  });
}

#else  // no AMX-INT8 in this build

bool amx_int8_ready() { return false; }
void multiply_amx(const Operands&) { TORCH_CHECK(false, "this build has no AMX-INT8"); }

#endif

}  // namespace formwork::int8
