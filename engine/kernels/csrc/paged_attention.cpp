// Attention over the paged KV cache, for CPUs: this step's K/V written into their slots, then each
// listed query token attends its request's keys read straight from the cache blocks (no gather
// copy), scores and softmax in fp32 whatever the dtype. Decodes and the queries of prompt runs
// (each with its own causal length) go through the same kernel; a sliding window limits each
// query to its last `sliding_window` keys, and a soft cap bends scores to softcap * tanh(s / softcap).
//
// A query's output is a function of its own q and its keys only, bit for bit: the same whether it is
// a decode, one row of a whole prompt or of a chunk, alone or among other requests, on any thread.
// bf16 with AVX-512 BF16 takes paged_attention_bf16.h, other dtypes with AVX2 and FMA (head_dim 64 or
// 128) paged_attention_avx2.h: there runs of a request's queries share each K/V row read. The generic
// kernel here (any other CPU or shape) takes one work item per (query, kv head), its group of query
// heads sharing every K/V row it reads, scores 16 keys at a time into one vector; every sum runs in
// one fixed order: a key's score is its own dot product; the softmax works on whole 16-lane blocks
// of a row padded to a multiple of 16 (the padding scores exp() to 0), with 16 partial sums folded
// in a fixed tree; values are added key by key. Buffers are 64-byte aligned, so no loop's vector
// split depends on where a buffer happens to lie.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "conversions.h"
#include "paged_attention_avx2.h"
#include "paged_attention_bf16.h"
#include "paged_attention_step.h"
#include "worker_pool.h"

namespace {

using formwork::from_float;
using formwork::to_float;
using formwork::paged::aligned_floats;
using formwork::paged::KeyRows;
using formwork::paged::kKeys;
using formwork::paged::kPadScore;
using formwork::paged::padded_keys;
using formwork::paged::Step;

// Runs fn(query, kv_head, scores, scratch) for every (query, kv head) pair, across threads only when
// the work is worth it (a sleeping helper costs ~50 us to wake), in chunks of items claimed by
// whichever thread is free. scores (64-byte aligned) holds the group's rows of padded_keys(keys it
// sees) scores; scratch is the thread's to size (with aligned_floats) and reuse.
template <typename scalar_t, typename Fn>
void for_each_item(const Step<scalar_t>& st, Fn fn) {
  int64_t keys = 0;
  for (int64_t i = 0; i < st.num_queries; ++i) keys += st.seq_lens[i] - st.first_key(st.seq_lens[i]);
  const int64_t items = st.num_queries * st.num_kv_heads;
  const int64_t chunk_items = keys * st.num_kv_heads < 8192 ? std::max<int64_t>(items, 1)
                                                            : std::max<int64_t>(1, items / 32);
  formwork::parallel_chunks((items + chunk_items - 1) / chunk_items, [&](int64_t chunk) {
    thread_local std::vector<float> scores, scratch;
    for (int64_t item = chunk * chunk_items; item < std::min(items, (chunk + 1) * chunk_items); ++item) {
      const int64_t query = item / st.num_kv_heads, seq_len = st.seq_lens[query];
      float* s = aligned_floats(scores, padded_keys(seq_len - st.first_key(seq_len)) * st.group());
      fn(query, item % st.num_kv_heads, s, scratch);
    }
  });
}

// Softmax of each of `rows` score rows, in place: n scores in a row of padded_keys(n) (lanes past n
// hold anything finite), optionally capped first to softcap * tanh(s / softcap). Whole blocks of 16
// lanes only, each element through the same code: the result of a score depends on the row's
// scores alone, never on n's remainder or on the buffer's address.
void softmax_rows(float* __restrict s, int64_t rows, int64_t n, float softcap) {
  const int64_t stride = padded_keys(n);
  for (int64_t h = 0; h < rows; ++h) {
    float* __restrict sh = s + h * stride;
    if (softcap > 0.f) {
      const float inv = 1.f / softcap;
      for (int64_t b = 0; b < stride; b += kKeys)
        for (int i = 0; i < kKeys; ++i) sh[b + i] = softcap * std::tanh(sh[b + i] * inv);
    }
    for (int64_t t = n; t < stride; ++t) sh[t] = kPadScore;
    float max_score = sh[0];  // a max is the same in any order
    for (int64_t t = 1; t < n; ++t) max_score = std::max(max_score, sh[t]);
    float lanes[kKeys] = {};
    for (int64_t b = 0; b < stride; b += kKeys)
      for (int i = 0; i < kKeys; ++i) {
        sh[b + i] = std::exp(sh[b + i] - max_score);
        lanes[i] += sh[b + i];
      }
    for (int width = kKeys / 2; width > 0; width /= 2)  // a fixed tree over the 16 partial sums
      for (int i = 0; i < width; ++i) lanes[i] += lanes[i + width];
    const float inv = 1.f / lanes[0];
    for (int64_t b = 0; b < stride; b += kKeys)
      for (int i = 0; i < kKeys; ++i) sh[b + i] *= inv;
  }
}

// Any dtype and head_dim (kDim > 0: known at compile time, so the loops unroll). Each run of 16 K
// rows is widened into a transposed fp32 tile, so that every query head's 16 scores are one
// vectorized loop over keys; V rows are widened once and used by every query head of the group.
template <typename scalar_t, int kDim>
void attend_generic(const Step<scalar_t>& st) {
  const int64_t head_dim = kDim > 0 ? kDim : st.head_dim, group = st.group();
  for_each_item(st, [&](int64_t query, int64_t kv_head, float* __restrict s, std::vector<float>& scratch) {
    // the group's queries, its outputs, a K tile / V row
    float* __restrict q_group = aligned_floats(scratch, (2 * group + kKeys) * head_dim);
    float* __restrict acc = q_group + group * head_dim;
    float* __restrict tile = acc + group * head_dim;  // [head_dim][16]
    std::fill(acc, acc + group * head_dim, 0.f);
    const int64_t token = st.query_ids[query], seq_len = st.seq_lens[query], first = st.first_key(seq_len);
    const int64_t n = seq_len - first, stride = padded_keys(n);
    const scalar_t* q_in = st.q + token * st.q_stride + kv_head * group * head_dim;
    for (int64_t d = 0; d < group * head_dim; ++d) q_group[d] = to_float(q_in[d]);
    KeyRows<scalar_t> keys(st, st.k_cache, query, kv_head, first);
    for (int64_t c = 0; c < n; c += kKeys) {  // pass 1: scores of every query head of the group
      const int64_t count = std::min<int64_t>(kKeys, n - c);
      for (int64_t i = 0; i < count; ++i) {
        const scalar_t* __restrict x = keys.next();
        for (int64_t d = 0; d < head_dim; ++d) tile[d * kKeys + i] = to_float(x[d]);
      }
      for (int64_t i = count; i < kKeys; ++i)
        for (int64_t d = 0; d < head_dim; ++d) tile[d * kKeys + i] = 0.f;
      for (int64_t h = 0; h < group; ++h) {
        const float* __restrict qh = q_group + h * head_dim;
        float dots[kKeys] = {};
        for (int64_t d = 0; d < head_dim; ++d) {
          const float qd = qh[d];
#pragma omp simd
          for (int i = 0; i < kKeys; ++i) dots[i] += qd * tile[d * kKeys + i];
        }
        for (int i = 0; i < kKeys; ++i) s[h * stride + c + i] = i < count ? dots[i] * st.scale : 0.f;
      }
    }
    softmax_rows(s, group, n, st.softcap);
    float* __restrict row = tile;
    KeyRows<scalar_t> values(st, st.v_cache, query, kv_head, first);
    for (int64_t t = 0; t < n; ++t) {  // pass 2: weighted sum of the values
      const scalar_t* __restrict x = values.next();
#pragma omp simd
      for (int64_t d = 0; d < head_dim; ++d) row[d] = to_float(x[d]);
      for (int64_t h = 0; h < group; ++h) {
        const float p = s[h * stride + t];
        float* __restrict o = acc + h * head_dim;
#pragma omp simd
        for (int64_t d = 0; d < head_dim; ++d) o[d] += p * row[d];
      }
    }
    scalar_t* o_out = st.out + token * st.out_stride + kv_head * group * head_dim;
    for (int64_t d = 0; d < group * head_dim; ++d) o_out[d] = from_float<scalar_t>(acc[d]);
  });
}

// the fastest kernel this build has for the step's dtype and shapes
template <typename scalar_t>
void attend(const Step<scalar_t>& st) {
#if defined(__AVX512BF16__)
  if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {
    if (st.head_dim == 64 && formwork::paged::attend_bf16_for_group<64>(st)) return;
    if (st.head_dim == 128 && formwork::paged::attend_bf16_for_group<128>(st)) return;
  }
#endif
#if defined(__AVX2__) && defined(__FMA__)
  if constexpr (!std::is_same_v<scalar_t, double>) {
    if (st.head_dim == 64 && formwork::paged::avx2::takes(st)) return formwork::paged::avx2::attend_runs<scalar_t, 64>(st);
    if (st.head_dim == 128 && formwork::paged::avx2::takes(st)) return formwork::paged::avx2::attend_runs<scalar_t, 128>(st);
  }
#endif
  if (st.head_dim == 64) attend_generic<scalar_t, 64>(st);
  else if (st.head_dim == 128) attend_generic<scalar_t, 128>(st);
  else attend_generic<scalar_t, 0>(st);
}

// this step's K and V rows into their cache slots: a row copy per token (few rows, one thread)
template <typename scalar_t>
void write_rows(const scalar_t* k, const scalar_t* v, int64_t k_stride, int64_t v_stride, const int64_t* slots,
                int64_t num_tokens, scalar_t* k_cache, scalar_t* v_cache, int64_t row_stride) {
  for (int64_t t = 0; t < num_tokens; ++t) {
    std::memcpy(k_cache + slots[t] * row_stride, k + t * k_stride, row_stride * sizeof(scalar_t));
    std::memcpy(v_cache + slots[t] * row_stride, v + t * v_stride, row_stride * sizeof(scalar_t));
  }
}

void check_token_rows(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.dim() == 3 && t.stride(2) == 1 && t.stride(1) == t.size(2), name,
              ": [tokens, heads, head_dim] with each token's heads contiguous");
}

}  // namespace

std::string paged_attention_isa() {
#if defined(__AVX512BF16__)
  return formwork::paged::scores_on_amx() ? "amx_bf16" : "avx512_bf16";
#elif defined(__AVX2__) && defined(__FMA__)
  return "avx2";
#else
  return "generic";
#endif
}

// Writes k, v ([n, KVH, D]) at slot_mapping ([n] int64) of kv_cache ([2, blocks, block_size, KVH, D]),
// then attends query token query_ids[i] of q ([n, H, D]) over the keys [max(0, seq_lens[i] -
// sliding_window), seq_lens[i]) of its request (block_table row i; sliding_window 0: from 0), into
// the same row of out ([n, H, D]); rows of out not listed are left as they were. softcap > 0 bends
// the scaled scores to softcap * tanh(s / softcap). q, k, v, out and the cache share one dtype; the
// math is fp32.
void paged_attention(torch::Tensor out, torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor kv_cache,
                     torch::Tensor slot_mapping, torch::Tensor query_ids, torch::Tensor block_table,
                     torch::Tensor seq_lens, double scale, int64_t sliding_window, double softcap) {
  check_token_rows(q, "q");
  check_token_rows(k, "k");
  check_token_rows(v, "v");
  check_token_rows(out, "out");
  TORCH_CHECK(kv_cache.dim() == 5 && kv_cache.size(0) == 2 && kv_cache.is_contiguous(), "kv_cache: contiguous [2, B, bs, KVH, D]");
  const auto dtype = kv_cache.scalar_type();
  TORCH_CHECK(q.scalar_type() == dtype && k.scalar_type() == dtype && v.scalar_type() == dtype
              && out.scalar_type() == dtype, "q, k, v, out: the cache's dtype");
  TORCH_CHECK(slot_mapping.scalar_type() == torch::kInt64 && slot_mapping.is_contiguous()
              && query_ids.scalar_type() == torch::kInt64 && query_ids.is_contiguous(), "slot_mapping, query_ids: contiguous int64");
  TORCH_CHECK(block_table.scalar_type() == torch::kInt32 && block_table.is_contiguous(), "block_table: contiguous int32");
  TORCH_CHECK(seq_lens.scalar_type() == torch::kInt32 && seq_lens.is_contiguous(), "seq_lens: contiguous int32");
  TORCH_CHECK(sliding_window >= 0, "sliding_window: 0 (none) or a positive number of keys, got ", sliding_window);
  TORCH_CHECK(softcap >= 0, "softcap: 0 (none) or positive, got ", softcap);
  const int64_t num_tokens = q.size(0), num_heads = q.size(1), head_dim = q.size(2);
  const int64_t block_size = kv_cache.size(2), num_kv_heads = kv_cache.size(3), num_queries = query_ids.size(0);
  TORCH_CHECK(kv_cache.size(4) == head_dim && num_heads % num_kv_heads == 0 && k.size(1) == num_kv_heads
              && v.size(1) == num_kv_heads && k.size(2) == head_dim && v.size(2) == head_dim
              && out.size(1) == num_heads && out.size(2) == head_dim, "head shapes do not match");
  TORCH_CHECK(k.size(0) == num_tokens && v.size(0) == num_tokens && out.size(0) == num_tokens
              && slot_mapping.size(0) == num_tokens, "one k, v, out row and slot per token");
  TORCH_CHECK(block_table.size(0) == num_queries && seq_lens.size(0) == num_queries, "one block-table row per query");
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  for (int64_t i = 0; i < num_queries; ++i)
    TORCH_CHECK(lens[i] >= 1 && lens[i] <= block_table.size(1) * block_size, "seq_lens[", i, "] = ", lens[i],
                ": 1 to the block table's capacity");
  const int64_t half = kv_cache.numel() / 2, row_stride = num_kv_heads * head_dim;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, dtype, "paged_attention", [&] {
    scalar_t* base = kv_cache.data_ptr<scalar_t>();
    write_rows(k.data_ptr<scalar_t>(), v.data_ptr<scalar_t>(), k.stride(0), v.stride(0),
               slot_mapping.data_ptr<int64_t>(), num_tokens, base, base + half, row_stride);
    attend(Step<scalar_t>{q.data_ptr<scalar_t>(), q.stride(0), base, base + half, query_ids.data_ptr<int64_t>(),
                          block_table.data_ptr<int32_t>(), lens, out.data_ptr<scalar_t>(),
                          out.stride(0), num_queries, block_table.size(1), block_size, num_heads, num_kv_heads,
                          head_dim, static_cast<float>(scale), sliding_window, static_cast<float>(softcap)});
  });
}
