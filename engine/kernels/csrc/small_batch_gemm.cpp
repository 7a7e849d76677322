// bf16 matrix products for decode batches of 1-16 rows, for CPUs with AVX-512 BF16.
//
// At a few rows a decode step is a weight read: oneDNN's bf16 GEMV pulls the 257 MiB of SmolLM2's
// weights at about 13 GB/s here (17 ms a step), this at about 24 GB/s (9 ms). The weight is
// re-laid once as blocks of 16 output rows with their columns in pairs ([N/16, K/2, 16, 2]), so
// one `vdpbf16ps` multiplies a pair of columns of 16 rows by a pair of x values broadcast, adding
// into 16 fp32 sums: no horizontal reductions, one pass over the weight for all the batch's rows (up to 16: then oneDNN is as fast).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "conversions.h"

namespace {

constexpr int64_t kBlock = 16;  // output rows per block: one 512-bit vector of fp32 sums
constexpr int64_t kMaxRows = 16;

#if defined(__AVX512BF16__)
template <int M>
void multiply(const uint16_t* x, const uint16_t* w, const uint16_t* bias, uint16_t* y, int64_t n, int64_t k) {
  const int64_t num_blocks = n / kBlock, pairs = k / 2;
  // one thread for small layers: waking the other costs ~50 us with OMP_WAIT_POLICY=PASSIVE
  const int64_t grain = num_blocks * k < (1 << 16) ? num_blocks : std::max<int64_t>(1, num_blocks / 2);
  at::parallel_for(0, num_blocks, grain, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const uint16_t* wb = w + b * pairs * 2 * kBlock;
      // the bias joins the fp32 sums, rounded once with them as in F.linear
      const __m512 start = bias == nullptr ? _mm512_setzero_ps() : formwork::widen16(bias + b * kBlock);
      __m512 acc[M];
      for (int m = 0; m < M; ++m) acc[m] = start;
      for (int64_t p = 0; p < pairs; ++p) {
        _mm_prefetch(reinterpret_cast<const char*>(wb + (p + 16) * 2 * kBlock), _MM_HINT_T0);
        const __m512bh wv = (__m512bh)_mm512_loadu_si512(wb + p * 2 * kBlock);
        for (int m = 0; m < M; ++m) {
          uint32_t pair;
          std::memcpy(&pair, x + m * k + 2 * p, sizeof pair);
          acc[m] = _mm512_dpbf16_ps(acc[m], wv, (__m512bh)_mm512_set1_epi32(static_cast<int>(pair)));
        }
      }
      for (int m = 0; m < M; ++m)  // round to nearest even, as a bf16 matmul does
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + m * n + b * kBlock), (__m256i)_mm512_cvtneps_pbh(acc[m]));
    }
  });
}
#endif

}  // namespace

bool small_batch_gemm_available() {
#if defined(__AVX512BF16__)
  return true;
#else
  return false;
#endif
}

// weight [N, K] bf16 (N a multiple of 16, K even) -> the blocked layout small_batch_gemm reads
torch::Tensor pack_small_batch_weight(torch::Tensor weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == torch::kBFloat16, "weight: 2-D bf16");
  const int64_t n = weight.size(0), k = weight.size(1);
  TORCH_CHECK(n % kBlock == 0 && k % 2 == 0, "weight: rows a multiple of 16, an even number of columns");
  return weight.reshape({n / kBlock, kBlock, k / 2, 2}).permute({0, 2, 1, 3}).contiguous();
}

// x [M, K] bf16 (1 <= M <= 16) times the packed weight of an [N, K] matrix, plus bias [N] when
// given: [M, N] bf16, fp32 sums
torch::Tensor small_batch_gemm(torch::Tensor x, torch::Tensor packed, int64_t n, c10::optional<torch::Tensor> bias) {
  TORCH_CHECK(small_batch_gemm_available(), "this build has no AVX-512 BF16");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kBFloat16 && x.is_contiguous(), "x: contiguous 2-D bf16");
  TORCH_CHECK(packed.dim() == 4 && packed.scalar_type() == torch::kBFloat16 && packed.is_contiguous()
              && packed.size(0) * kBlock == n && packed.size(1) * 2 == x.size(1) && packed.size(2) == kBlock,
              "packed: pack_small_batch_weight of an [N, K] weight, K = x's columns");
  const int64_t m = x.size(0), k = x.size(1);
  TORCH_CHECK(m >= 1 && m <= kMaxRows, "x: 1 to 16 rows");
  if (bias) {
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == n && bias->scalar_type() == torch::kBFloat16 && bias->is_contiguous(),
                "bias: contiguous bf16 [N]");
  }
  auto y = torch::empty({m, n}, x.options());
#if defined(__AVX512BF16__)
  auto xp = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
  auto wp = reinterpret_cast<const uint16_t*>(packed.data_ptr<at::BFloat16>());
  auto yp = reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>());
  auto bp = bias ? reinterpret_cast<const uint16_t*>(bias->data_ptr<at::BFloat16>()) : nullptr;
  using Kernel = void (*)(const uint16_t*, const uint16_t*, const uint16_t*, uint16_t*, int64_t, int64_t);
  static constexpr Kernel kernels[kMaxRows] = {multiply<1>,  multiply<2>,  multiply<3>,  multiply<4>,
                                               multiply<5>,  multiply<6>,  multiply<7>,  multiply<8>,
                                               multiply<9>,  multiply<10>, multiply<11>, multiply<12>,
                                               multiply<13>, multiply<14>, multiply<15>, multiply<16>};
  kernels[m - 1](xp, wp, bp, yp, n, k);
#endif
  return y;
}
