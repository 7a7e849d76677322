// int8 matrix products y = x @ W.T (+ bias) from one packed copy of an int8 weight (int8_gemm.h).
//
// A decode step at a small batch reads every weight once, so its time is the weight's bytes over
// the memory bandwidth: int8 halves what bf16 reads. x is quantized at the start of each call, per
// row and group of 64 values (32 beside GGUF Q8_0 weights, whose scales are per 32; one scale
// each, as llama.cpp quantizes activations for Q8_0: a per-token scale alone lets one outlier
// channel flatten the rest of the row), the products of a group are summed in int32 (exact), and
// each group's sum is scaled back in fp32:
// y = sum_g int32_g * (x_scale_g * w_scale_g) (+ bias), w_scale_g one per column (per-channel
// weights) or per column and group (GGUF Q8_0).
//
// Kernels, by what the build targets:
// * AVX-512 VNNI: `vpdpbusd` multiplies 4 unsigned bytes of 16 columns by 4 signed bytes of x into
//   16 int32 sums. The weight is stored unsigned, w + 128 (int8_gemm.h); 128 times the sum of x's
//   group, counted as x is quantized, comes back off each sum, exactly. A register tile is up to
//   4 rows x 3 blocks: 12 int32 and 12 fp32 accumulators stay in registers.
// * AVX2: `vpmaddubsw` on |x| and w carrying x's sign (`vpsignb`): products of at most 127 x 127,
//   two to a 16-bit lane, never saturate; `vpmaddwd` by ones widens them to int32.
// * portable: plain int32 loops.
// From 16 rows, where the CPU has AMX-INT8, the int32 group sums come from AMX tiles instead
// (amx_int8_gemm.cpp), scaled by the same fp32 operations.
// Every kernel forms the same int32 sums, and those are exact: the output does not depend on the
// kernel, the tile, the thread, or the other rows of the batch (each row is quantized alone).
#include "int8_gemm.h"
#include "int8_operands.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "conversions.h"
#include "worker_pool.h"

namespace {

using namespace formwork::int8;
constexpr int64_t kQ8Group = kWeightGroup;  // values per scale in GGUF Q8_0
constexpr int64_t kQ8BlockBytes = 2 + kQ8Group;  // its fp16 scale, then the values

inline int32_t x_quad(const Operands& op, int64_t row, int64_t q) {
  int32_t quad;
  std::memcpy(&quad, op.x + row * op.kp + 4 * q, sizeof quad);
  return quad;
}

#if defined(__AVX512VNNI__)
// rows [m0, m0 + MR) x blocks [b0, b0 + NB)
template <int MR, int NB>
void tile(const Operands& op, int64_t m0, int64_t b0) {
  __m512 scaled[MR][NB];
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NB; ++j) scaled[m][j] = _mm512_setzero_ps();
  for (int64_t g = 0; g < op.groups(); ++g) {
    __m512i acc[MR][NB];
    for (int m = 0; m < MR; ++m)
      for (int j = 0; j < NB; ++j) acc[m][j] = _mm512_setzero_si512();
    for (int64_t q = g * op.group_quads(); q < (g + 1) * op.group_quads(); ++q) {
      __m512i wv[NB];
      for (int j = 0; j < NB; ++j) {
        _mm_prefetch(reinterpret_cast<const char*>(op.quad(b0 + j, q + 8)), _MM_HINT_T0);
        wv[j] = _mm512_loadu_si512(op.quad(b0 + j, q));
      }
      for (int m = 0; m < MR; ++m) {
        const __m512i xv = _mm512_set1_epi32(x_quad(op, m0 + m, q));
        for (int j = 0; j < NB; ++j) acc[m][j] = _mm512_dpbusd_epi32(acc[m][j], wv[j], xv);
      }
    }
    for (int m = 0; m < MR; ++m) {
      const __m512i offset = _mm512_set1_epi32(op.x_offset(m0 + m, g));
      const __m512 x_scale = _mm512_set1_ps(op.x_scale(m0 + m, g));
      for (int j = 0; j < NB; ++j) {
        const __m512 scale = _mm512_mul_ps(op.w_scales16(b0 + j, g), x_scale);
        scaled[m][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc[m][j], offset)), scale, scaled[m][j]);
      }
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NB; ++j) {
      alignas(64) float sums[kBlock];
      _mm512_store_ps(sums, scaled[m][j]);
      store(op, m0 + m, (b0 + j) * kBlock, sums);
    }
}
#elif defined(__AVX2__)
// rows [m0, m0 + MR) x blocks [b0, b0 + NB), one block at a time (16 registers)
template <int MR, int NB>
void tile(const Operands& op, int64_t m0, int64_t b0) {
  const __m256i ones = _mm256_set1_epi16(1), sign_bits = _mm256_set1_epi8(static_cast<char>(0x80));
  for (int j = 0; j < NB; ++j) {
    __m256 scaled[MR][2];
    for (int m = 0; m < MR; ++m) scaled[m][0] = scaled[m][1] = _mm256_setzero_ps();
    for (int64_t g = 0; g < op.groups(); ++g) {
      __m256i acc[MR][2];
      for (int m = 0; m < MR; ++m) acc[m][0] = acc[m][1] = _mm256_setzero_si256();
      for (int64_t q = g * op.group_quads(); q < (g + 1) * op.group_quads(); ++q) {
        const uint8_t* w = op.quad(b0 + j, q);
        _mm_prefetch(reinterpret_cast<const char*>(op.quad(b0 + j, q + 8)), _MM_HINT_T0);
        // w + 128 back to w
        const __m256i lo = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)), sign_bits);
        const __m256i hi = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 32)), sign_bits);
        for (int m = 0; m < MR; ++m) {
          const __m256i xv = _mm256_set1_epi32(x_quad(op, m0 + m, q));
          const __m256i magnitude = _mm256_sign_epi8(xv, xv);  // |x|: x never holds -128
          acc[m][0] = _mm256_add_epi32(acc[m][0], _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(lo, xv)), ones));
          acc[m][1] = _mm256_add_epi32(acc[m][1], _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(hi, xv)), ones));
        }
      }
      const __m256 scale_lo = op.w_scales8(b0 + j, g, 0), scale_hi = op.w_scales8(b0 + j, g, 1);
      for (int m = 0; m < MR; ++m) {
        const __m256 x_scale = _mm256_set1_ps(op.x_scale(m0 + m, g));
        scaled[m][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[m][0]), _mm256_mul_ps(scale_lo, x_scale), scaled[m][0]);
        scaled[m][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[m][1]), _mm256_mul_ps(scale_hi, x_scale), scaled[m][1]);
      }
    }
    for (int m = 0; m < MR; ++m) {
      alignas(32) float sums[kBlock];
      _mm256_store_ps(sums, scaled[m][0]);
      _mm256_store_ps(sums + 8, scaled[m][1]);
      store(op, m0 + m, (b0 + j) * kBlock, sums);
    }
  }
}
#else
// the portable kernel: int32 sums column by column
template <int MR, int NB>
void tile(const Operands& op, int64_t m0, int64_t b0) {
  for (int j = 0; j < NB; ++j)
    for (int m = 0; m < MR; ++m) {
      float sums[kBlock] = {};
      for (int64_t g = 0; g < op.groups(); ++g) {
        for (int64_t i = 0; i < kBlock; ++i) {
          int32_t acc = 0;
          for (int64_t q = g * op.group_quads(); q < (g + 1) * op.group_quads(); ++q)
            for (int64_t t = 0; t < 4; ++t)
              acc += static_cast<int32_t>(op.x[(m0 + m) * op.kp + 4 * q + t]) * (op.quad(b0 + j, q)[4 * i + t] - 128);
          sums[i] = std::fma(static_cast<float>(acc), op.w_scale(b0 + j, g, i) * op.x_scale(m0 + m, g), sums[i]);
        }
      }
      store(op, m0 + m, (b0 + j) * kBlock, sums);
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
    default: return tile_for_blocks<4>(nb);
  }
}

void multiply(const Operands& op) {
  if (op.m >= kAmxMinRows && amx_int8_ready()) return multiply_amx(op);  // the same sums, the same scaling
  formwork::quantized::multiply_panels(op.m, op.n, op.kp, op.num_blocks(), [&](int64_t m0, int64_t rows, int64_t b0,
                                                                               int64_t blocks) {
    tile_for(rows, blocks)(op, m0, b0);
  });
}

// x's rows into q [m, kp], scales and offsets [m, kp / group]: an offset is what the 128 added to
// each stored weight adds to the group's int32 sum, 128 times the sum of its quantized values
void quantize(const torch::Tensor& x, int64_t kp, int64_t group, int8_t* q, float* scales, int32_t* offsets) {
  formwork::quantized::quantize_rows_into(x, kp, group, q, scales,
                                          [&](int64_t i, int32_t sum, float) { offsets[i] = 128 * sum; });
}

// empty (packed, scales) for an [n, k] weight with `groups` scales per column: one fp32 per channel,
// or fp16 per group (the file's own; widened in the kernels)
std::vector<torch::Tensor> allocate_packed(int64_t n, int64_t k, int64_t groups) {
  const int64_t num_blocks = (n + kBlock - 1) / kBlock;
  return {torch::zeros({num_blocks, padded_k(k) / 4, kBlock, 4}, torch::kUInt8),
          torch::zeros({num_blocks, groups, kBlock}, groups == 1 ? torch::kFloat : torch::kHalf)};
}

// writes column c's k quantized values into the layout, as w + 128 (the padding stays 0 x 0: its x is 0)
void place_column(torch::Tensor& packed, int64_t c, const int8_t* values, int64_t k) {
  uint8_t* column = packed.data_ptr<uint8_t>() + c / kBlock * packed.size(1) * 4 * kBlock + 4 * (c % kBlock);
  for (int64_t v = 0; v < k; ++v) column[v / 4 * 4 * kBlock + v % 4] = static_cast<uint8_t>(values[v] + 128);
}

}  // namespace

std::vector<torch::Tensor> pack_int8_weight(torch::Tensor weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.size(1) > 0 && weight.is_floating_point(), "weight: 2-D float, K > 0");
  const torch::Tensor w = weight.to(torch::kFloat).contiguous();  // one matrix at a time, once
  const int64_t n = w.size(0), k = w.size(1);
  auto packed = allocate_packed(n, k, 1);
  float* scales = packed[1].data_ptr<float>();
  at::parallel_for(0, n, 64, [&](int64_t begin, int64_t end) {
    std::vector<int8_t> values(k);
    for (int64_t c = begin; c < end; ++c) {
      formwork::quantized::quantize_group(w.data_ptr<float>() + c * k, k, values.data(), scales + c);  // [blocks, 1, 16] is [n] padded
      place_column(packed[0], c, values.data(), k);
    }
  });
  return packed;
}

std::vector<torch::Tensor> pack_q8_0_weight(torch::Tensor rows, int64_t k) {
  TORCH_CHECK(k > 0 && k % kQ8Group == 0, "Q8_0: K must be a positive multiple of 32, got ", k);
  TORCH_CHECK(rows.dim() == 2 && rows.scalar_type() == torch::kUInt8 && rows.is_contiguous()
              && rows.size(1) == k / kQ8Group * kQ8BlockBytes, "rows: contiguous uint8 [N, K / 32 * 34]");
  const int64_t n = rows.size(0), groups = padded_k(k) / kQ8Group;
  auto packed = allocate_packed(n, k, groups);
  auto* scales = static_cast<uint8_t*>(packed[1].data_ptr());  // fp16, copied as the file stores them
  const uint8_t* data = rows.data_ptr<uint8_t>();
  at::parallel_for(0, n, 64, [&](int64_t begin, int64_t end) {
    std::vector<int8_t> values(k);
    for (int64_t c = begin; c < end; ++c) {
      const uint8_t* row = data + c * rows.size(1);
      for (int64_t g = 0; g < k / kQ8Group; ++g) {
        std::memcpy(scales + 2 * ((c / kBlock * groups + g) * kBlock + c % kBlock), row + g * kQ8BlockBytes, 2);
        // -128 (llama.cpp's quantizer never writes it) as -127: |w| <= 127 keeps the AVX2 kernel exact
        for (int64_t v = 0; v < kQ8Group; ++v)
          values[g * kQ8Group + v] = std::max<int8_t>(-127, static_cast<int8_t>(row[g * kQ8BlockBytes + 2 + v]));
      }
      place_column(packed[0], c, values.data(), k);
    }
  });
  return packed;
}

std::vector<torch::Tensor> quantize_rows(torch::Tensor x, int64_t group) {
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1 && x.is_floating_point(), "x: 2-D float with contiguous rows");
  TORCH_CHECK(group == kWeightGroup || group == kMaxGroup, "group: ", kWeightGroup, " or ", kMaxGroup, ", got ", group);
  const int64_t m = x.size(0), kp = (x.size(1) + group - 1) / group * group;
  auto q = torch::empty({m, kp}, torch::kInt8);
  auto scales = torch::empty({m, kp / group}, torch::kFloat);
  std::vector<int32_t> offsets(m * (kp / group));
  if (m > 0) quantize(x, kp, group, q.data_ptr<int8_t>(), scales.data_ptr<float>(), offsets.data());
  return {q.narrow(1, 0, x.size(1)), scales};
}

torch::Tensor int8_gemm(torch::Tensor x, torch::Tensor packed, torch::Tensor scales, int64_t n,
                        c10::optional<torch::Tensor> bias, bool fp32_out) {
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1 && x.is_floating_point(), "x: 2-D float with contiguous rows");
  const int64_t m = x.size(0), k = x.size(1), kp = padded_k(k), num_blocks = (n + kBlock - 1) / kBlock;
  TORCH_CHECK(packed.dim() == 4 && packed.scalar_type() == torch::kUInt8 && packed.is_contiguous()
              && packed.size(0) == num_blocks && packed.size(1) == kp / 4 && packed.size(2) == kBlock
              && packed.size(3) == 4, "packed: the int8 layout of an [N, K] weight, K = x's columns");
  TORCH_CHECK(scales.dim() == 3 && scales.is_contiguous() && scales.size(0) == num_blocks && scales.size(2) == kBlock
              && ((scales.size(1) == 1 && scales.scalar_type() == torch::kFloat)
                  || (scales.size(1) == kp / kWeightGroup && scales.scalar_type() == torch::kHalf)),
              "scales: fp32 [blocks, 1, 16] (per channel) or fp16 [blocks, K / 32 (padded), 16] (per group)");
  if (bias) {
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == n && bias->scalar_type() == torch::kFloat && bias->is_contiguous(),
                "bias: contiguous fp32 [N]");
  }
  const bool y_bf16 = !fp32_out && x.scalar_type() == torch::kBFloat16;
  auto y = torch::empty({m, n}, x.options().dtype(y_bf16 ? torch::kBFloat16 : torch::kFloat));
  if (m == 0 || n == 0) return y;
  const int64_t rows = (m + 15) / 16 * 16;  // whole AMX tiles of rows, the extra ones zero
  std::vector<int8_t> q(rows * kp, 0);
  const int64_t group = activation_group(scales.size(1));
  std::vector<float> x_scales(rows * (kp / group), 0.f);
  std::vector<int32_t> x_offsets(rows * (kp / group), 0);
  quantize(x, kp, group, q.data(), x_scales.data(), x_offsets.data());
  const Operands op{q.data(), x_scales.data(), x_offsets.data(), m, kp, group, packed.data_ptr<uint8_t>(),
                    scales.data_ptr(), scales.size(1), bias ? bias->data_ptr<float>() : nullptr, n,
                    y.data_ptr(), y_bf16};
  multiply(op);
  return y;
}

std::string int8_gemm_isa() {
  if (amx_int8_ready()) return "amx_int8";  // from 16 rows; avx512_vnni below
#if defined(__AVX512VNNI__)
  return "avx512_vnni";
#elif defined(__AVX2__)
  return "avx2";
#else
  return "portable";
#endif
}
