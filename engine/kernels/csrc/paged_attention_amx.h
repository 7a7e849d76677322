// q.k of paged_attention_bf16.h on AMX tiles, one choice per process (scores_on_amx), in one of two
// ways that give every score the same bits: `tdpbf16ps` adds a C element's pair products in pair
// order whichever operand holds the keys.
// - Keys as the A operand (score_run_by_key_tiles: block_size % 16 == 0 and a run of at most 16
//   query heads, as every decode): a chunk of 16 keys at positions 16c .. 16c + 15 lies in one
//   block, so its K rows are one strided `tileloadd` straight from the cache, no transpose. The
//   run's query heads are B tiles of pairs (row p: pair p of the 16 heads), built once per run and
//   kv head; C is [16 keys][16 query heads] and a query head's 16 scores are its column (gathered,
//   or the C tile transposed when many are used). A key's C row reads that key's K row alone: rows
//   past the sequence (garbage, even NaN) reach no other key's score, and their lanes become
//   kPadScore.
// - Keys as the B operand (score_tile_amx: other block sizes, and longer runs, for which one K
//   transpose costs less than a C transpose per 16 heads): the chunk transposed into pairs by key
//   (transpose_chunk), the query heads' rows the A tile; a query head's scores are its C row.
#pragma once
#if defined(__AVX512BF16__)

#include <torch/extension.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "gemm.h"
#include "paged_attention_step.h"
#include "transpose16.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define FORMWORK_ATTENTION_AMX 1
#endif

namespace formwork::paged {

// Whether q.k goes to AMX tiles: where the build and the OS allow them, unless
// FORMWORK_CPU_ATTENTION_AMX=0 (to test the vector path on such a machine). Decided once per
// process, so that every query of it takes the same path.
inline bool scores_on_amx() {
#if defined(FORMWORK_ATTENTION_AMX)
  static const bool amx = [] {
    const char* env = std::getenv("FORMWORK_CPU_ATTENTION_AMX");
    return !(env != nullptr && std::strcmp(env, "0") == 0) && formwork::gemm::amx_ready();
  }();
  return amx;
#else
  return false;
#endif
}

// floats score_run_by_key_tiles works in: the query tiles, then the C tile
template <int D>
constexpr int64_t key_tile_work_floats() {
  return (D / 32) * 256 + 256;
}

#if defined(FORMWORK_ATTENTION_AMX)
using Bf16 = c10::BFloat16;

constexpr int kGatheredHeads = 6;  // up to this many used heads of the C tile are gathered, more transposed
constexpr int kPrefetchChunks = 4;  // how far ahead the score pass prefetches K and V rows

// every tile 16 rows x 64 bytes (the tile configuration is per-thread state: each item loads it)
inline void configure_attention_tiles() {
  struct alignas(64) {
    uint8_t palette_id = 1, start_row = 0, reserved[14] = {};
    uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
    uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
  } config;
  _tile_loadconfig(&config);
}

// c (16 query heads x 16 keys, fp32) = q_rows (16 query heads of D values, D apart) . a chunk's tile
// (transpose_chunk), in D/32 steps of one tdpbf16ps: one query head's scores are its row alone
template <int D>
void score_tile_amx(const Bf16* q_rows, const float* tile, float* c) {
  asm volatile("" ::: "memory");  // tileloadd's asm names no memory: the q rows and tiles must be stored first
  _tile_zero(0);
  for (int j = 0; j < D / 32; ++j) {
    _tile_loadd(1, q_rows + 32 * j, D * sizeof(Bf16));
    _tile_loadd(2, tile + 16 * kKeys * j, kKeys * sizeof(float));
    _tile_dpbf16ps(0, 1, 2);
  }
  _tile_stored(0, c, kKeys * sizeof(float));
}

// The run's heads <= 16 query heads (head a: q[a / G] + (a % G) * D) as D/32 B tiles of 16 rows x
// 16 words: word n of row p of tile j is pair 16j + p of head n (dims 32j + 2p, + 1); heads past
// the run's are 0.
template <int D, int G>
void pack_query_tiles(const Bf16* const q[], int64_t heads, float* tiles) {
  for (int j = 0; j < D / 32; ++j) {
    __m512 r[16];
    for (int n = 0; n < 16; ++n)
      r[n] = n < heads ? _mm512_loadu_ps(q[n / G] + (n % G) * D + 32 * j) : _mm512_setzero_ps();
    transpose16(r);
    for (int p = 0; p < 16; ++p) _mm512_store_ps(tiles + (j * 16 + p) * 16, r[p]);
  }
}

// c (16 keys x 16 query heads, fp32) = the 16 K rows at `keys`, key_bytes apart, . the query tiles
// (pack_query_tiles), in D/32 steps of one tdpbf16ps: A tiles 3 and 7, B tiles 4 and 5 in turn
template <int D>
void score_keys_amx(const Bf16* keys, int64_t key_bytes, const float* q_tiles, float* c) {
  asm volatile("" ::: "memory");  // tileloadd's asm names no memory: the query tiles must be stored first
  _tile_zero(0);
  for (int j = 0; j < D / 32; j += 2) {
    _tile_loadd(3, keys + 32 * j, key_bytes);
    _tile_loadd(4, q_tiles + j * 256, 64);
    _tile_dpbf16ps(0, 3, 4);
    _tile_loadd(7, keys + 32 * (j + 1), key_bytes);
    _tile_loadd(5, q_tiles + (j + 1) * 256, 64);
    _tile_dpbf16ps(0, 7, 5);
  }
  _tile_stored(0, c, 64);
  asm volatile("" ::: "memory");  // nor does tilestored's: c is read next
}

// The K rows of chunk c (positions 16c ..) at one kv head: one block's rows, row_stride apart
inline const Bf16* chunk_keys(const Step<Bf16>& st, const int32_t* blocks, int64_t kv_head, int64_t c) {
  const int64_t pos = c * kKeys;
  return st.k_cache + (static_cast<int64_t>(blocks[pos / st.block_size]) * st.block_size + pos % st.block_size)
                          * st.row_stride() + kv_head * st.head_dim;
}

// The scores of a run's num queries at one kv head with the keys as A tiles (block_size % 16 == 0,
// num * G <= 16): query r (q[r]: its G heads; keys [first[r], end[r]), chunks from chunk0[r];
// block-table row `longest` holds every key of the run) gets head h's scores, scaled, at scores +
// (r G + h) * row_stride from its first chunk on, lanes that are not its keys kPadScore. work:
// key_tile_work_floats<D>() floats, 64-byte aligned.
template <int D, int G>
void score_run_by_key_tiles(const Step<Bf16>& st, int64_t kv_head, int64_t num, const Bf16* const q[],
                            const int64_t first[], const int64_t end[], const int64_t chunk0[], int64_t longest,
                            float* scores, int64_t row_stride, float* work) {
  const int64_t heads = num * G;
  float* q_tiles = work;
  float* c = work + (D / 32) * 256;
  pack_query_tiles<D, G>(q, heads, q_tiles);
  configure_attention_tiles();
  int64_t lo = first[0], hi = end[0];
  for (int64_t r = 1; r < num; ++r) lo = std::min(lo, first[r]), hi = std::max(hi, end[r]);
  const int32_t* blocks = st.block_table + longest * st.max_blocks;
  const int64_t key_bytes = st.row_stride() * sizeof(Bf16);
  const __m512 pad = _mm512_set1_ps(kPadScore), scale = _mm512_set1_ps(st.scale);
  const __m512i rows = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                          _mm512_set1_epi32(16));  // lane i: word 0 of C row i
  const int64_t end_chunk = (hi + kKeys - 1) / kKeys;
  for (int64_t chunk = lo / kKeys; chunk < end_chunk; ++chunk) {
    // blocks lie anywhere, so the hardware prefetcher loses the stream at every block edge: the K
    // rows kPrefetchChunks ahead into L1, and their V rows, which the value pass reads next, into L2
    if (chunk + kPrefetchChunks < end_chunk) {
      const int64_t offset = chunk_keys(st, blocks, kv_head, chunk + kPrefetchChunks) - st.k_cache;
      const char* k_row = reinterpret_cast<const char*>(st.k_cache + offset);
      const char* v_row = reinterpret_cast<const char*>(st.v_cache + offset);
      for (int i = 0; i < kKeys; ++i, k_row += key_bytes, v_row += key_bytes)
        for (int d = 0; d < D * 2; d += 64) __builtin_prefetch(k_row + d, 0, 3), __builtin_prefetch(v_row + d, 0, 2);
    }
    score_keys_amx<D>(chunk_keys(st, blocks, kv_head, chunk), key_bytes, q_tiles, c);
    int used = 0;
    for (int64_t r = 0; r < num; ++r) used += G * (chunk >= chunk0[r] && chunk * kKeys < end[r]);
    alignas(64) float columns[16 * 16];
    if (used > kGatheredHeads) {  // row n of `columns`: column n of C
      __m512 t[16];
      for (int i = 0; i < 16; ++i) t[i] = _mm512_load_ps(c + 16 * i);
      transpose16(t);
      for (int n = 0; n < 16; ++n) _mm512_store_ps(columns + 16 * n, t[n]);
    }
    for (int64_t a = 0; a < heads; ++a) {
      const int64_t r = a / G;
      if (chunk < chunk0[r] || chunk * kKeys >= end[r]) continue;
      const int n = static_cast<int>(a);
      const __m512 s = used > kGatheredHeads
                           ? _mm512_load_ps(columns + 16 * n)
                           : _mm512_i32gather_ps(_mm512_add_epi32(rows, _mm512_set1_epi32(n)), c, sizeof(float));
      _mm512_store_ps(scores + a * row_stride + (chunk - chunk0[r]) * kKeys,
                      _mm512_mask_blend_ps(lanes_between(first[r] - chunk * kKeys, end[r] - chunk * kKeys), pad,
                                           _mm512_mul_ps(s, scale)));
    }
  }
}
#endif

}  // namespace formwork::paged

#endif
