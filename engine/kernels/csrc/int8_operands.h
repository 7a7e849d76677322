// What int8_gemm.cpp (the dispatcher, the vector kernels) and amx_int8_gemm.cpp (AMX tiles) share:
// one call's operands and the scaled sums' store.
#pragma once

#include <algorithm>
#include <cstdint>

#include "conversions.h"
#include "quantized_gemm.h"

namespace formwork::int8 {

constexpr int64_t kBlock = 16;      // output columns per block
constexpr int64_t kKAlign = 64;     // K padded to a multiple of this
constexpr int64_t kWeightGroup = 32;  // values per weight scale in per-group weights (GGUF Q8_0)
constexpr int64_t kMaxGroup = 64;     // values of x per scale beside per-channel weights: one AMX tile's depth
constexpr int64_t kAmxMinRows = 16;  // AMX from this many rows (a tile's); vector kernels below

inline int64_t padded_k(int64_t k) { return (k + kKAlign - 1) / kKAlign * kKAlign; }

// Values of x per activation scale: 64 beside per-channel weights (greedy agreement with the
// unquantized default model stays near that of 32, and each group's sums are one full AMX tile
// product, so the per-group scaling runs half as often), 32 beside per-group weight scales, whose
// groups x's must match.
inline int64_t activation_group(int64_t w_groups) { return w_groups == 1 ? kMaxGroup : kWeightGroup; }

struct Operands {
  const int8_t* x;         // [m rounded up to 16, kp]: x quantized per row and group, zero padded
  const float* x_scales;   // [m rounded up to 16, kp / group]
  const int32_t* x_offsets;  // [m rounded up to 16, kp / group]: 128 times each group's sum of quantized values
  int64_t m, kp, group;    // group: activation_group(w_groups)
  const uint8_t* w;        // packed: w + 128
  const void* w_scales;    // [blocks, w_groups, 16]: fp32 per channel, fp16 per group (GGUF Q8_0's, as stored)
  int64_t w_groups;        // 1 (per channel) or kp / 32 (per group of kWeightGroup)
  const float* bias;       // [n] or nullptr
  int64_t n;
  void* y;                 // [m, n]: bf16 when y_bf16, else fp32
  bool y_bf16;
  int64_t num_blocks() const { return (n + kBlock - 1) / kBlock; }
  int64_t block_bytes() const { return kp * kBlock; }
  const uint8_t* quad(int64_t block, int64_t q) const { return w + block * block_bytes() + q * 4 * kBlock; }
  int64_t groups() const { return kp / group; }
  int64_t group_quads() const { return group / 4; }
  // column i of block's weight scale for group g, widened to fp32 (exact) where it is held as fp16
  float w_scale(int64_t block, int64_t g, int64_t i) const {
    return w_groups == 1 ? channel_scales(block)[i] : formwork::half_bits_to_float(group_scales(block, g)[i]);
  }
#if defined(__AVX512F__)
  // block's 16 weight scales for group g in fp32
  __m512 w_scales16(int64_t block, int64_t g) const {
    return w_groups == 1 ? _mm512_loadu_ps(channel_scales(block)) : formwork::widen_half16(group_scales(block, g));
  }
#endif
#if defined(__AVX2__)
  // block's 8 weight scales from column 8 * half for group g in fp32
  __m256 w_scales8(int64_t block, int64_t g, int64_t half) const {
    return w_groups == 1 ? _mm256_loadu_ps(channel_scales(block) + 8 * half)
                         : formwork::widen_half8(group_scales(block, g) + 8 * half);
  }
#endif
  // per channel: block's 16 fp32 scales; per group: block's 16 fp16 scales of group g
  const float* channel_scales(int64_t block) const { return static_cast<const float*>(w_scales) + block * kBlock; }
  const uint16_t* group_scales(int64_t block, int64_t g) const {
    return static_cast<const uint16_t*>(w_scales) + (block * w_groups + g) * kBlock;
  }
  float x_scale(int64_t row, int64_t g) const { return x_scales[row * groups() + g]; }
  // what the 128 added to each stored weight adds to a group's int32 sum
  int32_t x_offset(int64_t row, int64_t g) const { return x_offsets[row * groups() + g]; }
};

// row's 16 columns from col: the scaled sums, plus the bias. Every kernel scales its int32 group sums
// the same way, sum = fma(float(int32 - x_offset), w_scale * x_scale, sum) group after group, and
// stores through here: the output bits do not depend on the kernel.
inline void store(const Operands& op, int64_t row, int64_t col, const float* sums) {
  formwork::quantized::store_row(op.bias, op.n, op.y, op.y_bf16, row, col, sums);
}

// whether this build and this process can run AMX-INT8 tiles
bool amx_int8_ready();
// y = x @ W.T (+ bias) on AMX tiles; only when amx_int8_ready() and m >= kAmxMinRows
void multiply_amx(const Operands& op);

}  // namespace formwork::int8
