// p.v of paged_attention_bf16.h on AMX tiles (where scores_on_amx: every run of the process, decodes
// too, so that a query's output is the same bits in a run of any length as alone).
//
// The weights are bf16 (softmax_weights_bf16), one row per query head over the run's keys by
// absolute position from a 32-key boundary, 0 where a key is not the head's; the values are B tiles
// of pairs by key (row p of a chunk's tile: dims of keys 32c + 2p, 2p + 1 interleaved), packed once
// per run and kv head for all its 16-head A tiles (chunk by chunk as they are added where the run's
// heads are one tile). An output element is one C element: zero, then one `tdpbf16ps` per 32-key
// chunk in position order, and its sum reads its own weight row alone. Chunks or keys that are not
// a head's add exact zeros (weight 0 times a finite value), which leave a sum's bits as they are,
// so which chunks a run spans changes nothing. Keys outside the run's [lo, hi) are packed as zero
// rows: freed or unwritten cache rows (NaN, infinite) never meet a weight.
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

// floats add_values_amx works in over weight_stride keys: 4 C tiles, then the packed values (all
// of them, or two chunks' tiles at a time)
template <int D>
constexpr int64_t add_values_work_floats(int64_t weight_stride) {
  return 4 * 256 + std::max<int64_t>(weight_stride, 2 * kValueKeys) * D / 2;
}

#if defined(FORMWORK_ATTENTION_AMX)
// The 32 V rows of one chunk (rows[i]: key i's D values) as B tiles of pairs by key, the tiles of
// 32-dim groups [g0, g1) at tiles[0 ..] (16 pairs x 16 words each). Within group g, tile 2g holds
// the pairs of dims 32g + {0-3, 8-11, 16-19, 24-27} and tile 2g + 1 those of the other four of each
// eight: what one unpack of two rows gives; values_to_rows puts the dims back in order.
inline void pack_value_chunk(const uint16_t* const rows[kValueKeys], int g0, int g1, uint16_t* __restrict tiles) {
  for (int p = 0; p < kValueKeys / 2; ++p)
    for (int g = g0; g < g1; ++g) {
      const __m512i x = _mm512_loadu_si512(rows[2 * p] + 32 * g), y = _mm512_loadu_si512(rows[2 * p + 1] + 32 * g);
      _mm512_store_si512(tiles + (2 * (g - g0)) * 512 + 32 * p, _mm512_unpacklo_epi16(x, y));
      _mm512_store_si512(tiles + (2 * (g - g0) + 1) * 512 + 32 * p, _mm512_unpackhi_epi16(x, y));
    }
}

// Walks a run's V rows at one kv head chunk by chunk from `base` (a multiple of kValueKeys): rows
// outside the run's keys [lo, hi) are a zero row.
template <int D>
class ValueChunks {
 public:
  ValueChunks(const Step<Bf16>& st, int64_t longest, int64_t kv_head, int64_t base, int64_t lo, int64_t hi)
      : values_(st, st.v_cache, longest, kv_head, lo), next_(base), lo_(lo), hi_(hi) {}

  // the next chunk's 32 rows, as pack_value_chunk takes them
  void next(const uint16_t* rows[kValueKeys]) {
    alignas(64) static const uint16_t kZeroRow[D] = {};
    for (int i = 0; i < kValueKeys; ++i, ++next_)
      rows[i] = next_ >= lo_ && next_ < hi_ ? reinterpret_cast<const uint16_t*>(values_.next()) : kZeroRow;
  }

 private:
  KeyRows<Bf16> values_;
  int64_t next_, lo_, hi_;
};

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
// weights [heads to a whole tile][weight_stride] bf16 from key `base` (a multiple of kValueKeys;
// weight_stride keys, a multiple of it too), each head's nonzero ones within [base + from[a / G],
// base + to[a / G]); V rows: the run's keys [lo, hi) through block-table row `longest`. Output a is
// rows_out[a / G] + (a % G) * D, times inv_sums[a]. work: add_values_work_floats<D>(weight_stride)
// floats, 64-byte aligned. The values are packed chunk by chunk as they are added where the heads
// are one A tile (decodes), else packed once for all the run's tiles: the same sums either way.
template <int D, int G>
void add_values_amx(const Step<Bf16>& st, int64_t longest, int64_t kv_head, int64_t heads, const uint16_t* weights,
                    int64_t weight_stride, int64_t base, int64_t lo, int64_t hi, const int64_t from[],
                    const int64_t to[], const float* inv_sums, Bf16* const rows_out[], float* work) {
  static_assert(D % 64 == 0, "whole groups of 4 C tiles");
  const int64_t weight_bytes = weight_stride * sizeof(uint16_t), num_chunks = weight_stride / kValueKeys;
  float* c = work;
  auto* packed = reinterpret_cast<uint16_t*>(work + 4 * 256);
  const bool streamed = heads <= 16;
  if (!streamed) {
    ValueChunks<D> chunks(st, longest, kv_head, base, lo, hi);
    for (int64_t k = 0; k < num_chunks; ++k) {
      const uint16_t* rows[kValueKeys];
      chunks.next(rows);
      pack_value_chunk(rows, 0, D / 32, packed + k * (D / 16) * 512);
    }
  }
  configure_attention_tiles();
  for (int64_t a0 = 0; a0 < heads; a0 += 16) {
    const int64_t a1 = std::min<int64_t>(heads, a0 + 16);
    int64_t first = INT64_MAX, last = 0;  // the chunks where any of the 16 heads has a weight
    for (int64_t r = a0 / G; r <= (a1 - 1) / G; ++r) first = std::min(first, from[r]), last = std::max(last, to[r]);
    const int64_t c0 = first / kValueKeys, c1 = (last + kValueKeys - 1) / kValueKeys;
    for (int half = 0; half < D / 64; ++half) {  // 64 output dims: 4 C tiles
      ValueChunks<D> chunks(st, longest, kv_head, base + c0 * kValueKeys, lo, hi);
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t k = c0; k < c1; ++k) {
        uint16_t* tiles = packed + (k * (D / 16) + 4 * half) * 512;
        if (streamed) {  // two chunks' tiles in turn: a chunk's stores are not waited on by the next
          const uint16_t* rows[kValueKeys];
          chunks.next(rows);
          tiles = packed + (k & 1) * 4 * 512;
          pack_value_chunk(rows, 2 * half, 2 * half + 2, tiles);
        }
        asm volatile("" ::: "memory");  // tileloadd's asm names no memory: weights and tiles stored first
        add_value_chunk(weights + a0 * weight_stride + k * kValueKeys, weight_bytes, tiles);
      }
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
