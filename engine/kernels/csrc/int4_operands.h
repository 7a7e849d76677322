// What int4_gemm.cpp (the dispatcher, the vector kernels) and amx_int4_gemm.cpp (AMX tiles) share:
// one call's operands and the scaled sums' store.
#pragma once

#include <algorithm>
#include <cstdint>

#include "conversions.h"
#include "quantized_gemm.h"

namespace formwork::int4 {

constexpr int64_t kBlock = 16;       // output columns per block
constexpr int64_t kKAlign = 64;      // K padded to a multiple of this
constexpr int64_t kGroup = 32;       // values per weight d, m and per activation scale
constexpr int64_t kChunkValues = 8;  // values of K per column in one 64-byte chunk (two quads)
constexpr int64_t kGroupChunks = kGroup / kChunkValues;
constexpr int64_t kChunkBytes = 4 * kBlock;
// AMX from this many rows (two tiles of rows): at 16 the unpacking and the per-group scaling of half-used
// tiles cost more than the vector kernel's register sums (a 1.5B layer: 1.02-1.1x its time)
constexpr int64_t kAmxMinRows = 32;

inline int64_t padded_k(int64_t k) { return (k + kKAlign - 1) / kKAlign * kKAlign; }

struct Operands {
  const int8_t* x;           // [m rounded up to 16, kp]: x quantized per row and group, zero padded
  const float* x_scales;     // [m rounded up to 16, kp / 32]
  const float* x_offsets;    // [m rounded up to 16, kp / 32]: float(the group's sum of q) * its scale
  int64_t m, kp;
  const uint8_t* w;          // packed nibbles
  const uint16_t* w_scales;  // fp16 [blocks, kp / 32, 2, 16]: d, then m
  const float* bias;         // [n] or nullptr
  int64_t n;
  void* y;                   // [m, n]: bf16 when y_bf16, else fp32
  bool y_bf16;
  int64_t num_blocks() const { return (n + kBlock - 1) / kBlock; }
  int64_t groups() const { return kp / kGroup; }
  int64_t block_bytes() const { return kp / kChunkValues * kChunkBytes; }
  const uint8_t* chunk(int64_t block, int64_t c) const { return w + block * block_bytes() + c * kChunkBytes; }
  // column block's 16 d (and, 16 further on, 16 m) for group g, as fp16: the kernels widen them (exactly)
  const uint16_t* w_d(int64_t block, int64_t g) const { return w_scales + (block * groups() + g) * 2 * kBlock; }
  const uint16_t* w_m(int64_t block, int64_t g) const { return w_d(block, g) + kBlock; }
  float x_scale(int64_t row, int64_t g) const { return x_scales[row * groups() + g]; }
  float x_offset(int64_t row, int64_t g) const { return x_offsets[row * groups() + g]; }
};

// row's 16 columns from col: the scaled sums, plus the bias. Every kernel scales its int32 group sums
// the same way, group after group: sum = fma(float(int32), d * x_scale, sum); sum = fma(m, x_offset,
// sum); and stores through here: the output bits do not depend on the kernel.
inline void store(const Operands& op, int64_t row, int64_t col, const float* sums) {
  formwork::quantized::store_row(op.bias, op.n, op.y, op.y_bf16, row, col, sums);
}

// whether this build and this process can run AMX-INT8 tiles
bool amx_int4_ready();
// y = x @ W.T (+ bias) on AMX tiles, nibbles unpacked to bytes; only when amx_int4_ready() and m >= kAmxMinRows
void multiply_amx(const Operands& op);

}  // namespace formwork::int4
