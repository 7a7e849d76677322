// The Python module of Formwork's CPU kernels (engine/kernels/loader.py builds and loads it).
#include <torch/extension.h>

void paged_attention(torch::Tensor out, torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor kv_cache,
                     torch::Tensor slot_mapping, torch::Tensor query_ids, torch::Tensor block_table,
                     torch::Tensor seq_lens, double scale);
torch::Tensor add_rms_norm(torch::Tensor residual, c10::optional<torch::Tensor> delta, torch::Tensor weight,
                           double eps);
torch::Tensor silu_and_mul(torch::Tensor gate_up);
void rotary_(torch::Tensor qkv, torch::Tensor cos, torch::Tensor sin, int64_t num_rotated, int64_t head_dim);
bool small_batch_gemm_available();
torch::Tensor pack_small_batch_weight(torch::Tensor weight);
torch::Tensor small_batch_gemm(torch::Tensor x, torch::Tensor packed, int64_t n, c10::optional<torch::Tensor> bias);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_attention", &paged_attention,
        "writes this step's K/V into the paged cache, then attends the listed queries over it, into out");
  m.def("add_rms_norm", &add_rms_norm, "residual += delta (if given); returns rms_norm(residual) * weight",
        pybind11::arg("residual"), pybind11::arg("delta"), pybind11::arg("weight"), pybind11::arg("eps"));
  m.def("silu_and_mul", &silu_and_mul, "silu(gate) * up over [n, 2I] (gate, then up)");
  m.def("rotary_", &rotary_, "rotary embedding of the first num_rotated heads of each row, in place");
  m.def("small_batch_gemm_available", &small_batch_gemm_available, "whether this build has AVX-512 BF16");
  m.def("pack_small_batch_weight", &pack_small_batch_weight, "[N, K] bf16 -> the layout small_batch_gemm reads");
  m.def("small_batch_gemm", &small_batch_gemm, "x [1-16, K] bf16 @ W.T (+ bias) from pack_small_batch_weight: [M, N] bf16",
        pybind11::arg("x"), pybind11::arg("packed"), pybind11::arg("n"), pybind11::arg("bias") = pybind11::none());
}
