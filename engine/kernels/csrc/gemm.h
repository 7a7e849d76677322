// What gemm.cpp (the dispatcher and the vector kernels) and amx_gemm.cpp (AMX tiles) share: the
// packed weight's layout and one call's operands.
//
// Packed layout of an [N, K] bf16 weight: [ceil(N/16) blocks, P pairs, 16 columns, 2], P = K/2
// rounded up to a multiple of 16 (whole AMX tiles), zero padded. Block b, pair p, column c holds
// W[16b + c][2p], W[16b + c][2p + 1]: one 64-byte row per pair, which is both what `vdpbf16ps`
// multiplies by a broadcast pair of x and an AMX B-tile row.
#pragma once

#include <cstdint>

namespace formwork::gemm {

constexpr int64_t kBlock = 16;     // output columns per block
constexpr int64_t kPairAlign = 16;  // pairs per block padded to a multiple of this (a tile's rows)

inline int64_t padded_pairs(int64_t k) { return (k + 2 * kPairAlign - 1) / (2 * kPairAlign) * kPairAlign; }

// Where one call's operands are. x rows are strided; y (or y32) is [m, n] contiguous.
struct Operands {
  const uint16_t* x;
  int64_t x_stride, m, k;
  const uint16_t* w;     // packed
  const uint16_t* bias;  // [n] or nullptr
  uint16_t* y;
  int64_t n;
  float* y32 = nullptr;  // when set, the fp32 sums go here unrounded (and y is unused)
  int64_t num_blocks() const { return (n + kBlock - 1) / kBlock; }
  int64_t block_stride() const { return padded_pairs(k) * 2 * kBlock; }  // elements between blocks
};

// whether this build and this process can run AMX tiles (asks the kernel for the tile state once)
bool amx_ready();
// y = x @ W.T (+ bias) with AMX tiles; only when amx_ready()
void multiply_amx(const Operands& op);
// GFLOP/s of the AMX inner loop over L1-resident tiles, repeats per thread, every thread
double amx_inner_loop_gflops(int64_t repeats);

}  // namespace formwork::gemm
