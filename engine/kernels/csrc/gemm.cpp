// bf16 matrix products y = x @ W.T (+ bias) for every batch size, from one packed copy of W.
//
// The weight is laid out once as blocks of 16 output columns with their K values in pairs
// (gemm.h; K padded to whole AMX tiles): one `vdpbf16ps` multiplies a pair of K values of
// 16 columns by a pair of x values broadcast, adding into 16 fp32 sums, so no sum is ever reduced
// across lanes. A register tile is up to 8 rows of x by 3 blocks (48 columns): 24 accumulators,
// 3 weight loads and 8 broadcasts per 24 dot products. Threads split the columns into panels of
// 3 blocks; a panel (3 x K x 32 bytes) stays in L2 while every row tile of a chunk of x passes
// over it, and x is taken in chunks that fit L2 too. Sums are fp32; the output is rounded once.
//
// Where the CPU has AMX, every product goes to AMX tiles instead (amx_gemm.cpp), from the same copy.
// Without AVX-512 BF16 (or built with FORMWORK_CPU_ISA=avx2) the layout is read by a portable
// kernel that widens bf16 to fp32 and lets the compiler vectorize the 16 columns.
//
// A row's output never depends on the other rows of the call: one kernel serves every row count
// (AMX even for one row: two kernels sum in two orders, and a prompt answered from the prefix
// cache, one new row, would then differ from the same prompt prefilled), K is never split, and
// each output sums its K pairs in one order whatever the tile or thread it lands in.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "conversions.h"
#include "gemm.h"
#include "ops.h"
#include "worker_pool.h"

namespace {

using formwork::gemm::kBlock;
using formwork::gemm::Operands;
constexpr int64_t kPanel = 3;      // blocks per register tile and per thread work unit
constexpr int64_t kTileRows = 8;   // rows of x per register tile
constexpr int64_t kChunkBytes = 512 << 10;  // rows of x per pass over the weight: about this many bytes

[[maybe_unused]] inline uint32_t x_pair(const uint16_t* row, int64_t p, int64_t k) {
  if (2 * p + 1 < k) {
    uint32_t pair;
    std::memcpy(&pair, row + 2 * p, sizeof pair);
    return pair;
  }
  return row[2 * p];  // odd K: the padding column's x is zero, so its weight pair adds nothing
}

#if defined(__AVX512BF16__)
// rows [m0, m0 + MR) x blocks [b0, b0 + NB)
template <int MR, int NB>
void tile(const Operands& op, int64_t m0, int64_t b0) {
  const int64_t pairs = (op.k + 1) / 2, full_pairs = op.k / 2, stride = op.block_stride();
  const uint16_t* w = op.w + b0 * stride;
  __m512 acc[MR][NB];
  for (int j = 0; j < NB; ++j) {
    // the bias joins the fp32 sums, rounded once with them as in F.linear
    __m512 start = _mm512_setzero_ps();
    if (op.bias != nullptr) {
      const int64_t col = (b0 + j) * kBlock, cols = std::min<int64_t>(kBlock, op.n - col);
      const __m256i b = _mm256_maskz_loadu_epi16(static_cast<__mmask16>((1u << cols) - 1), op.bias + col);
      start = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
    }
    for (int m = 0; m < MR; ++m) acc[m][j] = start;
  }
  const uint16_t* x = op.x + m0 * op.x_stride;
  for (int64_t p = 0; p < full_pairs; ++p) {
    __m512bh wv[NB];
    for (int j = 0; j < NB; ++j) {
      _mm_prefetch(reinterpret_cast<const char*>(w + j * stride + (p + 8) * 2 * kBlock), _MM_HINT_T0);
      wv[j] = (__m512bh)_mm512_loadu_si512(w + j * stride + p * 2 * kBlock);
    }
    for (int m = 0; m < MR; ++m) {
      uint32_t pair;
      std::memcpy(&pair, x + m * op.x_stride + 2 * p, sizeof pair);
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
      for (int j = 0; j < NB; ++j) acc[m][j] = _mm512_dpbf16_ps(acc[m][j], wv[j], xv);
    }
  }
  if (pairs != full_pairs) {  // odd K: the last x value alone
    for (int m = 0; m < MR; ++m) {
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(static_cast<int>(x[m * op.x_stride + op.k - 1]));
      for (int j = 0; j < NB; ++j)
        acc[m][j] = _mm512_dpbf16_ps(acc[m][j], (__m512bh)_mm512_loadu_si512(w + j * stride + full_pairs * 2 * kBlock), xv);
    }
  }
  for (int j = 0; j < NB; ++j) {
    const int64_t col = (b0 + j) * kBlock, cols = std::min<int64_t>(kBlock, op.n - col);
    const __mmask16 mask = static_cast<__mmask16>((1u << cols) - 1);
    for (int m = 0; m < MR; ++m) {
      const int64_t at = (m0 + m) * op.n + col;
      if (op.y32 != nullptr)
        _mm512_mask_storeu_ps(op.y32 + at, mask, acc[m][j]);
      else  // round to nearest even, as a bf16 matmul does
        _mm256_mask_storeu_epi16(op.y + at, mask, (__m256i)_mm512_cvtneps_pbh(acc[m][j]));
    }
  }
}
#else
// the portable kernel: one block of 16 columns, rows widened pair by pair
template <int MR, int NB>
void tile(const Operands& op, int64_t m0, int64_t b0) {
  const int64_t pairs = (op.k + 1) / 2, stride = op.block_stride();
  for (int j = 0; j < NB; ++j) {
    const int64_t col = (b0 + j) * kBlock, cols = std::min<int64_t>(kBlock, op.n - col);
    const uint16_t* w = op.w + (b0 + j) * stride;
    float acc[MR][kBlock];
    for (int i = 0; i < kBlock; ++i) {
      const float start = op.bias != nullptr && i < cols ? formwork::bf16_bits_to_float(op.bias[col + i]) : 0.f;
      for (int m = 0; m < MR; ++m) acc[m][i] = start;
    }
    for (int64_t p = 0; p < pairs; ++p) {
      float w0[kBlock], w1[kBlock];
#pragma omp simd
      for (int i = 0; i < kBlock; ++i) {
        w0[i] = formwork::bf16_bits_to_float(w[p * 2 * kBlock + 2 * i]);
        w1[i] = formwork::bf16_bits_to_float(w[p * 2 * kBlock + 2 * i + 1]);
      }
      for (int m = 0; m < MR; ++m) {
        const uint32_t pair = x_pair(op.x + (m0 + m) * op.x_stride, p, op.k);
        const float x0 = formwork::bf16_bits_to_float(static_cast<uint16_t>(pair)), x1 = formwork::bf16_bits_to_float(static_cast<uint16_t>(pair >> 16));
#if defined(__FMA__)
        // explicit fmas: every tile height (MR) adds in this order, which -ffast-math could
        // otherwise reassociate differently per instantiation
#pragma omp simd
        for (int i = 0; i < kBlock; ++i) acc[m][i] = std::fma(w1[i], x1, std::fma(w0[i], x0, acc[m][i]));
#else  // fma() would be a library call per element
#pragma omp simd
        for (int i = 0; i < kBlock; ++i) acc[m][i] += w0[i] * x0 + w1[i] * x1;
#endif
      }
    }
    for (int m = 0; m < MR; ++m)
      for (int i = 0; i < cols; ++i) {
        const int64_t at = (m0 + m) * op.n + col + i;
        if (op.y32 != nullptr)
          op.y32[at] = acc[m][i];
        else
          op.y[at] = formwork::float_to_bf16_bits(acc[m][i]);
      }
  }
}
#endif

using Tile = void (*)(const Operands&, int64_t, int64_t);

template <int MR>
constexpr Tile tile_for_blocks(int64_t nb) {
  return nb == 1 ? tile<MR, 1> : nb == 2 ? tile<MR, 2> : tile<MR, 3>;
}

Tile tile_for(int64_t mr, int64_t nb) {
  switch (mr) {
    case 1: return tile_for_blocks<1>(nb);
    case 2: return tile_for_blocks<2>(nb);
    case 3: return tile_for_blocks<3>(nb);
    case 4: return tile_for_blocks<4>(nb);
    case 5: return tile_for_blocks<5>(nb);
    case 6: return tile_for_blocks<6>(nb);
    case 7: return tile_for_blocks<7>(nb);
    default: return tile_for_blocks<8>(nb);
  }
}

void multiply(const Operands& op) {
  if (formwork::gemm::amx_ready()) return formwork::gemm::multiply_amx(op);  // every row count: see the top
  const int64_t num_blocks = op.num_blocks(), num_panels = (num_blocks + kPanel - 1) / kPanel;
  const int64_t chunk_rows = std::max<int64_t>(kTileRows, kChunkBytes / (2 * op.k) / kTileRows * kTileRows);
  // one thread only for the smallest products (a few us); above that the helpers share the weight
  // read even at one row: the caller never waits for a helper that is not awake yet
  const int64_t work = op.n * op.k * (1 + op.m / 8);
  // panels per chunk: about 16 chunks, claimed one at a time by whichever thread is free
  const int64_t chunk_panels = work < (1 << 17) ? num_panels : std::max<int64_t>(1, num_panels / 16);
  const int64_t num_chunks = (num_panels + chunk_panels - 1) / chunk_panels;
  for (int64_t m_chunk = 0; m_chunk < op.m; m_chunk += chunk_rows) {
    const int64_t m_end = std::min(op.m, m_chunk + chunk_rows);
    formwork::parallel_chunks(num_chunks, [&](int64_t chunk) {
      for (int64_t panel = chunk * chunk_panels; panel < std::min(num_panels, (chunk + 1) * chunk_panels); ++panel) {
        const int64_t b0 = panel * kPanel, nb = std::min(kPanel, num_blocks - b0);
        for (int64_t m0 = m_chunk; m0 < m_end; m0 += kTileRows) tile_for(std::min(kTileRows, m_end - m0), nb)(op, m0, b0);
      }
    });
  }
}

}  // namespace

// GFLOP/s of the inner loop alone, on every thread of the pool: what a unit of `multiply` does once
// its operands are near, the 8 x 3 register tile walking 64 rows of x down one panel of the weight,
// at the default model's K (576: x 72 KiB, the panel 54 KiB, both in L2), `repeats` tiles per
// thread (the peak the figures compare against)
double gemm_inner_loop_gflops(int64_t repeats) {
  if (formwork::gemm::amx_ready()) return formwork::gemm::amx_inner_loop_gflops(repeats);  // the batches' kernel
  constexpr int64_t k = 576, rows = 64;
  const int64_t threads = at::get_num_threads(), walks = std::max<int64_t>(1, repeats / (rows / kTileRows));
  const auto start = std::chrono::steady_clock::now();
  formwork::parallel_chunks(threads, [&](int64_t) {
    std::vector<uint16_t> x(rows * k, 0x3F80), w(kPanel * k * kBlock, 0x3F80), y(rows * kPanel * kBlock);
    const Operands op{x.data(), k, rows, k, w.data(), nullptr, y.data(), kPanel * kBlock};
    for (int64_t r = 0; r < walks; ++r)
      for (int64_t m0 = 0; m0 < rows; m0 += kTileRows) tile<kTileRows, kPanel>(op, m0, 0);
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return 2.0 * rows * kPanel * kBlock * k * walks * threads / seconds / 1e9;
}

std::string gemm_isa() {
  if (formwork::gemm::amx_ready()) return "amx_bf16";
#if defined(__AVX512BF16__)
  return "avx512_bf16";
#else
  return "portable";
#endif
}

// weight [N, K] bf16 -> the blocked layout gemm reads (gemm.h): [ceil(N/16), P, 16, 2], zero padded.
// Written straight into its one allocation: packing a model's largest matrix (a 150K-token head)
// holds the weight and its packed copy, never a padded copy in between.
torch::Tensor pack_weight(torch::Tensor weight) {
  if (weight.scalar_type() == torch::kFloat) return pack_weight_fp32(weight);  // gemm_fp32.cpp's layout
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == torch::kBFloat16, "weight: 2-D bf16 or float32");
  const int64_t n = weight.size(0), k = weight.size(1), pairs = formwork::gemm::padded_pairs(k);
  const int64_t num_blocks = (n + kBlock - 1) / kBlock;
  auto packed = torch::zeros({num_blocks, pairs, kBlock, 2}, weight.options());
  const auto* w = reinterpret_cast<const uint16_t*>(weight.data_ptr<at::BFloat16>());
  auto* p = reinterpret_cast<uint16_t*>(packed.data_ptr<at::BFloat16>());
  const int64_t row_stride = weight.stride(0), col_stride = weight.stride(1);
  at::parallel_for(0, num_blocks, 16, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b)
      for (int64_t c = 0; c < std::min<int64_t>(kBlock, n - b * kBlock); ++c) {
        const uint16_t* row = w + (b * kBlock + c) * row_stride;
        uint16_t* column = p + b * pairs * 2 * kBlock + 2 * c;  // pair q of this column: column[q * 32 + 0/1]
        for (int64_t i = 0; i < k; ++i) column[i / 2 * 2 * kBlock + i % 2] = row[i * col_stride];
      }
  });
  return packed;
}

// x [M, K] bf16 (rows strided, M >= 0) times the packed weight of an [N, K] matrix, plus bias [N]
// when given: [M, N] bf16, fp32 sums; with fp32_out the sums themselves, unrounded ([M, N] float).
// float32 x goes to gemm_fp32 (weights packed from bf16 or float32, bias float32, float32 out).
torch::Tensor gemm(torch::Tensor x, torch::Tensor packed, int64_t n, c10::optional<torch::Tensor> bias,
                   bool fp32_out) {
  if (x.scalar_type() == torch::kFloat) return gemm_fp32(x, packed, n, bias);  // its sums are its output
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kBFloat16 && x.stride(1) == 1,
              "x: 2-D bf16 or float32 with contiguous rows");
  const int64_t m = x.size(0), k = x.size(1);
  TORCH_CHECK(packed.dim() == 4 && packed.scalar_type() == torch::kBFloat16 && packed.is_contiguous()
              && packed.size(0) == (n + kBlock - 1) / kBlock && packed.size(1) == formwork::gemm::padded_pairs(k)
              && packed.size(2) == kBlock && packed.size(3) == 2,
              "packed: pack_weight of an [N, K] weight, K = x's columns");
  if (bias) {
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == n && bias->scalar_type() == torch::kBFloat16 && bias->is_contiguous(),
                "bias: contiguous bf16 [N]");
  }
  auto y = torch::empty({m, n}, x.options().dtype(fp32_out ? torch::kFloat : torch::kBFloat16));
  if (m == 0 || n == 0) return y;
  if (k == 0) return bias ? y.copy_(bias->expand({m, n})) : y.zero_();
  Operands op{reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>()), x.stride(0), m, k,
              reinterpret_cast<const uint16_t*>(packed.data_ptr<at::BFloat16>()),
              bias ? reinterpret_cast<const uint16_t*>(bias->data_ptr<at::BFloat16>()) : nullptr,
              fp32_out ? nullptr : reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>()), n,
              fp32_out ? y.data_ptr<float>() : nullptr};
  multiply(op);
  return y;
}
