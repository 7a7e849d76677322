// What the int8 GEMM (int8_gemm.cpp) and the 4-bit GEMM (int4_gemm.cpp) share: x quantized per row
// and group of values, the vector kernels' split of the work over the threads, and the store of a
// row's scaled sums. Both form exact int32 sums per group and scale them in fp32: a row's output does
// not depend on its batch, and these pieces are the same for both so that it stays so.
#pragma once
#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "conversions.h"
#include "worker_pool.h"

namespace formwork::quantized {

constexpr int64_t kPanelBlocks = 3;  // column blocks per register tile and per thread work unit
constexpr int64_t kTileRows = 4;     // rows per register tile
constexpr int64_t kRowChunkBytes = 512 << 10;  // rows of x per pass over the weight: about this many bytes

// one group of values: scale = max|x| / 127, q = x * (127 / max|x|) rounded to nearest even; returns
// sum(q) (the int8 GEMM quantizes a weight's channel through it too: one group of K values)
template <typename scalar_t>
int32_t quantize_group(const scalar_t* x, int64_t count, int8_t* q, float* scale) {
  float amax = 0.f;
  for (int64_t i = 0; i < count; ++i) amax = std::max(amax, std::fabs(formwork::to_float(x[i])));
  const float inverse = amax > 0.f ? 127.f / amax : 0.f;
  int32_t sum = 0;
  for (int64_t i = 0; i < count; ++i) {
    q[i] = static_cast<int8_t>(std::nearbyint(formwork::to_float(x[i]) * inverse));
    sum += q[i];
  }
  *scale = amax / 127.f;
  return sum;
}

// x's rows into q [m, kp] (the padding zero) and scales [m, kp / group]; then, for each row and
// group, group_done(row * (kp / group) + g, sum of its q, its scale). A decode batch runs on the
// calling thread, prompt chunks are split.
template <typename GroupDone>
void quantize_rows_into(const torch::Tensor& x, int64_t kp, int64_t group, int8_t* q, float* scales,
                        const GroupDone& group_done) {
  const int64_t m = x.size(0), k = x.size(1), stride = x.stride(0), groups = kp / group;
  constexpr int64_t kRowGrain = 64;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "quantize_rows", [&] {
    const scalar_t* data = x.data_ptr<scalar_t>();
    formwork::parallel_chunks((m + kRowGrain - 1) / kRowGrain, [&](int64_t chunk) {
      for (int64_t r = chunk * kRowGrain; r < std::min(m, (chunk + 1) * kRowGrain); ++r) {
        std::memset(q + r * kp, 0, kp);
        for (int64_t g = 0; g < groups; ++g) {
          float* scale = scales + r * groups + g;
          *scale = 0.f;
          const int32_t sum = g * group < k ? quantize_group(data + r * stride + g * group,
                                                             std::min(group, k - g * group), q + r * kp + g * group,
                                                             scale) : 0;
          group_done(r * groups + g, sum, *scale);
        }
      }
    });
  });
}

// The vector kernels' split, as the bf16 GEMM's (gemm.cpp): threads take panels of column blocks (a
// panel stays in L2 while a chunk of x's rows passes over it); tile(m0, rows, b0, blocks) computes
// rows [m0, m0 + rows) x blocks [b0, b0 + blocks), rows <= kTileRows, blocks <= kPanelBlocks.
template <typename Tile>
void multiply_panels(int64_t m, int64_t n, int64_t kp, int64_t num_blocks, const Tile& tile) {
  const int64_t num_panels = (num_blocks + kPanelBlocks - 1) / kPanelBlocks;
  const int64_t chunk_rows = std::max<int64_t>(kTileRows, kRowChunkBytes / kp / kTileRows * kTileRows);
  const int64_t work = n * kp * (1 + m / 8);
  const int64_t chunk_panels = work < (1 << 18) ? num_panels : std::max<int64_t>(1, num_panels / 16);
  const int64_t num_chunks = (num_panels + chunk_panels - 1) / chunk_panels;
  for (int64_t m_chunk = 0; m_chunk < m; m_chunk += chunk_rows) {
    const int64_t m_end = std::min(m, m_chunk + chunk_rows);
    formwork::parallel_chunks(num_chunks, [&](int64_t chunk) {
      for (int64_t panel = chunk * chunk_panels; panel < std::min(num_panels, (chunk + 1) * chunk_panels); ++panel) {
        const int64_t b0 = panel * kPanelBlocks, blocks = std::min(kPanelBlocks, num_blocks - b0);
        for (int64_t m0 = m_chunk; m0 < m_end; m0 += kTileRows) tile(m0, std::min(kTileRows, m_end - m0), b0, blocks);
      }
    });
  }
}

// y's row from column col: up to 16 scaled sums plus the bias, as bf16 or fp32
inline void store_row(const float* bias, int64_t n, void* y, bool y_bf16, int64_t row, int64_t col,
                      const float* sums) {
  const int64_t cols = std::min<int64_t>(16, n - col);
  for (int64_t i = 0; i < cols; ++i) {
    float v = sums[i];
    if (bias != nullptr) v += bias[col + i];
    if (y_bf16)
      static_cast<uint16_t*>(y)[row * n + col + i] = formwork::float_to_bf16_bits(v);
    else
      static_cast<float*>(y)[row * n + col + i] = v;
  }
}

}  // namespace formwork::quantized
