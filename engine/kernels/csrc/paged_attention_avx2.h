// Paged attention with AVX2 and FMA: fp32 caches (a CPU without AVX-512 BF16 runs fp32), and fp16 or
// bf16 ones widened to fp32 as they are read; head_dim D a multiple of 16 known at compile time. By
// runs, as paged_attention_bf16.h: consecutive listed queries of one request (a prompt's rows, a
// chunk's; a decode is a run of one) make one work item per kv head, which walks the keys in chunks
// of 16 at absolute positions (16c .. 16c + 15): each chunk's K rows are transposed once, every query
// head with keys in it scores them, then adds their V rows, each row read once for all the heads.
// The softmax is online (flash attention): a query head keeps its largest score so far and its sum,
// and rescales what the earlier chunks added when the max grows, so no row of scores is stored and
// no pass over one follows. Scores and values are small matrix products in register tiles of up to
// 6 query heads by 16 lanes (keys for q.k, output dims for p.v): per step two loads feed twelve fmas.
//
// A query's output is the same bits in a run of any length as alone, and on any thread:
// - a score is one fma chain over d = 0 .. D-1, times the scale; the lanes of its chunk that are not
//   the query's keys (before its window, from its position on) hold kPadScore;
// - its softmax takes the query's chunks in position order whatever the run, each through one fixed
//   sequence of vector instructions on the head's own 16 scores (the chunk's max, the rescale factor,
//   exactly 1 while the max stays, e^(s - max), exactly 0 for padding, an 8-lane sum) and at the end
//   folds the sum in a fixed tree;
// - an output value is one fma chain over the query's own keys in position order, rescaled between
//   chunks, times 1 / the sum.
// Which tile computes an element, and beside which others, changes none of these chains.
#pragma once
#if defined(__AVX2__) && defined(__FMA__)

#include <torch/extension.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "conversions.h"
#include "paged_attention_step.h"
#include "worker_pool.h"

namespace formwork::paged::avx2 {

constexpr int kRunHeads = 48;  // query heads of a run: each K chunk is transposed once for all of them
constexpr int kTileHeads = 6;  // query heads of a register tile: 12 accumulators of the 16 registers

// 8 stored values at p as fp32 lanes
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const c10::BFloat16* p) {  // bf16 is the top half of an fp32
  const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(x), 16));
}
inline __m256 load8(const c10::Half* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

// 8 fp32 lanes into 8 stored values at p (rounded as from_float rounds)
inline void store8(float* p, __m256 x) { _mm256_storeu_ps(p, x); }
template <typename scalar_t>
inline void store8(scalar_t* p, __m256 x) {
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, x);
  for (int i = 0; i < 8; ++i) p[i] = from_float<scalar_t>(lanes[i]);
}

// rows 0..7 (8 floats each) -> their columns, in place (column j: float j of row i in lane i)
inline void transpose8(__m256 r[8]) {
  __m256 t[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  __m256 u[8];
  for (int i = 0; i < 2; ++i) {
    u[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}

// The 16 K rows of a chunk (rows[i]: key i's D values) as a tile of D rows of 16 fp32 keys.
template <typename scalar_t, int D>
void transpose_chunk(const scalar_t* const rows[kKeys], float* __restrict tile) {
  for (int half = 0; half < 2; ++half)
    for (int d0 = 0; d0 < D; d0 += 8) {
      __m256 r[8];
      for (int i = 0; i < 8; ++i) r[i] = load8(rows[8 * half + i] + d0);
      transpose8(r);
      for (int j = 0; j < 8; ++j) _mm256_store_ps(tile + (d0 + j) * kKeys + 8 * half, r[j]);
    }
}

// a score lane's keep mask: position pos0 + i (lane i) in [first, end)
inline __m256 keys_between(int64_t pos0, int64_t first, int64_t end) {
  const __m256i pos = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int32_t>(pos0)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  const __m256i after_first = _mm256_cmpgt_epi32(pos, _mm256_set1_epi32(static_cast<int32_t>(first - 1)));
  const __m256i before_end = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(end)), pos);
  return _mm256_castsi256_ps(_mm256_and_si256(after_first, before_end));
}

// e^x for x <= 0 to about 1 ulp: a degree-6 polynomial of r = x - n ln 2 (|r| <= ln 2 / 2), its
// exponent raised by n. Exactly 1 at 0 and exactly 0 at or below -86 (padding scores weigh
// nothing); above it n >= -124, so the result is a normal float.
inline __m256 exp_nonpositive(__m256 x) {
  const __m256 lowest = _mm256_set1_ps(-86.f);
  const __m256 normal = _mm256_cmp_ps(x, lowest, _CMP_GT_OQ);
  x = _mm256_max_ps(x, lowest);
  // x / ln 2 + 1.5 * 2^23: rounded to an integer n, which lies in the low mantissa bits
  const __m256 shifter = _mm256_set1_ps(12582912.f);
  const __m256 shifted = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), shifter);
  const __m256 n = _mm256_sub_ps(shifted, shifter);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);  // ln 2 in two parts: r is exact
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.3843651395e-3f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3741564304e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1668001562e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666431725e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.9999994040e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
  const __m256i n_bits = _mm256_slli_epi32(_mm256_castps_si256(shifted), 23);  // n << 23: p times 2^n
  return _mm256_and_ps(normal, _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), n_bits)));
}

// the 16 scores at s capped to softcap * tanh(s / softcap), padding lanes left as they are. One
// compiled function for every row (never inlined, so never vectorized differently): its results
// depend on the scores alone.
__attribute__((noinline)) inline void cap_scores(float* __restrict s, float softcap) {
  const float inv = 1.f / softcap;
  for (int i = 0; i < kKeys; ++i)
    if (s[i] > kPadScore) s[i] = softcap * std::tanh(s[i] * inv);
}

// One query head's softmax, kept online over its chunks of keys in position order (flash attention):
// the largest score so far, the sum of e^(s - max) in 8 lanes, and per chunk the weights e^(s - max)
// of its 16 keys (the query's non-keys 0) and the factor e^(old max - max) that rescales what the
// earlier chunks added (exactly 1 while the max stays).
struct SoftmaxRow {
  float max = kPadScore;
  float rescale = 1.f;
  alignas(32) float sum[8] = {};
  alignas(32) float weights[kKeys];
};

// The next chunk's 16 scores of a query head, in row.weights (non-keys kPadScore), into its softmax
// and their weights: each step an instruction on lanes or a max, the same whichever tile the head is in.
inline void add_chunk_scores(SoftmaxRow& row) {
  const __m256 s0 = _mm256_load_ps(row.weights), s1 = _mm256_load_ps(row.weights + 8);
  __m256 top = _mm256_max_ps(s0, s1);  // a max is the same in any order
  top = _mm256_max_ps(top, _mm256_permute2f128_ps(top, top, 1));
  top = _mm256_max_ps(top, _mm256_permute_ps(top, _MM_SHUFFLE(1, 0, 3, 2)));
  top = _mm256_max_ps(top, _mm256_permute_ps(top, _MM_SHUFFLE(2, 3, 0, 1)));
  row.rescale = 1.f;
  if (_mm256_cvtss_f32(top) > row.max) {
    row.rescale = _mm256_cvtss_f32(exp_nonpositive(_mm256_sub_ps(_mm256_set1_ps(row.max), top)));
    row.max = _mm256_cvtss_f32(top);
  }
  const __m256 max = _mm256_set1_ps(row.max);
  const __m256 p0 = exp_nonpositive(_mm256_sub_ps(s0, max)), p1 = exp_nonpositive(_mm256_sub_ps(s1, max));
  _mm256_store_ps(row.weights, p0);
  _mm256_store_ps(row.weights + 8, p1);
  const __m256 sum = _mm256_fmadd_ps(_mm256_load_ps(row.sum), _mm256_set1_ps(row.rescale), _mm256_add_ps(p0, p1));
  _mm256_store_ps(row.sum, sum);
}

// One query head of a tile: its q row (D floats), its softmax, and its query's keys.
struct ScoreRow {
  const float* q;
  SoftmaxRow* softmax;
  int64_t first, end;
};

// The 16 scores of M query heads over one transposed chunk whose first key is at position pos0, into
// their softmaxes (softcap > 0: capped first).
template <int D, int M>
void score_tile(const ScoreRow* rows, const float* __restrict tile, int64_t pos0, float scale, float softcap) {
  __m256 acc[M][2];
  for (int m = 0; m < M; ++m) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
  for (int d = 0; d < D; ++d) {
    const __m256 k0 = _mm256_load_ps(tile + d * kKeys), k1 = _mm256_load_ps(tile + d * kKeys + 8);
#pragma GCC unroll 8
    for (int m = 0; m < M; ++m) {
      const __m256 q = _mm256_broadcast_ss(rows[m].q + d);
      acc[m][0] = _mm256_fmadd_ps(q, k0, acc[m][0]);
      acc[m][1] = _mm256_fmadd_ps(q, k1, acc[m][1]);
    }
  }
  const __m256 pad = _mm256_set1_ps(kPadScore), s = _mm256_set1_ps(scale);
  bool every = true;  // the chunk's keys are all every head's: no lane to pad
  for (int m = 0; m < M; ++m) every = every && rows[m].first <= pos0 && rows[m].end >= pos0 + kKeys;
  // unrolled: the accumulators stay registers, never an array in memory
  if (every) {
#pragma GCC unroll 8
    for (int m = 0; m < M; ++m)
      for (int j = 0; j < 2; ++j) _mm256_store_ps(rows[m].softmax->weights + 8 * j, _mm256_mul_ps(acc[m][j], s));
  } else {
#pragma GCC unroll 8
    for (int m = 0; m < M; ++m)
      for (int j = 0; j < 2; ++j)
        _mm256_store_ps(rows[m].softmax->weights + 8 * j,
                        _mm256_blendv_ps(pad, _mm256_mul_ps(acc[m][j], s),
                                         keys_between(pos0 + 8 * j, rows[m].first, rows[m].end)));
  }
  for (int m = 0; m < M; ++m) {
    if (softcap > 0.f) cap_scores(rows[m].softmax->weights, softcap);
    add_chunk_scores(*rows[m].softmax);
  }
}

// score_tile for a runtime count m <= M
template <int D, int M>
void score_tile_upto(const ScoreRow* rows, int m, const float* tile, int64_t pos0, float scale, float softcap) {
  if constexpr (M > 1) {
    if (m < M) return score_tile_upto<D, M - 1>(rows, m, tile, pos0, scale, softcap);
  }
  score_tile<D, M>(rows, tile, pos0, scale, softcap);
}

// One query head of a tile in the weighted sum of the values: its output accumulators (D floats),
// its softmax, and its query's keys.
struct ValueRow {
  float* acc;
  const SoftmaxRow* softmax;
  int64_t first, end;
};

// Keys [from, to) of a chunk (values[i]: key i's row, from dims d0) into the accumulators a of M
// query heads: each head whose key it is (kEvery: all of them) adds weight * value, key by key; the
// others keep their accumulators' bits (a select, not a branch: a non-key's row may hold anything).
template <typename scalar_t, int M, bool kEvery>
__attribute__((always_inline)) inline void add_keys(__m256 (&a)[M][2], const ValueRow* rows,
                                                    const float* const* weights, const scalar_t* const* values,
                                                    int64_t pos0, int from, int to, int d0) {
  for (int i = from; i < to; ++i) {
    const __m256 v0 = load8(values[i] + d0), v1 = load8(values[i] + d0 + 8);
#pragma GCC unroll 8
    for (int m = 0; m < M; ++m) {
      const __m256 p = _mm256_broadcast_ss(weights[m] + i);
      if constexpr (kEvery) {
        a[m][0] = _mm256_fmadd_ps(p, v0, a[m][0]);
        a[m][1] = _mm256_fmadd_ps(p, v1, a[m][1]);
      } else {
        const bool mine = pos0 + i >= rows[m].first && pos0 + i < rows[m].end;
        const __m256 keep = _mm256_castsi256_ps(_mm256_set1_epi32(-static_cast<int32_t>(mine)));
        a[m][0] = _mm256_blendv_ps(a[m][0], _mm256_fmadd_ps(p, v0, a[m][0]), keep);
        a[m][1] = _mm256_blendv_ps(a[m][1], _mm256_fmadd_ps(p, v1, a[m][1]), keep);
      }
    }
  }
}

// The V rows of the chunk at pos0 (values[i]: key i's row) into the 16 accumulated dims d0.. of M
// query heads, rescaled first (skipped where every factor is 1: the same bits). keys: the chunk's
// keys [keys[0], keys[3]) are some of the heads', [keys[1], keys[2]) every head's.
template <typename scalar_t, int M>
void add_values(const ValueRow* rows, const scalar_t* const* values, int64_t pos0, const int keys[4], bool rescale,
                int d0) {
  __m256 a[M][2];
  const float* weights[M];
#pragma GCC unroll 8
  for (int m = 0; m < M; ++m) {
    a[m][0] = _mm256_load_ps(rows[m].acc + d0), a[m][1] = _mm256_load_ps(rows[m].acc + d0 + 8);
    weights[m] = rows[m].softmax->weights;
  }
  if (rescale) {
#pragma GCC unroll 8
    for (int m = 0; m < M; ++m) {
      const __m256 factor = _mm256_set1_ps(rows[m].softmax->rescale);
      a[m][0] = _mm256_mul_ps(a[m][0], factor), a[m][1] = _mm256_mul_ps(a[m][1], factor);
    }
  }
  add_keys<scalar_t, M, false>(a, rows, weights, values, pos0, keys[0], keys[1], d0);
  add_keys<scalar_t, M, true>(a, rows, weights, values, pos0, keys[1], keys[2], d0);
  add_keys<scalar_t, M, false>(a, rows, weights, values, pos0, keys[2], keys[3], d0);
#pragma GCC unroll 8
  for (int m = 0; m < M; ++m) _mm256_store_ps(rows[m].acc + d0, a[m][0]), _mm256_store_ps(rows[m].acc + d0 + 8, a[m][1]);
}

// The values of the chunk at pos0 into M query heads' accumulators, 16 output dims at a time: each V
// row loaded once for all of them.
template <typename scalar_t, int D, int M>
void value_tile(const ValueRow* rows, const scalar_t* const* values, int64_t pos0) {
  int64_t lo = rows[0].first, all_lo = lo, hi = rows[0].end, all_hi = hi;
  bool rescale = false;
  for (int m = 0; m < M; ++m) {
    lo = std::min(lo, rows[m].first), all_lo = std::max(all_lo, rows[m].first);
    hi = std::max(hi, rows[m].end), all_hi = std::min(all_hi, rows[m].end);
    rescale = rescale || rows[m].softmax->rescale != 1.f;
  }
  const auto lane = [pos0](int64_t position) {
    return static_cast<int>(std::clamp<int64_t>(position - pos0, 0, kKeys));
  };
  int keys[4] = {lane(lo), lane(all_lo), lane(all_hi), lane(hi)};
  if (keys[1] >= keys[2]) keys[1] = keys[2] = keys[3];  // no key common to all: each key checked per head
  for (int d0 = 0; d0 < D; d0 += 16) add_values<scalar_t, M>(rows, values, pos0, keys, rescale, d0);
}

// value_tile for a runtime count m <= M
template <typename scalar_t, int D, int M>
void value_tile_upto(const ValueRow* rows, int m, const scalar_t* const* values, int64_t pos0) {
  if constexpr (M > 1) {
    if (m < M) return value_tile_upto<scalar_t, D, M - 1>(rows, m, values, pos0);
  }
  value_tile<scalar_t, D, M>(rows, values, pos0);
}

// rows[from .. to)'s D values into the L1 cache, or only into L2 (to_l2): a run of one query (a
// decode) does too little work a chunk to hide L1 prefetches behind, which then stall waiting for
// line fill buffers (decodes of 160 keys 3-9 % slower than with L2 prefetches; prompts, with
// many heads' work a chunk, gain nothing from L2)
template <typename scalar_t, int D>
inline void prefetch_rows(const scalar_t* const* rows, int from, int to, bool to_l2) {
  for (int i = from; i < to; ++i)
    for (int byte = 0; byte < D * static_cast<int>(sizeof(scalar_t)); byte += 64) {
      const char* line = reinterpret_cast<const char*>(rows[i]) + byte;
      if (to_l2)
        __builtin_prefetch(line, 0, 1);
      else
        __builtin_prefetch(line, 0, 3);
    }
}

// One run of queries at one kv head, chunk by chunk of 16 keys: the chunk's K rows transposed once,
// every query head with keys in it scores them into its online softmax, then adds their V rows.
// buffer and softmax are the thread's to reuse.
template <typename scalar_t, int D>
void attend_run(const Step<scalar_t>& st, Run run, int64_t kv_head, std::vector<float>& buffer,
                std::vector<SoftmaxRow>& softmax) {
  alignas(64) static const float kZeroRow[D] = {};  // zero bits: 0 in every dtype
  const auto* zero_row = reinterpret_cast<const scalar_t*>(kZeroRow);
  const int64_t group = st.group(), num = run.end - run.begin, heads = num * group;
  int64_t first[kRunHeads], end[kRunHeads];  // each query's keys [first, end)
  int64_t lo = INT64_MAX, hi = 0, longest = run.begin, last_first = 0, first_end = INT64_MAX;
  for (int64_t r = 0; r < num; ++r) {
    end[r] = st.seq_lens[run.begin + r];
    first[r] = st.first_key(end[r]);
    lo = std::min(lo, first[r]), last_first = std::max(last_first, first[r]);
    first_end = std::min(first_end, end[r]);
    if (end[r] > hi) hi = end[r], longest = run.begin + r;
  }
  // the run's q rows [heads][D] in fp32, their output accumulators [heads][D], a transposed K chunk [D][16]
  float* q_rows = aligned_floats(buffer, 2 * heads * D + D * kKeys);
  float* acc = q_rows + heads * D;
  float* tile = acc + heads * D;
  std::fill(acc, acc + heads * D, 0.f);
  if (static_cast<int64_t>(softmax.size()) < heads) softmax.resize(heads);
  std::fill(softmax.begin(), softmax.begin() + heads, SoftmaxRow{});
  // every query head's rows; a chunk that is not every query's takes those of the queries it is
  ScoreRow all_score_rows[kRunHeads], score_rows[kRunHeads];
  ValueRow all_value_rows[kRunHeads], value_rows[kRunHeads];
  for (int64_t r = 0; r < num; ++r) {
    const scalar_t* q = st.q + st.query_ids[run.begin + r] * st.q_stride + kv_head * group * D;
    for (int64_t d = 0; d < group * D; d += 8) _mm256_storeu_ps(q_rows + r * group * D + d, load8(q + d));
    for (int64_t a = r * group; a < (r + 1) * group; ++a) {
      all_score_rows[a] = {q_rows + a * D, &softmax[a], first[r], end[r]};
      all_value_rows[a] = {acc + a * D, &softmax[a], first[r], end[r]};
    }
  }

  // the K and V rows of this chunk and the next ([chunk & 1]): the next one's are prefetched a few
  // rows beside each tile of this one's work, never all at once (a burst of prefetches stalls on
  // the line fill buffers)
  const int64_t start = lo / kKeys * kKeys;
  KeyRows<scalar_t> keys(st, st.k_cache, longest, kv_head, start, false);
  KeyRows<scalar_t> values(st, st.v_cache, longest, kv_head, start, false);
  const scalar_t* k_rows[2][kKeys];
  const scalar_t* v_rows[2][kKeys];
  const auto walk = [&](int64_t pos0, int slot) {
    for (int i = 0; i < kKeys; ++i) {
      const bool key = pos0 + i < hi;
      k_rows[slot][i] = key ? keys.next() : zero_row;
      v_rows[slot][i] = key ? values.next() : zero_row;
    }
  };
  walk(start, 0);
  const bool to_l2 = num == 1;
  for (int64_t pos0 = start, chunk = 0; pos0 < hi; pos0 += kKeys, ++chunk) {
    const int now = chunk & 1, next = now ^ 1;
    const bool ahead = pos0 + kKeys < hi;
    if (ahead) walk(pos0 + kKeys, next);
    transpose_chunk<scalar_t, D>(k_rows[now], tile);
    // the query heads whose queries have keys in this chunk, kTileHeads at a time
    const ScoreRow* chunk_score_rows = all_score_rows;
    const ValueRow* chunk_value_rows = all_value_rows;
    int count = static_cast<int>(heads);
    if (last_first >= pos0 + kKeys || first_end <= pos0) {
      count = 0;
      for (int64_t a = 0; a < heads; ++a)
        if (all_score_rows[a].first < pos0 + kKeys && all_score_rows[a].end > pos0)
          score_rows[count] = all_score_rows[a], value_rows[count++] = all_value_rows[a];
      chunk_score_rows = score_rows, chunk_value_rows = value_rows;
    }
    const int tiles = (count + kTileHeads - 1) / kTileHeads;
    for (int t = 0; t < tiles; ++t) {
      if (ahead) prefetch_rows<scalar_t, D>(k_rows[next], t * kKeys / tiles, (t + 1) * kKeys / tiles, to_l2);
      score_tile_upto<D, kTileHeads>(chunk_score_rows + t * kTileHeads, std::min(kTileHeads, count - t * kTileHeads),
                                     tile, pos0, st.scale, st.softcap);
    }
    for (int t = 0; t < tiles; ++t) {
      if (ahead) prefetch_rows<scalar_t, D>(v_rows[next], t * kKeys / tiles, (t + 1) * kKeys / tiles, to_l2);
      value_tile_upto<scalar_t, D, kTileHeads>(chunk_value_rows + t * kTileHeads,
                                               std::min(kTileHeads, count - t * kTileHeads), v_rows[now], pos0);
    }
  }

  for (int64_t r = 0; r < num; ++r)
    for (int64_t h = 0; h < group; ++h) {
      const int64_t a = r * group + h;
      alignas(32) float lanes[8];
      std::copy(softmax[a].sum, softmax[a].sum + 8, lanes);
      for (int width = 4; width > 0; width /= 2)  // a fixed tree over the 8 partial sums
        for (int i = 0; i < width; ++i) lanes[i] += lanes[i + width];
      const __m256 inv = _mm256_set1_ps(1.f / lanes[0]);
      scalar_t* out = st.out + st.query_ids[run.begin + r] * st.out_stride + (kv_head * group + h) * D;
      for (int d = 0; d < D; d += 8) store8(out + d, _mm256_mul_ps(_mm256_load_ps(acc + a * D + d), inv));
    }
}

// Every listed query, run by run: a work item is a run at one kv head, claimed by whichever thread
// is free (across threads only when the work is worth a wake-up, ~50 us).
template <typename scalar_t, int D>
void attend_runs(const Step<scalar_t>& st) {
  const std::vector<Run> runs = query_runs(st, std::max<int64_t>(1, kRunHeads / st.group()));
  int64_t keys = 0;
  for (int64_t i = 0; i < st.num_queries; ++i) keys += st.seq_lens[i] - st.first_key(st.seq_lens[i]);
  const int64_t items = static_cast<int64_t>(runs.size()) * st.num_kv_heads;
  const int64_t chunk_items = keys * st.num_kv_heads < 8192 ? std::max<int64_t>(items, 1)
                                                            : std::max<int64_t>(1, items / 32);
  formwork::parallel_chunks((items + chunk_items - 1) / chunk_items, [&](int64_t chunk) {
    thread_local std::vector<float> buffer;
    thread_local std::vector<SoftmaxRow> softmax;
    for (int64_t item = chunk * chunk_items; item < std::min(items, (chunk + 1) * chunk_items); ++item) {
      // a prompt's later runs see more keys: claimed first, the last items claimed are the short ones
      const int64_t backwards = items - 1 - item;
      attend_run<scalar_t, D>(st, runs[backwards / st.num_kv_heads], backwards % st.num_kv_heads, buffer, softmax);
    }
  });
}

// whether attend_runs takes this step's group (its dtype float, fp16 or bf16; D 64 or 128)
template <typename scalar_t>
bool takes(const Step<scalar_t>& st) {
  return st.group() <= kRunHeads;
}

}  // namespace formwork::paged::avx2

#endif
