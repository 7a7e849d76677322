// Paged attention of bf16 queries with AVX-512 BF16, head_dim D and group G known at compile time,
// by runs: consecutive listed queries of one request (the rows of a prompt or a chunk; a decode is
// a run of one) make one work item per kv head, which reads each K and V row once for all of them.
//
// A query's output is the same bits in a run of any length as alone: every value it gets goes
// through one fixed sequence of instructions that reads only its own q, its keys and its position.
// - Keys are scored in chunks of 16 at absolute positions (16c .. 16c + 15). Where AMX is
//   (scores_on_amx, one choice per process) a key's score is one C element of D/32 `tdpbf16ps`,
//   the same bits with the keys as A or B operand (paged_attention_amx.h). Else a chunk's K rows
//   are transposed once into a tile of bf16 pairs (lane i of tile[p]: dims 2p, 2p + 1 of key i)
//   and a query head's 16 scores are one accumulator through D/2 `vdpbf16ps`, lane by lane. Lanes
//   never mix, so the chunk's other keys (before the window, after the query) do not matter.
// - The softmax is one function of the query head's row of whole chunks; lanes that are not its
//   keys hold kPadScore and weigh exactly 0.
// - Values are added key by key in position order, each query its own keys only.
// How many queries or chunks go side by side (to fill the registers) changes none of these sequences.
#pragma once
#if defined(__AVX512BF16__)

#include <torch/extension.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "conversions.h"
#include "gemm.h"
#include "paged_attention_amx.h"
#include "paged_attention_step.h"
#include "transpose16.h"
#include "worker_pool.h"

namespace formwork::paged {

using Bf16 = c10::BFloat16;

constexpr int kAccumulators = 24;  // of the 32 vector registers; the others hold K, V and q operands
constexpr int kRunHeads = 48;  // query heads of a run: it transposes each K chunk once for all of them

// The K rows of one chunk (rows[i]: key i's D values) as D/2 vectors of bf16 pairs: lane i of
// tile[p] holds dims 2p and 2p + 1 of key i, what a dot-product instruction takes against q's pair p.
template <int D>
void transpose_chunk(const Bf16* const rows[kKeys], float* __restrict tile) {
  for (int j = 0; j < D / 32; ++j) {  // 16 pairs of every row at a time
    __m512 r[kKeys];
    for (int i = 0; i < kKeys; ++i) r[i] = _mm512_loadu_ps(rows[i] + 32 * j);
    transpose16(r);
    for (int p = 0; p < kKeys; ++p) _mm512_store_ps(tile + (16 * j + p) * kKeys, r[p]);
  }
}

// bf16 pair p of a row, as the 32-bit word a dot-product instruction broadcasts
inline int32_t pair_at(const Bf16* row, int p) {
  int32_t word;
  std::memcpy(&word, row + 2 * p, sizeof word);
  return word;
}

// The 16 scores of one query's G heads over one chunk.
struct ScoreSlot {
  const float* tile;  // the chunk's keys (transpose_chunk)
  const Bf16* q;  // the query's G heads, D values each
  float* scores;  // head 0's 16 scores; head h's lie h * row_stride floats on
  __mmask16 keys;  // the lanes that are the query's keys; the others get kPadScore
};

template <int D, int G, int M>
void score_slots(const ScoreSlot* slots, int64_t row_stride, float scale) {
  const float* tile[M];
  const Bf16* q[M];
  for (int m = 0; m < M; ++m) tile[m] = slots[m].tile, q[m] = slots[m].q;
  __m512 acc[M][G];
#pragma GCC unroll 8
  for (int m = 0; m < M; ++m)
#pragma GCC unroll 8
    for (int h = 0; h < G; ++h) acc[m][h] = _mm512_setzero_ps();
  for (int p = 0; p < D / 2; ++p)
#pragma GCC unroll 8
    for (int m = 0; m < M; ++m) {
      const __m512bh k = (__m512bh)_mm512_load_ps(tile[m] + p * kKeys);
#pragma GCC unroll 8
      for (int h = 0; h < G; ++h)
        acc[m][h] = _mm512_dpbf16_ps(acc[m][h], k, (__m512bh)_mm512_set1_epi32(pair_at(q[m] + h * D, p)));
    }
  const __m512 pad = _mm512_set1_ps(kPadScore), s = _mm512_set1_ps(scale);
  for (int m = 0; m < M; ++m)
    for (int h = 0; h < G; ++h)
      _mm512_store_ps(slots[m].scores + h * row_stride,
                      _mm512_mask_blend_ps(slots[m].keys, pad, _mm512_mul_ps(acc[m][h], s)));
}

// score_slots for a runtime count m <= M
template <int D, int G, int M>
void score_slots_upto(const ScoreSlot* slots, int m, int64_t row_stride, float scale) {
  if constexpr (M > 1) {
    if (m < M) return score_slots_upto<D, G, M - 1>(slots, m, row_stride, scale);
  }
  score_slots<D, G, M>(slots, row_stride, scale);
}

// e^x for x <= 0 to about 1 ulp (Cephes' polynomial of x - n ln 2, times 2^n); exactly 0 below -87,
// where e^x leaves the normal floats (so padding scores weigh nothing)
inline __m512 exp_nonpositive(__m512 x) {
  const __m512 lowest = _mm512_set1_ps(-87.f);
  const __mmask16 normal = _mm512_cmp_ps_mask(x, lowest, _CMP_GT_OQ);
  x = _mm512_max_ps(x, lowest);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);  // ln 2 in two parts: r is exact
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  return _mm512_maskz_mov_ps(normal, _mm512_scalef_ps(p, n));
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
  __m512 max = _mm512_set1_ps(kPadScore);
  for (int64_t t = 0; t < n; t += kKeys) max = _mm512_max_ps(max, _mm512_load_ps(row + t));
  const __m512 top = _mm512_set1_ps(_mm512_reduce_max_ps(max));
  __m512 sum = _mm512_setzero_ps();
  for (int64_t t = 0; t < n; t += kKeys) {
    const __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_load_ps(row + t), top));
    _mm512_store_ps(row + t, e);
    sum = _mm512_add_ps(sum, e);
  }
  return 1.f / _mm512_reduce_add_ps(sum);
}

// One query's part in the weighted sum of the values.
struct ValueSlot {
  const float* weights;  // head 0's softmax weights by key position from `base`; head h's row_stride * h on
  const float* inv_sums;  // 1 / each head's sum of weights
  int64_t base, first, end;  // the weights' first position; the query's keys [first, end)
  Bf16* out;  // its G heads' output rows
};

// Lanes [16 * j0, 16 * (j0 + S)) of the outputs of M queries' G heads: each value row read once
// for all of them, weights added key by key in position order; then normalized and rounded to bf16.
// `longest` names the block-table row and bounds the prefetch.
template <int D, int G, int S, int M>
void add_values(const Step<Bf16>& st, const ValueSlot* slots, int64_t row_stride, int64_t longest,
                int64_t kv_head, int j0) {
  int64_t first = slots[0].first, end = slots[0].end;
  for (int m = 1; m < M; ++m) first = std::min(first, slots[m].first), end = std::max(end, slots[m].end);
  __m512 o[M][G][S];
#pragma GCC unroll 8
  for (int m = 0; m < M; ++m)
#pragma GCC unroll 8
    for (int h = 0; h < G; ++h)
#pragma GCC unroll 8
      for (int j = 0; j < S; ++j) o[m][h][j] = _mm512_setzero_ps();
  KeyRows<Bf16> values(st, st.v_cache, longest, kv_head, first);
  for (int64_t t = first; t < end; ++t) {
    const Bf16* x = values.next() + 16 * j0;
    __m512 v[S];
#pragma GCC unroll 8
    for (int j = 0; j < S; ++j) v[j] = widen16(x + 16 * j);
#pragma GCC unroll 8
    for (int m = 0; m < M; ++m) {
      if (t < slots[m].first || t >= slots[m].end) continue;
      const float* w = slots[m].weights + (t - slots[m].base);
#pragma GCC unroll 8
      for (int h = 0; h < G; ++h) {
        const __m512 p = _mm512_set1_ps(w[h * row_stride]);
#pragma GCC unroll 8
        for (int j = 0; j < S; ++j) o[m][h][j] = _mm512_fmadd_ps(p, v[j], o[m][h][j]);
      }
    }
  }
  for (int m = 0; m < M; ++m)
    for (int h = 0; h < G; ++h) {
      const __m512 inv = _mm512_set1_ps(slots[m].inv_sums[h]);
      for (int j = 0; j < S; ++j)  // round to nearest even, as a static_cast would
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(slots[m].out + h * D + 16 * (j0 + j)),
                            (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(o[m][h][j], inv)));
    }
}

// add_values for a runtime count m <= M
template <int D, int G, int S, int M>
void add_values_upto(const Step<Bf16>& st, const ValueSlot* slots, int m, int64_t row_stride, int64_t longest,
                     int64_t kv_head, int j0) {
  if constexpr (M > 1) {
    if (m < M) return add_values_upto<D, G, S, M - 1>(st, slots, m, row_stride, longest, kv_head, j0);
  }
  add_values<D, G, S, M>(st, slots, row_stride, longest, kv_head, j0);
}

// output lanes a pass over the values keeps in registers for each query: all D/16, or a half, a quarter
constexpr int value_lanes(int lanes, int group) {
  return group * lanes <= kAccumulators || lanes == 1 ? lanes : value_lanes(lanes / 2, group);
}

// One run of queries at one kv head: scores (on AMX tiles when amx), softmax, values. buffer is the
// thread's to reuse.
template <int D, int G>
void attend_run(const Step<Bf16>& st, Run run, int64_t kv_head, bool amx, std::vector<float>& buffer) {
  constexpr int kMaxRun = kRunHeads / G, kPairs = D / 2, kLanes = D / 16;
  constexpr int kScoreSlots = std::min(8, kAccumulators / G);
  constexpr int kTileChunks = 16384 / (kPairs * kKeys * 4);  // 16 KiB of tiles: they stay in L1
  constexpr int kValueLanes = value_lanes(kLanes, G);
  constexpr int kValueSlots = std::max(1, std::min(4, kAccumulators / (G * kValueLanes)));
  alignas(64) static const uint16_t kZeroRow[D] = {};
  const auto* zero_row = reinterpret_cast<const Bf16*>(kZeroRow);

  const int64_t num = run.end - run.begin;
  int64_t first[kMaxRun], end[kMaxRun], chunk0[kMaxRun];  // each query's keys [first, end), first chunk
  const Bf16* q[kMaxRun];
  int64_t lo = INT64_MAX, hi = 0, longest = run.begin, max_chunks = 0;
  for (int64_t r = 0; r < num; ++r) {
    end[r] = st.seq_lens[run.begin + r];
    first[r] = st.first_key(end[r]);
    chunk0[r] = first[r] / kKeys;
    q[r] = st.q + st.query_ids[run.begin + r] * st.q_stride + kv_head * G * D;
    max_chunks = std::max(max_chunks, (end[r] + kKeys - 1) / kKeys - chunk0[r]);
    lo = std::min(lo, first[r]);
    if (end[r] > hi) hi = end[r], longest = run.begin + r;
  }
  // score rows [num][G][row_stride] (query r's from its first chunk on), 1 / sums [num][G], then
  // the scoring's own: the keys' A tiles' work, or transposed chunks (and with AMX the run's q rows
  // [num * G to a whole tile][D] and a C tile)
  const int64_t row_stride = max_chunks * kKeys, tile_floats = kPairs * kKeys;
  // keys as A tiles save the K transpose only while the run's heads fill one B tile: more take a
  // C tile's transpose each (the same bits either way)
  const bool by_key_tiles = amx && st.block_size % kKeys == 0 && num * G <= 16;
  const int64_t q_floats = amx ? (num * G + 15) / 16 * 16 * D / 2 : 0, c_floats = amx ? 16 * kKeys : 0;
  const int64_t work_floats = by_key_tiles ? key_tile_work_floats<D>()
                                           : kTileChunks * tile_floats + q_floats + c_floats;
  const int64_t sums_floats = (num * G + 15) / 16 * 16;  // keeps the work 64-byte aligned
  float* scores = aligned_floats(buffer, num * G * row_stride + sums_floats + work_floats);
  float* inv_sums = scores + num * G * row_stride;
#if defined(FORMWORK_ATTENTION_AMX)
  if (by_key_tiles)
    score_run_by_key_tiles<D, G>(st, kv_head, num, q, first, end, chunk0, longest, scores, row_stride,
                                 inv_sums + sums_floats);
#endif
  float* tiles = inv_sums + sums_floats;
  auto* q_rows = reinterpret_cast<Bf16*>(tiles + kTileChunks * tile_floats);
  float* c_tile = tiles + kTileChunks * tile_floats + q_floats;
  if (amx && !by_key_tiles) {
    std::memset(static_cast<void*>(q_rows), 0, q_floats * sizeof(float));
    for (int64_t r = 0; r < num; ++r) std::memcpy(static_cast<void*>(q_rows + r * G * D), q[r], G * D * sizeof(Bf16));
#if defined(FORMWORK_ATTENTION_AMX)
    configure_attention_tiles();
#endif
  }

  // pass 1 without key tiles: scores, a tile of transposed K chunks at a time
  if (!by_key_tiles) {
    KeyRows<Bf16> keys(st, st.k_cache, longest, kv_head, lo / kKeys * kKeys);
    const int64_t end_chunk = (hi + kKeys - 1) / kKeys;
    ScoreSlot slots[kScoreSlots];
    for (int64_t c0 = lo / kKeys; c0 < end_chunk; c0 += kTileChunks) {
      const int64_t c1 = std::min<int64_t>(end_chunk, c0 + kTileChunks);
      for (int64_t c = c0; c < c1; ++c) {
        const Bf16* rows[kKeys];
        for (int i = 0; i < kKeys; ++i) rows[i] = c * kKeys + i < hi ? keys.next() : zero_row;
        transpose_chunk<D>(rows, tiles + (c - c0) * tile_floats);
      }
#if defined(FORMWORK_ATTENTION_AMX)
      if (amx) {
        const __m512 pad = _mm512_set1_ps(kPadScore), scale = _mm512_set1_ps(st.scale);
        for (int64_t a0 = 0; a0 < num * G; a0 += 16) {  // 16 query heads a tile: queries a0 / G ..
          const int64_t r0 = a0 / G, r1 = std::min(num, (a0 + 16 + G - 1) / G);
          for (int64_t c = c0; c < c1; ++c) {
            bool wanted = false;
            for (int64_t r = r0; r < r1; ++r) wanted |= c >= chunk0[r] && c * kKeys < end[r];
            if (!wanted) continue;
            score_tile_amx<D>(q_rows + a0 * D, tiles + (c - c0) * tile_floats, c_tile);
            for (int64_t a = a0; a < std::min(num * G, a0 + 16); ++a) {
              const int64_t r = a / G;
              if (c < chunk0[r] || c * kKeys >= end[r]) continue;
              const __m512 row = _mm512_mul_ps(_mm512_load_ps(c_tile + (a - a0) * kKeys), scale);
              _mm512_store_ps(scores + a * row_stride + (c - chunk0[r]) * kKeys,
                              _mm512_mask_blend_ps(lanes_between(first[r] - c * kKeys, end[r] - c * kKeys), pad, row));
            }
          }
        }
        continue;
      }
#endif
      int count = 0;
      for (int64_t c = c0; c < c1; ++c)
        for (int64_t r = 0; r < num; ++r) {
          if (c < chunk0[r] || c * kKeys >= end[r]) continue;
          slots[count++] = {tiles + (c - c0) * tile_floats, q[r], scores + r * G * row_stride + (c - chunk0[r]) * kKeys,
                            lanes_between(first[r] - c * kKeys, end[r] - c * kKeys)};
          if (count == kScoreSlots) score_slots<D, G, kScoreSlots>(slots, row_stride, st.scale), count = 0;
        }
      if (count > 0) score_slots_upto<D, G, kScoreSlots>(slots, count, row_stride, st.scale);
    }
  }
  for (int64_t r = 0; r < num; ++r)
    for (int h = 0; h < G; ++h)
      inv_sums[r * G + h] = softmax_weights(scores + (r * G + h) * row_stride,
                                            (end[r] + kKeys - 1) / kKeys - chunk0[r], st.softcap);

  // pass 2: the values, kValueSlots queries and kValueLanes output lanes at a time
  for (int j0 = 0; j0 < kLanes; j0 += kValueLanes)
    for (int64_t r0 = 0; r0 < num; r0 += kValueSlots) {
      const int count = static_cast<int>(std::min<int64_t>(kValueSlots, num - r0));
      ValueSlot values[kValueSlots];
      for (int m = 0; m < count; ++m) {
        const int64_t r = r0 + m;
        values[m] = {scores + r * G * row_stride, inv_sums + r * G, chunk0[r] * kKeys, first[r], end[r],
                     st.out + st.query_ids[run.begin + r] * st.out_stride + kv_head * G * D};
      }
      add_values_upto<D, G, kValueLanes, kValueSlots>(st, values, count, row_stride, longest, kv_head, j0);
    }
}

// Every listed query, run by run: a work item is a run at one kv head, claimed by whichever thread
// is free (across threads only when the work is worth a wake-up, ~50 us).
template <int D, int G>
void attend_bf16_runs(const Step<Bf16>& st) {
  const bool amx = scores_on_amx();
  const std::vector<Run> runs = query_runs(st, kRunHeads / G);
  int64_t keys = 0;
  for (int64_t i = 0; i < st.num_queries; ++i) keys += st.seq_lens[i] - st.first_key(st.seq_lens[i]);
  const int64_t items = static_cast<int64_t>(runs.size()) * st.num_kv_heads;
  const int64_t chunk_items = keys * st.num_kv_heads < 8192 ? std::max<int64_t>(items, 1)
                                                            : std::max<int64_t>(1, items / 32);
  formwork::parallel_chunks((items + chunk_items - 1) / chunk_items, [&](int64_t chunk) {
    thread_local std::vector<float> buffer;
    for (int64_t item = chunk * chunk_items; item < std::min(items, (chunk + 1) * chunk_items); ++item) {
      // a prompt's later runs see more keys: claimed first, the last items claimed are the short ones
      const int64_t backwards = items - 1 - item;
      attend_run<D, G>(st, runs[backwards / st.num_kv_heads], backwards % st.num_kv_heads, amx, buffer);
    }
  });
}

template <int D>
bool attend_bf16_for_group(const Step<Bf16>& st) {
  switch (st.group()) {
    case 1: attend_bf16_runs<D, 1>(st); return true;
    case 2: attend_bf16_runs<D, 2>(st); return true;
    case 3: attend_bf16_runs<D, 3>(st); return true;
    case 4: attend_bf16_runs<D, 4>(st); return true;
    case 5: attend_bf16_runs<D, 5>(st); return true;
    case 6: attend_bf16_runs<D, 6>(st); return true;
    case 7: attend_bf16_runs<D, 7>(st); return true;
    case 8: attend_bf16_runs<D, 8>(st); return true;
    default: return false;
  }
}

}  // namespace formwork::paged

#endif
