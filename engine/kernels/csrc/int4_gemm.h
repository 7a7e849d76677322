// The 4-bit GEMM's entry points (int4_gemm.cpp), as bindings.cpp exposes them.
//
// Packed layout of an [N, K] weight of 4-bit values (GGUF Q4_0, Q4_1, Q4_K: every value is
// nib * d + m, nib in 0..15, d and m per column and group of 32 values of K): uint8
// [ceil(N/16) blocks, Kp/8 chunks, 16 columns, 4], Kp = K rounded up to a multiple of 64, padding 0.
// Byte (chunk c, column i, t) holds the nibble of K index 8c + t in its low half and 8c + 4 + t in
// its high half: one 64-byte load, masked with 0x0F and shifted right by 4, is two quads of the
// int8 GEMM's shape (16 columns x 4 values), the unsigned operand of `vpdpbusd`. Scales are fp16
// [blocks, Kp/32 groups, 2, 16]: each column's d, then its m (as GGUF files store them; the kernels
// widen them to fp32 as they load them).
#pragma once
#include <torch/extension.h>

#include <string>
#include <vector>

// x [M, K] (float, contiguous rows) -> (int8 [M, K], fp32 scales [M, ceil(K / 32)]): per row and
// group of 32 values, x / scale rounded to nearest even, scale = max|x| / 127, as int4_gemm quantizes x
std::vector<torch::Tensor> int4_quantize_rows(torch::Tensor x);
// x [M, K] @ W.T (+ bias, fp32 [N]): x quantized per row and group of 32, per group the exact int32
// sum of q * nib, scaled in fp32: sum += float(int32) * (d * x_scale), then sum += m * (x_scale *
// sum of q); bf16 out for bf16 x, else fp32 (and fp32 always with fp32_out)
torch::Tensor int4_gemm(torch::Tensor x, torch::Tensor packed, torch::Tensor scales, int64_t n,
                        c10::optional<torch::Tensor> bias, bool fp32_out);
// what multiplies: amx_int8 (from 32 rows) with avx512_vnni below, avx512_vnni, avx2 or portable
std::string int4_gemm_isa();
