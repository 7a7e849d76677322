// The int8 GEMM's entry points (int8_gemm.cpp), as bindings.cpp exposes them.
//
// Packed layout of an [N, K] weight: uint8 w + 128 [ceil(N/16) blocks, Kp/4 quads, 16 columns, 4],
// Kp = K rounded up to a multiple of 64, the padding 0: one 64-byte row per quad of K, the unsigned
// operand `vpdpbusd` multiplies by 4 broadcast signed bytes of x. Scales are [blocks, groups,
// 16]: one fp32 per column (groups 1, per-channel weights) or one fp16 per column and 32 values of K
// (GGUF Q8_0's own, as the file stores them; the kernels widen them to fp32 as they load them).
#pragma once
#include <torch/extension.h>

#include <string>
#include <vector>

// weight [N, K] (any float dtype) -> (packed, scales), per output channel: scale = max|w| / 127
std::vector<torch::Tensor> pack_int8_weight(torch::Tensor weight);
// GGUF Q8_0 rows [N, K / 32 * 34] (uint8: per 32 values an fp16 scale, then 32 int8) -> (packed,
// fp16 scales) with one scale per 32 values, the file's own; the values and scales are copied as they are
std::vector<torch::Tensor> pack_q8_0_weight(torch::Tensor rows, int64_t k);
// x [M, K] (float, contiguous rows) -> (int8 [M, K], fp32 scales [M, ceil(K / group)]): per row and
// group of `group` values (32 or 64), x / scale rounded to nearest even, scale = max|x| / 127 (0 for zeros)
std::vector<torch::Tensor> quantize_rows(torch::Tensor x, int64_t group);
// x [M, K] @ W.T (+ bias, fp32 [N]): x quantized as quantize_rows does, per 64 values beside
// per-channel weights and per 32 beside per-group ones, int32 sums per group, scaled in fp32; bf16
// out for bf16 x, else fp32 (and fp32 always with fp32_out)
torch::Tensor int8_gemm(torch::Tensor x, torch::Tensor packed, torch::Tensor scales, int64_t n,
                        c10::optional<torch::Tensor> bias, bool fp32_out);
// what multiplies: avx512_vnni, avx2 or portable
std::string int8_gemm_isa();
