// A Llama-style decoder layer (RMSNorm, fused QKV, rotary, paged attention, SwiGLU) in one call:
// the kernels engine/models/decoder.py calls one by one, in the same order on the same tensors, so
// the same bits, without the Python and dispatch between them (~70-90 us a layer: about 3 ms of a
// 30-layer forward's CPU at one token, a quarter of the batch-1 step here).
#include "ops.h"

// residual += hidden (hidden absent: the first layer, residual holds the embeddings), then the
// layer; returns its output, the residual updated in place as the next layer's input.
torch::Tensor decoder_layer(torch::Tensor residual, c10::optional<torch::Tensor> hidden, torch::Tensor input_norm,
                            torch::Tensor post_attention_norm, double eps, torch::Tensor qkv_packed,
                            c10::optional<torch::Tensor> qkv_bias, int64_t num_heads, int64_t num_kv_heads,
                            int64_t head_dim, torch::Tensor cos, torch::Tensor sin, torch::Tensor kv_cache,
                            torch::Tensor slot_mapping, torch::Tensor query_ids, torch::Tensor block_table,
                            torch::Tensor seq_lens, double scale, torch::Tensor o_packed,
                            c10::optional<torch::Tensor> o_bias, torch::Tensor gate_up_packed,
                            int64_t intermediate_size, torch::Tensor down_packed) {
  const int64_t n = residual.size(0), hidden_size = residual.size(1);
  const int64_t q_size = num_heads * head_dim, kv_size = num_kv_heads * head_dim;
  torch::Tensor x = add_rms_norm(residual, hidden, input_norm, eps);
  const torch::Tensor qkv = gemm(x, qkv_packed, q_size + 2 * kv_size, qkv_bias, false);
  rotary_(qkv, cos, sin, num_heads + num_kv_heads, head_dim);  // q and k side by side: one pass
  const torch::Tensor q = qkv.narrow(1, 0, q_size).view({n, num_heads, head_dim});
  const torch::Tensor k = qkv.narrow(1, q_size, kv_size).view({n, num_kv_heads, head_dim});
  const torch::Tensor v = qkv.narrow(1, q_size + kv_size, kv_size).view({n, num_kv_heads, head_dim});
  torch::Tensor attn = torch::empty({n, num_heads, head_dim}, qkv.options());
  paged_attention(attn, q, k, v, kv_cache, slot_mapping, query_ids, block_table, seq_lens, scale, 0, 0.0);
  const torch::Tensor o = gemm(attn.view({n, q_size}), o_packed, hidden_size, o_bias, false);
  x = add_rms_norm(residual, o, post_attention_norm, eps);
  const torch::Tensor gate_up = gemm(x, gate_up_packed, 2 * intermediate_size, c10::nullopt, false);
  return gemm(silu_and_mul(gate_up), down_packed, hidden_size, c10::nullopt, false);
}
