// Paged attention with AVX2 and FMA: fp32 caches (a CPU without AVX-512 BF16 runs fp32), and fp16 or
// bf16 ones widened to fp32 as they are read; head_dim D a multiple of 16 known at compile time. By
// runs, as paged_attention_bf16.h: consecutive listed queries of one request (a prompt's rows, a
// chunk's; a decode is a run of one) make one work item per kv head, which transposes each chunk of
// K rows once and reads each V row once for all of the run's query heads. Scores and values are then
// two small matrix products, each in register tiles of up to 6 query heads by 16 lanes (keys for
// q.k, output dims for p.v): per step two loads feed twelve fmas, so arithmetic sets the pace.
//
// A query's output is the same bits in a run of any length as alone, and on any thread:
// - a score is one fma chain over d = 0 .. D-1, times the scale; the lanes of its chunk that are not
//   the query's keys (before its window, from its position on) hold kPadScore;
// - the softmax reads the query head's row of whole chunks of 16 keys at absolute positions, one
//   fixed sequence of vector instructions (an 8-lane sum, folded in a fixed tree);
// - an output value is one fma chain over the query's own keys in position order, times 1 / the sum.
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

// One query head of a tile: its q row (D floats), where its 16 scores go, and its query's keys.
struct ScoreRow {
  const float* q;
  float* scores;
  int64_t first, end;
};

// The 16 scores of M query heads over one transposed chunk whose first key is at position pos0.
template <int D, int M>
void score_tile(const ScoreRow* rows, const float* __restrict tile, int64_t pos0, float scale) {
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
  for (int m = 0; m < M; ++m)
    for (int j = 0; j < 2; ++j)
      _mm256_store_ps(rows[m].scores + 8 * j,
                      _mm256_blendv_ps(pad, _mm256_mul_ps(acc[m][j], s),
                                       keys_between(pos0 + 8 * j, rows[m].first, rows[m].end)));
}

// score_tile for a runtime count m <= M
template <int D, int M>
void score_tile_upto(const ScoreRow* rows, int m, const float* tile, int64_t pos0, float scale) {
  if constexpr (M > 1) {
    if (m < M) return score_tile_upto<D, M - 1>(rows, m, tile, pos0, scale);
  }
  score_tile<D, M>(rows, tile, pos0, scale);
}

// e^x for x <= 0 to about 1 ulp (Cephes' polynomial of x - n ln 2, times 2^n); exactly 0 below -87,
// where e^x leaves the normal floats (so padding scores weigh nothing)
inline __m256 exp_nonpositive(__m256 x) {
  const __m256 lowest = _mm256_set1_ps(-87.f);
  const __m256 normal = _mm256_cmp_ps(x, lowest, _CMP_GT_OQ);
  x = _mm256_max_ps(x, lowest);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);  // ln 2 in two parts: r is exact
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  // 2^n from its exponent bits: n >= -126 here, a normal float
  const __m256i two_n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(normal, _mm256_mul_ps(p, _mm256_castsi256_ps(two_n)));
}

// One query head's row of num_chunks whole chunks of scores (its non-keys kPadScore), capped first
// to softcap * tanh(s / softcap) when softcap > 0, into the softmax's unnormalized weights
// e^(s - max) in place; returns 1 / their sum. One compiled function for every row (never inlined
// into differently scheduled copies): its results depend on the row alone.
__attribute__((noinline)) inline float softmax_weights(float* __restrict row, int64_t num_chunks, float softcap) {
  const int64_t n = num_chunks * kKeys;
  if (softcap > 0.f) {
    const float inv = 1.f / softcap;
    for (int64_t t = 0; t < n; ++t)
      if (row[t] > kPadScore) row[t] = softcap * std::tanh(row[t] * inv);
  }
  __m256 max = _mm256_set1_ps(kPadScore);
  for (int64_t t = 0; t < n; t += 8) max = _mm256_max_ps(max, _mm256_load_ps(row + t));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, max);
  float top = lanes[0];  // a max is the same in any order
  for (int i = 1; i < 8; ++i) top = std::max(top, lanes[i]);
  const __m256 top8 = _mm256_set1_ps(top);
  __m256 sum = _mm256_setzero_ps();
  for (int64_t t = 0; t < n; t += 8) {
    const __m256 e = exp_nonpositive(_mm256_sub_ps(_mm256_load_ps(row + t), top8));
    _mm256_store_ps(row + t, e);
    sum = _mm256_add_ps(sum, e);
  }
  _mm256_store_ps(lanes, sum);
  for (int width = 4; width > 0; width /= 2)  // a fixed tree over the 8 partial sums
    for (int i = 0; i < width; ++i) lanes[i] += lanes[i + width];
  return 1.f / lanes[0];
}

// One query head of a tile in the weighted sum of the values: its weights by key position
// (weights[t] for key t), its query's keys [first, end), 1 / its sum, its output row (D values).
template <typename scalar_t>
struct ValueRow {
  const float* weights;
  int64_t first, end;
  float inv_sum;
  scalar_t* out;
};

// Keys [t0, t1)'s V rows (values[t]: key t's row, from dims d0) into the 16 accumulated dims of M
// query heads (acc: M x 16 floats): each head whose key it is (kEvery: all of them) adds weight *
// value, key by key; the others keep their accumulators' bits (a select, not a branch). The
// accumulators live in registers for the loop: its own local copy, that nothing else can see.
template <typename scalar_t, int M, bool kEvery>
void add_keys(float* __restrict acc, const ValueRow<scalar_t>* rows, const scalar_t* const* values, int d0,
              int64_t t0, int64_t t1) {
  __m256 a[M][2];
  const float* weights[M];
#pragma GCC unroll 8
  for (int m = 0; m < M; ++m) {
    a[m][0] = _mm256_load_ps(acc + 16 * m), a[m][1] = _mm256_load_ps(acc + 16 * m + 8);
    weights[m] = rows[m].weights;
  }
  for (int64_t t = t0; t < t1; ++t) {
    const __m256 v0 = load8(values[t] + d0), v1 = load8(values[t] + d0 + 8);
#pragma GCC unroll 8
    for (int m = 0; m < M; ++m) {
      if constexpr (kEvery) {
        const __m256 p = _mm256_broadcast_ss(weights[m] + t);
        a[m][0] = _mm256_fmadd_ps(p, v0, a[m][0]);
        a[m][1] = _mm256_fmadd_ps(p, v1, a[m][1]);
      } else {
        const bool mine = t >= rows[m].first && t < rows[m].end;
        const __m256 p = _mm256_broadcast_ss(weights[m] + std::clamp(t, rows[m].first, rows[m].end - 1));
        const __m256 keep = _mm256_castsi256_ps(_mm256_set1_epi32(-static_cast<int32_t>(mine)));
        a[m][0] = _mm256_blendv_ps(a[m][0], _mm256_fmadd_ps(p, v0, a[m][0]), keep);
        a[m][1] = _mm256_blendv_ps(a[m][1], _mm256_fmadd_ps(p, v1, a[m][1]), keep);
      }
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < M; ++m) _mm256_store_ps(acc + 16 * m, a[m][0]), _mm256_store_ps(acc + 16 * m + 8, a[m][1]);
}

// Output dims [d0, d0 + 16) of M query heads: each V row loaded once for all of them, weights added
// key by key in position order, each head its own keys only.
template <typename scalar_t, int M>
void value_tile(const ValueRow<scalar_t>* rows, const scalar_t* const* values, int d0) {
  int64_t lo = rows[0].first, hi = rows[0].end, all_lo = rows[0].first, all_hi = rows[0].end;
  for (int m = 1; m < M; ++m) {
    lo = std::min(lo, rows[m].first), hi = std::max(hi, rows[m].end);
    all_lo = std::max(all_lo, rows[m].first), all_hi = std::min(all_hi, rows[m].end);
  }
  if (all_lo >= all_hi) all_lo = all_hi = hi;  // no key common to all: each key checked per head
  alignas(32) float acc[M * 16] = {};
  add_keys<scalar_t, M, false>(acc, rows, values, d0, lo, all_lo);  // keys of only some of the heads
  add_keys<scalar_t, M, true>(acc, rows, values, d0, all_lo, all_hi);
  add_keys<scalar_t, M, false>(acc, rows, values, d0, all_hi, hi);
  for (int m = 0; m < M; ++m) {
    const __m256 inv = _mm256_set1_ps(rows[m].inv_sum);
    store8(rows[m].out + d0, _mm256_mul_ps(_mm256_load_ps(acc + 16 * m), inv));
    store8(rows[m].out + d0 + 8, _mm256_mul_ps(_mm256_load_ps(acc + 16 * m + 8), inv));
  }
}

// value_tile for a runtime count m <= M
template <typename scalar_t, int M>
void value_tile_upto(const ValueRow<scalar_t>* rows, int m, const scalar_t* const* values, int d0) {
  if constexpr (M > 1) {
    if (m < M) return value_tile_upto<scalar_t, M - 1>(rows, m, values, d0);
  }
  value_tile<scalar_t, M>(rows, values, d0);
}

// One run of queries at one kv head: scores, softmax, values. buffer and value_rows are the thread's
// to reuse.
template <typename scalar_t, int D>
void attend_run(const Step<scalar_t>& st, Run run, int64_t kv_head, std::vector<float>& buffer,
                std::vector<const scalar_t*>& value_rows) {
  alignas(64) static const float kZeroRow[D] = {};  // zero bits: 0 in every dtype
  const auto* zero_row = reinterpret_cast<const scalar_t*>(kZeroRow);
  const int64_t group = st.group(), num = run.end - run.begin, heads = num * group;
  int64_t first[kRunHeads], end[kRunHeads], chunk0[kRunHeads];  // each query's keys [first, end), first chunk
  int64_t lo = INT64_MAX, hi = 0, longest = run.begin, max_chunks = 0;
  for (int64_t r = 0; r < num; ++r) {
    end[r] = st.seq_lens[run.begin + r];
    first[r] = st.first_key(end[r]);
    chunk0[r] = first[r] / kKeys;
    max_chunks = std::max(max_chunks, (end[r] + kKeys - 1) / kKeys - chunk0[r]);
    lo = std::min(lo, first[r]);
    if (end[r] > hi) hi = end[r], longest = run.begin + r;
  }
  // score rows [heads][row_stride] (query r's from its first chunk on), the run's q rows [heads][D]
  // in fp32, a transposed K chunk [D][16]
  const int64_t row_stride = max_chunks * kKeys;
  float* scores = aligned_floats(buffer, heads * row_stride + heads * D + D * kKeys);
  float* q_rows = scores + heads * row_stride;
  float* tile = q_rows + heads * D;
  for (int64_t r = 0; r < num; ++r) {
    const scalar_t* q = st.q + st.query_ids[run.begin + r] * st.q_stride + kv_head * group * D;
    for (int64_t d = 0; d < group * D; d += 8) _mm256_storeu_ps(q_rows + r * group * D + d, load8(q + d));
  }

  // pass 1: scores, chunk by chunk, of the query heads whose queries have keys in it
  KeyRows<scalar_t> keys(st, st.k_cache, longest, kv_head, lo / kKeys * kKeys);
  for (int64_t c = lo / kKeys; c < (hi + kKeys - 1) / kKeys; ++c) {
    const scalar_t* rows[kKeys];
    for (int i = 0; i < kKeys; ++i) rows[i] = c * kKeys + i < hi ? keys.next() : zero_row;
    transpose_chunk<scalar_t, D>(rows, tile);
    ScoreRow tile_rows[kTileHeads];
    int count = 0;
    for (int64_t a = 0; a < heads; ++a) {
      const int64_t r = a / group;
      if (c < chunk0[r] || c * kKeys >= end[r]) continue;
      tile_rows[count++] = {q_rows + a * D, scores + a * row_stride + (c - chunk0[r]) * kKeys, first[r], end[r]};
      if (count == kTileHeads) score_tile<D, kTileHeads>(tile_rows, tile, c * kKeys, st.scale), count = 0;
    }
    if (count > 0) score_tile_upto<D, kTileHeads>(tile_rows, count, tile, c * kKeys, st.scale);
  }

  // the softmax of every query head's row, and the V rows of the run's keys by position
  float inv_sums[kRunHeads];
  for (int64_t a = 0; a < heads; ++a) {
    const int64_t r = a / group;
    inv_sums[a] = softmax_weights(scores + a * row_stride, (end[r] + kKeys - 1) / kKeys - chunk0[r], st.softcap);
  }
  value_rows.resize(hi);
  KeyRows<scalar_t> values(st, st.v_cache, longest, kv_head, lo);
  for (int64_t t = lo; t < hi; ++t) value_rows[t] = values.next();

  // pass 2: the values, kTileHeads query heads and 16 output dims at a time
  ValueRow<scalar_t> tile_rows[kTileHeads];
  for (int64_t a0 = 0; a0 < heads; a0 += kTileHeads) {
    const int count = static_cast<int>(std::min<int64_t>(kTileHeads, heads - a0));
    for (int m = 0; m < count; ++m) {
      const int64_t a = a0 + m, r = a / group;
      tile_rows[m] = {scores + a * row_stride - chunk0[r] * kKeys, first[r], end[r], inv_sums[a],
                      st.out + st.query_ids[run.begin + r] * st.out_stride + kv_head * group * D + (a % group) * D};
    }
    for (int d0 = 0; d0 < D; d0 += 16)
      value_tile_upto<scalar_t, kTileHeads>(tile_rows, count, value_rows.data(), d0);
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
    thread_local std::vector<const scalar_t*> value_rows;
    for (int64_t item = chunk * chunk_items; item < std::min(items, (chunk + 1) * chunk_items); ++item) {
      // a prompt's later runs see more keys: claimed first, the last items claimed are the short ones
      const int64_t backwards = items - 1 - item;
      attend_run<scalar_t, D>(st, runs[backwards / st.num_kv_heads], backwards % st.num_kv_heads, buffer, value_rows);
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
