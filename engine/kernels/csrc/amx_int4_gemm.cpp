// 4-bit GEMM on AMX tiles (int4_gemm.h's packed layout), for 32 rows and more.
//
// A work unit is one pair of column blocks over all of K: its nibbles are unpacked once into bytes
// 0..15 in the int8 GEMM's quad layout (each 64-byte chunk into two B-tile rows), in a buffer of the
// thread's that stays in L2, and every 32 rows of x pass over it. A register block is 32 rows x 32
// columns: two A tiles (16 rows x one group of 32 values of x, signed), two B tiles (the group's 8
// quads x 16 columns, unsigned) and four int32 C tiles; one `tdpbsud` is a whole group. The int32
// sums are the vector kernels' (exact), and each group's are scaled into fp32 by the same operations
// (int4_operands.h): a row's output is the same bits whichever kernel computed it. As in the int8
// kernel, a span of groups is multiplied, every product issued before any store, and their stored
// sums are scaled together, each fp32 sum loaded and stored once a span. The files' groups are 32
// values, int8's 64: a `tdpbsud` does half of int8's, and twice as many sums are stored and scaled.
#include <torch/extension.h>

#include <cstdint>
#include <vector>

#include "amx_tile_config.h"
#include "gemm.h"
#include "int4_operands.h"
#include "worker_pool.h"

#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AVX512F__)
#include <immintrin.h>

#include "amx_int8_products.h"
#define FORMWORK_AMX_INT4 1
#endif

namespace formwork::int4 {

#if defined(FORMWORK_AMX_INT4)
namespace {

constexpr int64_t kQuadBytes = 4 * kBlock;  // one B-tile row: 16 columns x 4 values
constexpr int64_t kSpan = 4;                // groups multiplied before their sums are scaled
static_assert(kBlock == 16, "a block is one C tile's 16 int32 columns");

// C tiles 0-3: 16 rows x 16 int32; A tiles 4-5: 16 rows x 32 bytes; B tiles 6-7: 8 quads x 64 bytes
void configure_tiles() {
  formwork::TileConfig config;
  for (int t = 0; t < 4; ++t) {
    config.colsb[t] = 64;
    config.rows[t] = 16;
  }
  for (int t = 4; t < 6; ++t) {
    config.colsb[t] = kGroup;
    config.rows[t] = 16;
  }
  for (int t = 6; t < 8; ++t) {
    config.colsb[t] = kQuadBytes;
    config.rows[t] = kGroup / 4;
  }
  _tile_loadconfig(&config);
}

// block's nibbles as bytes, [kp / 4 quads, 16 columns, 4]: chunk c's low halves are quad 2c, its high ones 2c + 1
void unpack(const Operands& op, int64_t block, uint8_t* out) {
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  for (int64_t c = 0; c < op.kp / kChunkValues; ++c) {
    const __m512i w = _mm512_loadu_si512(op.chunk(block, c));
    _mm512_store_si512(out + 2 * c * kQuadBytes, _mm512_and_si512(w, nibble));
    _mm512_store_si512(out + (2 * c + 1) * kQuadBytes, _mm512_and_si512(_mm512_srli_epi16(w, 4), nibble));
  }
}

// group g's int32 sums of rows [m0, m0 + 16 ma) x blocks [b0, b0 + nb) from the unpacked blocks, C tile t's
// into sums[t]
void multiply_group(const Operands& op, const uint8_t* unpacked, int64_t m0, int64_t ma, int64_t nb, int64_t g,
                    int32_t (*sums)[16][kBlock]) {
  const int64_t block_quads = op.kp / 4;
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, op.x + m0 * op.kp + g * kGroup, op.kp);
  if (ma == 2) _tile_loadd(5, op.x + (m0 + 16) * op.kp + g * kGroup, op.kp);
  _tile_loadd(6, unpacked + g * (kGroup / 4) * kQuadBytes, kQuadBytes);
  if (nb == 2) _tile_loadd(7, unpacked + (block_quads + g * (kGroup / 4)) * kQuadBytes, kQuadBytes);
  store_tile_products(ma, nb, sums);
}

// rows [m0, m0 + 16 ma) x blocks [b0, b0 + nb) from the unpacked blocks; ma and nb 1 or 2. The sums of a
// span of groups are scaled together, each fp32 sum loaded and stored once a span, every group's by the
// same two fma as the vector kernels', in the same order.
void rows_unit(const Operands& op, const uint8_t* unpacked, int64_t m0, int64_t ma, int64_t b0, int64_t nb) {
  alignas(64) int32_t sums[kSpan][4][16][kBlock];
  alignas(64) float scaled[4][16][kBlock] = {};
  for (int64_t g0 = 0; g0 < op.groups(); g0 += kSpan) {
    const int64_t span = std::min(kSpan, op.groups() - g0);
    for (int64_t s = 0; s < span; ++s) multiply_group(op, unpacked, m0, ma, nb, g0 + s, sums[s]);
    for (int64_t a = 0; a < ma; ++a)
      for (int64_t j = 0; j < nb; ++j) {
        __m512 d[kSpan], mins[kSpan];
        for (int64_t s = 0; s < span; ++s) {
          d[s] = formwork::widen_half16(op.w_d(b0 + j, g0 + s));
          mins[s] = formwork::widen_half16(op.w_m(b0 + j, g0 + s));
        }
        for (int64_t r = 0; r < 16; ++r) {
          const int64_t at = (m0 + 16 * a + r) * op.groups() + g0;
          const float* x_scales = op.x_scales + at;
          const float* x_offsets = op.x_offsets + at;
          __m512 sum = _mm512_load_ps(scaled[2 * a + j][r]);
          for (int64_t s = 0; s < span; ++s) {
            const __m512 scale = _mm512_mul_ps(d[s], _mm512_set1_ps(x_scales[s]));
            const __m512 group_sum = _mm512_cvtepi32_ps(_mm512_load_si512(sums[s][2 * a + j][r]));
            sum = _mm512_fmadd_ps(group_sum, scale, sum);
            sum = _mm512_fmadd_ps(mins[s], _mm512_set1_ps(x_offsets[s]), sum);
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

bool amx_int4_ready() { return formwork::gemm::amx_ready(); }

void multiply_amx(const Operands& op) {
  const int64_t num_pairs = (op.num_blocks() + 1) / 2;
  formwork::parallel_chunks(num_pairs, [&](int64_t pair) {
    thread_local std::vector<uint8_t, std::allocator<uint8_t>> buffer;
    const int64_t block_bytes = op.kp * kBlock, b0 = 2 * pair, nb = std::min<int64_t>(2, op.num_blocks() - b0);
    if (static_cast<int64_t>(buffer.size()) < 2 * block_bytes + 64) buffer.resize(2 * block_bytes + 64);
    uint8_t* unpacked = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(buffer.data()) + 63) & ~uintptr_t{63});
    for (int64_t j = 0; j < nb; ++j) unpack(op, b0 + j, unpacked + j * block_bytes);
    configure_tiles();
    for (int64_t m0 = 0; m0 < op.m; m0 += 32)
      rows_unit(op, unpacked, m0, std::min<int64_t>(2, (op.m - m0 + 15) / 16), b0, nb);
    _tile_release();
  });
}

#else  // no AMX-INT8 in this build

bool amx_int4_ready() { return false; }
void multiply_amx(const Operands&) { TORCH_CHECK(false, "this build has no AMX-INT8"); }

#endif

}  // namespace formwork::int4
