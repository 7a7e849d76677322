// p.v of paged_attention_bf16.h on AMX tiles (where scores_on_amx: every run of the process, decodes
// too, so that a query's output is the same bits in a run of any length as alone).
//
// The weights are bf16 (softmax_weights_bf16), one row per query head over the run's keys by
// absolute position from a 32-key boundary, 0 where a key is not the head's; the values are B tiles
// of pairs by key (row p of a chunk's tile: dims of keys 32c + 2p, 2p + 1 interleaved), packed once
// per run and kv head and read by every 16-head A tile of it. An output element is one C element:
// zero, then one `tdpbf16ps` per 32-key chunk in position order, and its sum reads its own weight
// row alone. Chunks or keys that are not a head's add exact zeros (weight 0 times a finite value),
// which leave a sum's bits as they are, so which chunks a run spans changes nothing. Keys outside
// the run's [lo, hi) are packed as zero rows: freed or unwritten cache rows (NaN, infinite) never
// meet a weight.
#pragma once
#if defined(__AVX512BF16__)

#include <torch/extension.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "paged_attention_amx.h"
#include "paged_attention_step.h"

namespace formwork::paged {

constexpr int kValueKeys = 32;  // keys of one A tile's row: one tdpbf16ps over a chunk of values

// floats of a run's packed values over the keys [base, end) (multiples of kValueKeys)
template <int D>
constexpr int64_t packed_value_floats(int64_t keys) {
  return keys * D / 2;
}

#if defined(FORMWORK_ATTENTION_AMX)
// The V rows [base, end) (multiples of kValueKeys) at one kv head as B tiles: [chunk][D/16 tiles][16
// pairs][16 words], rows outside [lo, hi) zero. Within a 32-dim group g, tile 2g holds the pairs of
// dims 32g + {0-3, 8-11, 16-19, 24-27} and tile 2g + 1 those of the other four of each eight: what
// one unpack of two rows gives; values_to_rows puts the dims back in order.
template <int D>
void pack_values(const Step<Bf16>& st, int64_t longest, int64_t kv_head, int64_t base, int64_t end, int64_t lo,
                 int64_t hi, uint16_t* __restrict packed) {
  alignas(64) static const uint16_t kZeroRow[D] = {};
  KeyRows<Bf16> values(st, st.v_cache, longest, kv_head, lo);
  for (int64_t t = base; t < end; t += 2) {
    const auto* a = t >= lo && t < hi ? reinterpret_cast<const uint16_t*>(values.next()) : kZeroRow;
    const auto* b = t + 1 >= lo && t + 1 < hi ? reinterpret_cast<const uint16_t*>(values.next()) : kZeroRow;
    uint16_t* tiles = packed + (t - base) / kValueKeys * (D / 16) * 512 + (t - base) % kValueKeys / 2 * 32;
    for (int g = 0; g < D / 32; ++g) {
      const __m512i x = _mm512_loadu_si512(a + 32 * g), y = _mm512_loadu_si512(b + 32 * g);
      _mm512_store_si512(tiles + 2 * g * 512, _mm512_unpacklo_epi16(x, y));
      _mm512_store_si512(tiles + (2 * g + 1) * 512, _mm512_unpackhi_epi16(x, y));
    }
  }
}

// C tiles 0-3 (16 heads x 16 packed dims each, fp32) += the weights' A tile at `weights` (16 rows,
// weight_bytes apart) . tiles [first, first + 4) of one packed chunk
inline void add_value_chunk(const uint16_t* weights, int64_t weight_bytes, const uint16_t* chunk_tiles) {
  _tile_loadd(4, weights, weight_bytes);
  _tile_loadd(5, chunk_tiles, 64);
  _tile_dpbf16ps(0, 4, 5);
  _tile_loadd(6, chunk_tiles + 512, 64);
  _tile_dpbf16ps(1, 4, 6);
  _tile_loadd(5, chunk_tiles + 1024, 64);
  _tile_dpbf16ps(2, 4, 5);
  _tile_loadd(6, chunk_tiles + 1536, 64);
  _tile_dpbf16ps(3, 4, 6);
}

// Row n of c (4 stored C tiles, [4][16][16]) as 64 output dims in order, times inv_sum, rounded to
// bf16 into out: tiles 2g, 2g + 1 hold dims 32g .. 32g + 31 four by four in turn (pack_values).
inline void values_to_rows(const float* c, int n, float inv_sum, Bf16* out) {
  const __m512i low = _mm512_set_epi32(23, 22, 21, 20, 7, 6, 5, 4, 19, 18, 17, 16, 3, 2, 1, 0);
  const __m512i high = _mm512_set_epi32(31, 30, 29, 28, 15, 14, 13, 12, 27, 26, 25, 24, 11, 10, 9, 8);
  const __m512 inv = _mm512_set1_ps(inv_sum);
  for (int g = 0; g < 2; ++g) {
    const __m512 x = _mm512_load_ps(c + (2 * g) * 256 + 16 * n), y = _mm512_load_ps(c + (2 * g + 1) * 256 + 16 * n);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 32 * g),
                        (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_permutex2var_ps(x, low, y), inv)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 32 * g + 16),
                        (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_permutex2var_ps(x, high, y), inv)));
  }
}

// The outputs of a run's `heads` query heads (head a: query a / G, its head a % G) at one kv head:
// weights [heads to a whole tile][weight_stride] bf16 from a key that is a multiple of kValueKeys
// (weight_stride keys, a multiple of it too), each head's nonzero ones within [from[a / G], to[a /
// G]) counted from that key; packed: pack_values over the same keys; c: 4 * 256 floats, 64-byte
// aligned. Output a is rows_out[a / G] + (a % G) * D, times inv_sums[a].
template <int D, int G>
void add_values_amx(int64_t heads, const uint16_t* weights, int64_t weight_stride, const int64_t from[],
                    const int64_t to[], const uint16_t* packed, const float* inv_sums, Bf16* const rows_out[],
                    float* c) {
  static_assert(D % 64 == 0, "whole groups of 4 C tiles");
  const int64_t weight_bytes = weight_stride * sizeof(uint16_t);
  for (int64_t a0 = 0; a0 < heads; a0 += 16) {
    const int64_t a1 = std::min<int64_t>(heads, a0 + 16);
    int64_t lo = INT64_MAX, hi = 0;  // the chunks where any of the 16 heads has a weight
    for (int64_t r = a0 / G; r <= (a1 - 1) / G; ++r) lo = std::min(lo, from[r]), hi = std::max(hi, to[r]);
    const int64_t c0 = lo / kValueKeys, c1 = (hi + kValueKeys - 1) / kValueKeys;
    for (int half = 0; half < D / 64; ++half) {  // 64 output dims: 4 C tiles
      asm volatile("" ::: "memory");  // tileloadd's asm names no memory: weights and packed values stored first
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t k = c0; k < c1; ++k)
        add_value_chunk(weights + a0 * weight_stride + k * kValueKeys, weight_bytes,
                        packed + (k * (D / 16) + 4 * half) * 512);
      _tile_stored(0, c, 64);
      _tile_stored(1, c + 256, 64);
      _tile_stored(2, c + 512, 64);
      _tile_stored(3, c + 768, 64);
      asm volatile("" ::: "memory");  // nor does tilestored's: c is read next
      for (int64_t a = a0; a < a1; ++a)
        values_to_rows(c, static_cast<int>(a - a0), inv_sums[a], rows_out[a / G] + (a % G) * D + 64 * half);
    }
  }
}
#endif

}  // namespace formwork::paged

#endif
