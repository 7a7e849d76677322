// The kernels' entry points, as bindings.cpp exposes them and decoder_layer.cpp composes them.
#pragma once
#include <torch/extension.h>

#include <string>

void paged_attention(torch::Tensor out, torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor kv_cache,
                     torch::Tensor slot_mapping, torch::Tensor query_ids, torch::Tensor block_table,
                     torch::Tensor seq_lens, double scale, int64_t sliding_window, double softcap);
torch::Tensor add_rms_norm(torch::Tensor residual, c10::optional<torch::Tensor> delta, torch::Tensor weight,
                           double eps);
torch::Tensor silu_and_mul(torch::Tensor gate_up);
void rotary_(torch::Tensor qkv, torch::Tensor cos, torch::Tensor sin, int64_t num_rotated, int64_t head_dim);
std::string paged_attention_isa();
std::string gemm_isa();
double gemm_inner_loop_gflops(int64_t repeats);
torch::Tensor pack_weight(torch::Tensor weight);
torch::Tensor gemm(torch::Tensor x, torch::Tensor packed, int64_t n, c10::optional<torch::Tensor> bias,
                   bool fp32_out);
std::string gemm_fp32_isa();
double gemm_fp32_inner_loop_gflops(int64_t repeats, bool bf16_weights);
torch::Tensor pack_weight_fp32(torch::Tensor weight);
torch::Tensor gemm_fp32(torch::Tensor x, torch::Tensor packed, int64_t n, c10::optional<torch::Tensor> bias);
// One of decoder_layer's matmuls as its GEMM takes it: a weight packed for gemm (bf16 or float32), or
// int8_gemm's / int4_gemm's packed values with their scales (fp32 per channel, else fp16); the bias as that GEMM takes it
// (fp32 beside quantized weights). Built once per layer (bindings.cpp), then read on every call.
struct Projection {
  enum class Format { float_packed, int8, int4 };  // the weight as gemm, int8_gemm or int4_gemm reads it
  Format format;
  torch::Tensor packed;
  c10::optional<torch::Tensor> scales;  // int8 and int4 only
  c10::optional<torch::Tensor> bias;
  // x @ W.T (+ bias): the call the layer's Python module makes for it, so the same bits
  torch::Tensor operator()(const torch::Tensor& x, int64_t n) const;
};
torch::Tensor decoder_layer(torch::Tensor residual, c10::optional<torch::Tensor> hidden, torch::Tensor input_norm,
                            torch::Tensor post_attention_norm, double eps, const Projection& qkv_proj, int64_t num_heads,
                            int64_t num_kv_heads, int64_t head_dim, torch::Tensor cos, torch::Tensor sin,
                            torch::Tensor kv_cache, torch::Tensor slot_mapping, torch::Tensor query_ids,
                            torch::Tensor block_table, torch::Tensor seq_lens, double scale, const Projection& o_proj,
                            const Projection& gate_up_proj, int64_t intermediate_size,
                            const Projection& down_proj);
