// The Python module of Formwork's CPU kernels (engine/kernels/loader.py builds and loads it).
#include <torch/extension.h>

#include <map>
#include <stdexcept>
#include <string>

#include "int4_gemm.h"
#include "int8_gemm.h"
#include "ops.h"
#include "worker_pool.h"

// The compute calls let go of the GIL: the engine thread fills grammar bitmasks (Python around
// xgrammar) while the forward pass runs on the forward thread.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace py = pybind11;
  m.def("paged_attention", &paged_attention, py::call_guard<py::gil_scoped_release>(),
        "writes this step's K/V into the paged cache, then attends the listed queries over it, into out "
        "(sliding_window 0: every key; softcap 0: none)",
        py::arg("out"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("kv_cache"), py::arg("slot_mapping"),
        py::arg("query_ids"), py::arg("block_table"), py::arg("seq_lens"), py::arg("scale"),
        py::arg("sliding_window") = 0, py::arg("softcap") = 0.0);
  // what paged_attention takes beyond plain causal attention: callers check before passing them
  m.attr("paged_attention_features") = py::make_tuple("sliding_window", "softcap");
  m.def("paged_attention_isa", &paged_attention_isa,
        "what scores queries of head_dim 64/128: amx_bf16, avx512_bf16, avx2 or generic (fp32 vectors)");
  m.def("add_rms_norm", &add_rms_norm, py::call_guard<py::gil_scoped_release>(),
        "residual += delta (if given); returns rms_norm(residual) * weight",
        py::arg("residual"), py::arg("delta"), py::arg("weight"), py::arg("eps"));
  m.def("silu_and_mul", &silu_and_mul, py::call_guard<py::gil_scoped_release>(),
        "silu(gate) * up over [n, 2I] (gate, then up)");
  m.def("rotary_", &rotary_, py::call_guard<py::gil_scoped_release>(),
        "rotary embedding of the first num_rotated heads of each row, in place");
  m.def("pool_stats", [] {
    const formwork::PoolStats s = formwork::pool_stats();
    return py::dict(py::arg("jobs") = s.jobs, py::arg("joined_jobs") = s.joined_jobs, py::arg("chunks") = s.chunks,
                    py::arg("helper_chunks") = s.helper_chunks, py::arg("wakeups") = s.wakeups,
                    py::arg("same_cpu") = s.same_cpu);
  }, "the kernels' worker pool since start: jobs run with helpers, those a helper joined, chunks, chunks "
     "helpers ran, helper wake-ups from sleep, helper joins on the caller's CPU");
  py::class_<Projection>(m, "Projection",
                         "one of decoder_layer's matmuls: a weight packed for gemm (format 'float'), or for int8_gemm "
                         "/ int4_gemm ('int8' / 'int4', with its scales), and its bias as that GEMM takes it")
      .def(py::init([](const std::string& format, torch::Tensor packed, c10::optional<torch::Tensor> scales,
                       c10::optional<torch::Tensor> bias) {
             static const std::map<std::string, Projection::Format> formats = {
                 {"float", Projection::Format::float_packed}, {"int8", Projection::Format::int8},
                 {"int4", Projection::Format::int4}};
             const auto found = formats.find(format);
             if (found == formats.end()) {
               throw std::invalid_argument("Projection format " + format + ": expected float, int8 or int4");
             }
             if ((found->second == Projection::Format::float_packed) == scales.has_value()) {
               throw std::invalid_argument("Projection format " + format +
                                           (scales ? " takes no scales" : " needs its scales"));
             }
             return Projection{found->second, std::move(packed), std::move(scales), std::move(bias)};
           }),
           py::arg("format"), py::arg("packed"), py::arg("scales"), py::arg("bias"));
  m.def("decoder_layer", &decoder_layer, py::call_guard<py::gil_scoped_release>(),
        "residual += hidden (if given), then a Llama-style layer (RMSNorm, QKV, rotary, paged attention, o, "
        "RMSNorm, SwiGLU) through these kernels, each matmul a Projection; returns its output (the residual is "
        "updated in place)",
        py::arg("residual"), py::arg("hidden"), py::arg("input_norm"), py::arg("post_attention_norm"), py::arg("eps"),
        py::arg("qkv_proj"), py::arg("num_heads"), py::arg("num_kv_heads"), py::arg("head_dim"), py::arg("cos"),
        py::arg("sin"), py::arg("kv_cache"), py::arg("slot_mapping"), py::arg("query_ids"), py::arg("block_table"),
        py::arg("seq_lens"), py::arg("scale"), py::arg("o_proj"), py::arg("gate_up_proj"),
        py::arg("intermediate_size"), py::arg("down_proj"));
  m.def("gemm_isa", &gemm_isa, "the GEMM's instruction set in this build: avx512_bf16 or portable");
  m.def("gemm_inner_loop_gflops", &gemm_inner_loop_gflops,
        "GFLOP/s of the GEMM's register tile walking an L2-resident weight panel on every pool thread, repeats tiles each");
  m.def("gemm_fp32_isa", &gemm_fp32_isa, "the float32 GEMM's instruction set in this build: avx2_fma or portable");
  m.def("gemm_fp32_inner_loop_gflops", &gemm_fp32_inner_loop_gflops,
        "GFLOP/s of the float32 GEMM's register tile over an L2-resident panel (bf16- or float32-stored) on every "
        "pool thread, repeats tiles each", py::arg("repeats"), py::arg("bf16_weights"));
  m.def("pack_weight", &pack_weight,
        "[N, K] bf16 or float32 -> the blocked layout gemm reads (the only copy kept); a bf16 copy serves bf16 "
        "and float32 x alike");
  m.def("gemm", &gemm, py::call_guard<py::gil_scoped_release>(),
        "x [M, K] bf16 @ W.T (+ bias) from pack_weight: [M, N] bf16, fp32 sums "
        "(fp32_out: the sums unrounded, [M, N] float); x float32 (bias float32): [M, N] float32",
        py::arg("x"), py::arg("packed"), py::arg("n"), py::arg("bias") = py::none(), py::arg("fp32_out") = false);
  m.def("pack_int8_weight", &pack_int8_weight,
        "[N, K] float weight -> (packed int8, fp32 scales), one scale per output channel");
  m.def("pack_q8_0_weight", &pack_q8_0_weight, "GGUF Q8_0 rows [N, K / 32 * 34] -> (packed int8, its fp16 scales)",
        py::arg("rows"), py::arg("k"));
  m.def("quantize_rows", &quantize_rows,
        "x [M, K] -> (int8 [M, K], fp32 scales [M, ceil(K / group)]), as int8_gemm quantizes x (group 64 beside "
        "per-channel weights, 32 beside Q8_0's)", py::arg("x"), py::arg("group"));
  m.def("int8_gemm", &int8_gemm, py::call_guard<py::gil_scoped_release>(),
        "x [M, K] (quantized per row and 64 values, 32 beside Q8_0 weights) @ W.T (+ fp32 bias) from pack_int8_weight / pack_q8_0_weight: "
        "[M, N] bf16 for bf16 x, else fp32 (fp32_out: fp32 always)",
        py::arg("x"), py::arg("packed"), py::arg("scales"), py::arg("n"),
        py::arg("bias") = py::none(), py::arg("fp32_out") = false);
  m.def("int8_gemm_isa", &int8_gemm_isa, "the int8 GEMM's instruction set in this build: avx512_vnni, avx2 or portable");
  m.def("int4_quantize_rows", &int4_quantize_rows,
        "x [M, K] -> (int8 [M, K], fp32 scales [M, ceil(K / 32)]), as int4_gemm quantizes x (groups of 32)");
  m.def("int4_gemm", &int4_gemm, py::call_guard<py::gil_scoped_release>(),
        "x [M, K] (quantized per row and 32 values) @ W.T (+ fp32 bias), W 4-bit (nib * d + m) in int4_gemm.h's "
        "layout: [M, N] bf16 for bf16 x, else fp32 (fp32_out: fp32 always)",
        py::arg("x"), py::arg("packed"), py::arg("scales"), py::arg("n"),
        py::arg("bias") = py::none(), py::arg("fp32_out") = false);
  m.def("int4_gemm_isa", &int4_gemm_isa,
        "the 4-bit GEMM's instruction set in this build: amx_int8 (from 32 rows), avx512_vnni, avx2 or portable");
}
