// Decode attention over the paged KV cache, for CPUs: this step's K/V written into their slots, then
// each listed query token attends its request's keys read straight from the cache blocks (no gather
// copy), scores and softmax in fp32 whatever the dtype.
//
// Layout (engine/attention/base.py): cache [2, num_blocks, block_size, num_kv_heads, head_dim];
// token t of request i lives at block_table[i][t / block_size], offset t % block_size.
// One work item per (request, kv head): its group of query heads shares every K/V row it reads.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "conversions.h"

namespace {

using formwork::from_float;
using formwork::to_float;

// One call's inputs as raw pointers. q and out rows are strided by token (views of the fused QKV
// projection's output); within a token, heads are contiguous rows of head_dim.
template <typename scalar_t>
struct Step {
  const scalar_t* q;
  int64_t q_stride;
  const scalar_t* k_cache;
  const scalar_t* v_cache;
  const int64_t* query_ids;
  const int32_t* block_table;  // [num_queries, max_blocks]
  const int32_t* seq_lens;
  scalar_t* out;
  int64_t out_stride, num_queries, max_blocks, block_size, num_heads, num_kv_heads, head_dim;
  float scale;

  int64_t group() const { return num_heads / num_kv_heads; }
  int64_t row_stride() const { return num_kv_heads * head_dim; }  // between consecutive tokens of a block
  // the first row of block b of this query's request at this kv head; the block's next rows follow
  // at row_stride()
  const scalar_t* key_block(const scalar_t* cache, int64_t query, int64_t b, int64_t kv_head) const {
    return cache + block_table[query * max_blocks + b] * block_size * row_stride() + kv_head * head_dim;
  }
};

// Runs fn(query, kv_head, scores, scratch) for every (query, kv head) pair, across threads only when
// the work is worth waking them for (about 50 us a wake with OMP_WAIT_POLICY=PASSIVE here). scores
// holds the query's seq_len * group scores; scratch is the thread's to size and reuse.
template <typename scalar_t, typename Fn>
void for_each_item(const Step<scalar_t>& st, Fn fn) {
  int64_t keys = 0;
  for (int64_t i = 0; i < st.num_queries; ++i) keys += st.seq_lens[i];
  const int64_t items = st.num_queries * st.num_kv_heads;
  const int64_t grain = keys * st.num_kv_heads < 8192 ? std::max<int64_t>(items, 1) : 1;
  at::parallel_for(0, items, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> scores, scratch;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t query = item / st.num_kv_heads;
      scores.resize(st.seq_lens[query] * st.group());
      fn(query, item % st.num_kv_heads, scores.data(), scratch);
    }
  });
}

// softmax of each of `rows` rows of n scores, in place
void softmax_rows(float* __restrict s, int64_t rows, int64_t n) {
  for (int64_t h = 0; h < rows; ++h) {
    float* __restrict sh = s + h * n;
    float max_score = sh[0];
    for (int64_t t = 1; t < n; ++t) max_score = std::max(max_score, sh[t]);
    float sum = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int64_t t = 0; t < n; ++t) {
      sh[t] = std::exp(sh[t] - max_score);
      sum += sh[t];
    }
    const float inv = 1.f / sum;
#pragma omp simd
    for (int64_t t = 0; t < n; ++t) sh[t] *= inv;
  }
}

// Any dtype and head_dim (kDim > 0: known at compile time, so the loops unroll into a few vector
// instructions). Each K/V row is widened to fp32, then used by every query head of its group.
template <typename scalar_t, int kDim>
void attend_generic(const Step<scalar_t>& st) {
  const int64_t head_dim = kDim > 0 ? kDim : st.head_dim, group = st.group(), row_stride = st.row_stride();
  for_each_item(st, [&](int64_t query, int64_t kv_head, float* __restrict s, std::vector<float>& scratch) {
    scratch.resize((1 + 2 * group) * head_dim);  // one K/V row, the group's queries, its outputs
    float* __restrict row = scratch.data();
    float* __restrict q_group = row + head_dim;
    float* __restrict acc = q_group + group * head_dim;
    std::fill(acc, acc + group * head_dim, 0.f);
    const int64_t token = st.query_ids[query], seq_len = st.seq_lens[query];
    const int64_t num_blocks = (seq_len + st.block_size - 1) / st.block_size;
    const scalar_t* q_in = st.q + token * st.q_stride + kv_head * group * head_dim;
    for (int64_t d = 0; d < group * head_dim; ++d) q_group[d] = to_float(q_in[d]);
    // visit(t) for every key position t in order, with t's K or V row widened into `row`
    auto for_each_row = [&](const scalar_t* cache, auto visit) {
      for (int64_t b = 0; b < num_blocks; ++b) {
        const scalar_t* __restrict x = st.key_block(cache, query, b, kv_head);
        const int64_t n = std::min(st.block_size, seq_len - b * st.block_size);
        for (int64_t i = 0; i < n; ++i, x += row_stride) {
#pragma omp simd
          for (int64_t d = 0; d < head_dim; ++d) row[d] = to_float(x[d]);
          visit(b * st.block_size + i);
        }
      }
    };
    for_each_row(st.k_cache, [&](int64_t t) {  // pass 1: scores of every query head of the group
      for (int64_t h = 0; h < group; ++h) {
        const float* __restrict qh = q_group + h * head_dim;
        float dot = 0.f;
#pragma omp simd reduction(+ : dot)
        for (int64_t d = 0; d < head_dim; ++d) dot += qh[d] * row[d];
        s[h * seq_len + t] = dot * st.scale;
      }
    });
    softmax_rows(s, group, seq_len);
    for_each_row(st.v_cache, [&](int64_t t) {  // pass 2: weighted sum of the values
      for (int64_t h = 0; h < group; ++h) {
        const float p = s[h * seq_len + t];
        float* __restrict o = acc + h * head_dim;
#pragma omp simd
        for (int64_t d = 0; d < head_dim; ++d) o[d] += p * row[d];
      }
    });
    scalar_t* o_out = st.out + token * st.out_stride + kv_head * group * head_dim;
    for (int64_t d = 0; d < group * head_dim; ++d) o_out[d] = from_float<scalar_t>(acc[d]);
  });
}

#if defined(__AVX512BF16__)
// bf16 with AVX-512 BF16, head_dim D and group G known at compile time: q.k straight from the bf16
// rows with dot-product instructions (pairs of bf16 products summed in fp32, no widening), the
// group's outputs in registers for pass 2. 2.4x the generic kernel at 64 requests x 256 keys.
using formwork::widen16;

// the next block's rows for this head, while this one is computed: blocks lie anywhere in the cache,
// so the hardware prefetcher loses the stream at every block edge (5-30% faster with cold caches)
inline void prefetch_rows(const c10::BFloat16* x, int64_t rows, int64_t row_stride, int64_t head_dim) {
  for (int64_t i = 0; i < rows; ++i, x += row_stride)
    for (int64_t d = 0; d < head_dim; d += 32) _mm_prefetch(reinterpret_cast<const char*>(x + d), _MM_HINT_T0);
}

template <int D, int G>
void attend_bf16(const Step<c10::BFloat16>& st) {
  static_assert(D % 32 == 0, "whole 512-bit rows");
  constexpr int kPairs = D / 32, kLanes = D / 16;
  for_each_item(st, [&](int64_t query, int64_t kv_head, float* __restrict s, std::vector<float>&) {
    const int64_t token = st.query_ids[query], seq_len = st.seq_lens[query], row_stride = st.row_stride();
    const int64_t num_blocks = (seq_len + st.block_size - 1) / st.block_size;
    const c10::BFloat16* q_in = st.q + token * st.q_stride + kv_head * G * D;
    __m512bh qv[G][kPairs];
    for (int h = 0; h < G; ++h)
      for (int j = 0; j < kPairs; ++j) qv[h][j] = (__m512bh)_mm512_loadu_si512(q_in + h * D + 32 * j);
    for (int64_t b = 0; b < num_blocks; ++b) {  // pass 1: scores
      const c10::BFloat16* x = st.key_block(st.k_cache, query, b, kv_head);
      const int64_t n = std::min(st.block_size, seq_len - b * st.block_size);
      if (b + 1 < num_blocks) prefetch_rows(st.key_block(st.k_cache, query, b + 1, kv_head), st.block_size, row_stride, D);
      for (int64_t i = 0; i < n; ++i, x += row_stride) {
        __m512bh k[kPairs];
        for (int j = 0; j < kPairs; ++j) k[j] = (__m512bh)_mm512_loadu_si512(x + 32 * j);
        for (int h = 0; h < G; ++h) {
          __m512 acc = _mm512_setzero_ps();
          for (int j = 0; j < kPairs; ++j) acc = _mm512_dpbf16_ps(acc, k[j], qv[h][j]);
          s[h * seq_len + b * st.block_size + i] = _mm512_reduce_add_ps(acc) * st.scale;
        }
      }
    }
    softmax_rows(s, G, seq_len);
    __m512 o[G][kLanes];
    for (int h = 0; h < G; ++h)
      for (int j = 0; j < kLanes; ++j) o[h][j] = _mm512_setzero_ps();
    for (int64_t b = 0; b < num_blocks; ++b) {  // pass 2: weighted sum of the values
      const c10::BFloat16* x = st.key_block(st.v_cache, query, b, kv_head);
      const int64_t n = std::min(st.block_size, seq_len - b * st.block_size);
      if (b + 1 < num_blocks) prefetch_rows(st.key_block(st.v_cache, query, b + 1, kv_head), st.block_size, row_stride, D);
      for (int64_t i = 0; i < n; ++i, x += row_stride) {
        __m512 v[kLanes];
        for (int j = 0; j < kLanes; ++j) v[j] = widen16(x + 16 * j);
        for (int h = 0; h < G; ++h) {
          const __m512 p = _mm512_set1_ps(s[h * seq_len + b * st.block_size + i]);
          for (int j = 0; j < kLanes; ++j) o[h][j] = _mm512_fmadd_ps(p, v[j], o[h][j]);
        }
      }
    }
    c10::BFloat16* o_out = st.out + token * st.out_stride + kv_head * G * D;
    for (int h = 0; h < G; ++h)
      for (int j = 0; j < kLanes; ++j)  // round to nearest even, as a static_cast would
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(o_out + h * D + 16 * j), (__m256i)_mm512_cvtneps_pbh(o[h][j]));
  });
}

template <int D>
bool attend_bf16_for_group(const Step<c10::BFloat16>& st) {
  switch (st.group()) {
    case 1: attend_bf16<D, 1>(st); return true;
    case 2: attend_bf16<D, 2>(st); return true;
    case 3: attend_bf16<D, 3>(st); return true;
    case 4: attend_bf16<D, 4>(st); return true;
    case 5: attend_bf16<D, 5>(st); return true;
    case 6: attend_bf16<D, 6>(st); return true;
    case 7: attend_bf16<D, 7>(st); return true;
    case 8: attend_bf16<D, 8>(st); return true;
    default: return false;
  }
}
#endif

// the fastest kernel this build has for the step's dtype and shapes
template <typename scalar_t>
void attend(const Step<scalar_t>& st) {
#if defined(__AVX512BF16__)
  if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {
    if (st.head_dim == 64 && attend_bf16_for_group<64>(st)) return;
    if (st.head_dim == 128 && attend_bf16_for_group<128>(st)) return;
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

// Writes k, v ([n, KVH, D]) at slot_mapping ([n] int64) of kv_cache ([2, blocks, block_size, KVH, D]),
// then attends query token query_ids[i] of q ([n, H, D]) over seq_lens[i] keys of its request
// (block_table row i), into the same row of out ([n, H, D]); rows of out not listed are left as
// they were. q, k, v, out and the cache share one dtype; the math is fp32.
void paged_attention(torch::Tensor out, torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor kv_cache,
                     torch::Tensor slot_mapping, torch::Tensor query_ids, torch::Tensor block_table,
                     torch::Tensor seq_lens, double scale) {
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
  const int64_t num_tokens = q.size(0), num_heads = q.size(1), head_dim = q.size(2);
  const int64_t block_size = kv_cache.size(2), num_kv_heads = kv_cache.size(3), num_queries = query_ids.size(0);
  TORCH_CHECK(kv_cache.size(4) == head_dim && num_heads % num_kv_heads == 0 && k.size(1) == num_kv_heads
              && v.size(1) == num_kv_heads && k.size(2) == head_dim && v.size(2) == head_dim
              && out.size(1) == num_heads && out.size(2) == head_dim, "head shapes do not match");
  TORCH_CHECK(k.size(0) == num_tokens && v.size(0) == num_tokens && out.size(0) == num_tokens
              && slot_mapping.size(0) == num_tokens, "one k, v, out row and slot per token");
  TORCH_CHECK(block_table.size(0) == num_queries && seq_lens.size(0) == num_queries, "one block-table row per query");
  const int64_t half = kv_cache.numel() / 2, row_stride = num_kv_heads * head_dim;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, dtype, "paged_attention", [&] {
    scalar_t* base = kv_cache.data_ptr<scalar_t>();
    write_rows(k.data_ptr<scalar_t>(), v.data_ptr<scalar_t>(), k.stride(0), v.stride(0),
               slot_mapping.data_ptr<int64_t>(), num_tokens, base, base + half, row_stride);
    attend(Step<scalar_t>{q.data_ptr<scalar_t>(), q.stride(0), base, base + half, query_ids.data_ptr<int64_t>(),
                          block_table.data_ptr<int32_t>(), seq_lens.data_ptr<int32_t>(), out.data_ptr<scalar_t>(),
                          out.stride(0), num_queries, block_table.size(1), block_size, num_heads, num_kv_heads,
                          head_dim, static_cast<float>(scale)});
  });
}
