// Decode attention over the paged KV cache, for CPUs: one query token per request, read straight
// from the cache blocks (no gather copy), scores and softmax in fp32 whatever the cache dtype.
//
// Layout (engine/attention.py): cache [2, num_blocks, block_size, num_kv_heads, head_dim];
// token t of request i lives at block_table[i][t / block_size], offset t % block_size.
// One work item per (request, kv head): its group of query heads shares every K/V row it reads.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

inline float to_float(float x) { return x; }
inline float to_float(double x) { return static_cast<float>(x); }
inline float to_float(c10::BFloat16 x) {  // bf16 is the top half of an fp32: a shift the compiler vectorizes
  uint32_t bits = static_cast<uint32_t>(x.x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
inline float to_float(c10::Half x) { return static_cast<float>(x); }

// kDim > 0: head_dim known at compile time (the loops unroll into a few vector instructions);
// kDim == 0: any head_dim.
template <typename scalar_t, int kDim>
void decode_kernel(const float* q, const scalar_t* k_cache, const scalar_t* v_cache, const int32_t* block_table,
                   const int32_t* seq_lens, float* out, int64_t num_reqs, int64_t max_blocks, int64_t block_size,
                   int64_t num_heads, int64_t num_kv_heads, int64_t runtime_dim, float scale) {
  const int64_t head_dim = kDim > 0 ? kDim : runtime_dim;
  const int64_t group = num_heads / num_kv_heads;
  const int64_t row_stride = num_kv_heads * head_dim;  // between consecutive tokens of a block
  at::parallel_for(0, num_reqs * num_kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores, row_buffer(head_dim), acc_buffer(group * head_dim);
    float* __restrict row = row_buffer.data();
    float* __restrict acc = acc_buffer.data();
    for (int64_t item = begin; item < end; ++item) {
      const int64_t req = item / num_kv_heads, kv_head = item % num_kv_heads;
      const int64_t seq_len = seq_lens[req];
      const int32_t* blocks = block_table + req * max_blocks;
      const float* __restrict q_group = q + (req * num_heads + kv_head * group) * head_dim;
      scores.resize(seq_len * group);
      float* __restrict s = scores.data();
      // pass 1: scores of every query head of the group against each key
      // token t's K or V row of this head, widened to fp32 into `row`
      auto load_row = [&](const scalar_t* cache, int64_t t) {
        const scalar_t* __restrict x = cache + ((blocks[t / block_size] * block_size + t % block_size) * row_stride
                                                + kv_head * head_dim);
#pragma omp simd
        for (int64_t d = 0; d < head_dim; ++d) row[d] = to_float(x[d]);
      };
      for (int64_t t = 0; t < seq_len; ++t) {
        load_row(k_cache, t);
        for (int64_t h = 0; h < group; ++h) {
          const float* __restrict qh = q_group + h * head_dim;
          float dot = 0.f;
#pragma omp simd reduction(+ : dot)
          for (int64_t d = 0; d < head_dim; ++d) dot += qh[d] * row[d];
          s[h * seq_len + t] = dot * scale;
        }
      }
      // softmax per query head, in place
      for (int64_t h = 0; h < group; ++h) {
        float* __restrict sh = s + h * seq_len;
        float max_score = sh[0];
        for (int64_t t = 1; t < seq_len; ++t) max_score = std::max(max_score, sh[t]);
        float sum = 0.f;
#pragma omp simd reduction(+ : sum)
        for (int64_t t = 0; t < seq_len; ++t) {
          sh[t] = std::exp(sh[t] - max_score);
          sum += sh[t];
        }
        const float inv = 1.f / sum;
#pragma omp simd
        for (int64_t t = 0; t < seq_len; ++t) sh[t] *= inv;
      }
      // pass 2: weighted sum of the values
      std::fill(acc, acc + group * head_dim, 0.f);
      for (int64_t t = 0; t < seq_len; ++t) {
        load_row(v_cache, t);
        for (int64_t h = 0; h < group; ++h) {
          const float p = s[h * seq_len + t];
          float* __restrict o = acc + h * head_dim;
#pragma omp simd
          for (int64_t d = 0; d < head_dim; ++d) o[d] += p * row[d];
        }
      }
      std::copy(acc, acc + group * head_dim, out + (req * num_heads + kv_head * group) * head_dim);
    }
  });
}

}  // namespace

// q: [num_reqs, num_heads, head_dim] fp32; kv_cache: [2, num_blocks, block_size, num_kv_heads, head_dim];
// block_table: [num_reqs, max_blocks] int32; seq_lens: [num_reqs] int32 (>= 1). Returns fp32 like q.
torch::Tensor paged_decode_attention(torch::Tensor q, torch::Tensor kv_cache, torch::Tensor block_table,
                                     torch::Tensor seq_lens, double scale) {
  TORCH_CHECK(q.dim() == 3 && q.scalar_type() == torch::kFloat32 && q.is_contiguous(), "q: contiguous fp32 [n, H, D]");
  TORCH_CHECK(kv_cache.dim() == 5 && kv_cache.size(0) == 2 && kv_cache.is_contiguous(), "kv_cache: contiguous [2, B, bs, KVH, D]");
  TORCH_CHECK(block_table.scalar_type() == torch::kInt32 && block_table.is_contiguous(), "block_table: contiguous int32");
  TORCH_CHECK(seq_lens.scalar_type() == torch::kInt32 && seq_lens.is_contiguous(), "seq_lens: contiguous int32");
  const int64_t num_reqs = q.size(0), num_heads = q.size(1), head_dim = q.size(2);
  const int64_t block_size = kv_cache.size(2), num_kv_heads = kv_cache.size(3);
  TORCH_CHECK(kv_cache.size(4) == head_dim && num_heads % num_kv_heads == 0, "head shapes do not match");
  TORCH_CHECK(block_table.size(0) == num_reqs && seq_lens.size(0) == num_reqs, "one block-table row per request");
  auto out = torch::empty_like(q);
  const int64_t half = kv_cache.numel() / 2;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, kv_cache.scalar_type(), "paged_decode_attention", [&] {
    const scalar_t* base = kv_cache.data_ptr<scalar_t>();
    auto kernel = head_dim == 64 ? decode_kernel<scalar_t, 64> : head_dim == 128 ? decode_kernel<scalar_t, 128>
                                                                                 : decode_kernel<scalar_t, 0>;
    kernel(q.data_ptr<float>(), base, base + half, block_table.data_ptr<int32_t>(), seq_lens.data_ptr<int32_t>(),
           out.data_ptr<float>(), num_reqs, block_table.size(1), block_size, num_heads, num_kv_heads, head_dim,
           static_cast<float>(scale));
  });
  return out;
}
