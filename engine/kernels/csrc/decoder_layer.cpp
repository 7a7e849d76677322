// A Llama-style decoder layer (RMSNorm, fused QKV, rotary, paged attention, SwiGLU) in one call:
// the kernels engine/models/decoder.py calls one by one, in the same order on the same tensors, so
// the same bits, without the Python and dispatch between them (~70-90 us a layer: about 3 ms of a
// 30-layer forward's CPU at one token, a quarter of the batch-1 step here). Its matmuls may be bf16
// (or float32), int8 or 4-bit, each its own.
#include "int4_gemm.h"
#include "int8_gemm.h"
#include "ops.h"

torch::Tensor Projection::operator()(const torch::Tensor& x, int64_t n) const {
  switch (format) {
    case Format::int8:
      return int8_gemm(x, packed, *scales, n, bias, false);
    case Format::int4:
      return int4_gemm(x, packed, *scales, n, bias, false);
    case Format::float_packed:
      break;
  }
  return gemm(x, packed, n, bias, false);
}

// residual += hidden (hidden absent: the first layer, residual holds the embeddings), then the
// layer; returns its output, the residual updated in place as the next layer's input.
torch::Tensor decoder_layer(torch::Tensor residual, c10::optional<torch::Tensor> hidden, torch::Tensor input_norm,
                            torch::Tensor post_attention_norm, double eps, const Projection& qkv_proj,
                            int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, torch::Tensor cos,
                            torch::Tensor sin, torch::Tensor kv_cache, torch::Tensor slot_mapping,
                            torch::Tensor query_ids, torch::Tensor block_table, torch::Tensor seq_lens, double scale,
                            const Projection& o_proj, const Projection& gate_up_proj, int64_t intermediate_size,
                            const Projection& down_proj) {
  const int64_t n = residual.size(0), hidden_size = residual.size(1);
  const int64_t q_size = num_heads * head_dim, kv_size = num_kv_heads * head_dim;
  torch::Tensor x = add_rms_norm(residual, hidden, input_norm, eps);
  const torch::Tensor qkv = qkv_proj(x, q_size + 2 * kv_size);
  rotary_(qkv, cos, sin, num_heads + num_kv_heads, head_dim);  // q and k side by side: one pass
  const torch::Tensor q = qkv.narrow(1, 0, q_size).view({n, num_heads, head_dim});
  const torch::Tensor k = qkv.narrow(1, q_size, kv_size).view({n, num_kv_heads, head_dim});
  const torch::Tensor v = qkv.narrow(1, q_size + kv_size, kv_size).view({n, num_kv_heads, head_dim});
  torch::Tensor attn = torch::empty({n, num_heads, head_dim}, qkv.options());
  paged_attention(attn, q, k, v, kv_cache, slot_mapping, query_ids, block_table, seq_lens, scale, 0, 0.0);
  const torch::Tensor o = o_proj(attn.view({n, q_size}), hidden_size);
  x = add_rms_norm(residual, o, post_attention_norm, eps);
  const torch::Tensor gate_up = gate_up_proj(x, 2 * intermediate_size);
  return down_proj(silu_and_mul(gate_up), hidden_size);
}
