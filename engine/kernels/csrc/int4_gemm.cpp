// 4-bit matrix products y = x @ W.T (+ bias) from one packed copy of a GGUF Q4_0 / Q4_1 / Q4_K weight
// (int4_gemm.h), never widened to int8 in memory.
//
// A decode step at a small batch reads every weight once: its time is the weight's bytes over the
// memory bandwidth, and the nibbles with their fp16 d and m are 0.625 bytes a value (int8 with
// per-channel scales: 1); d and m are widened to fp32 as they are loaded, exactly. Every value is
// nib * d + m (Q4_0: m = -8 d; Q4_1: the file's d, m; Q4_K: each sub-block's d * scale, -dmin * min,
// rounded to fp16). x is quantized per row and group of 32 values, as the
// int8 GEMM does (scale xs, int8 q); a group's contribution is
//   sum (nib * d + m) * q * xs = float(sum q * nib) * (d * xs) + m * (xs * sum q),
// the int32 sum exact, the fp32 scaling the same operations in every kernel (int4_operands.h).
//
// Kernels, by what the build targets:
// * AVX-512 VNNI: one 64-byte load of a chunk, masked (0x0F) and shifted (>> 4), is two quads of
//   16 columns x 4 unsigned nibbles; `vpdpbusd` multiplies each by 4 broadcast signed bytes of x.
// * AVX2: `vpmaddubsw` of the unsigned nibbles by signed x (products of at most 15 x 127, two to a
//   16-bit lane, never saturate; the two quads' pairs add in 16 bits too), `vpmaddwd` by ones to int32.
// * portable: plain int32 loops.
// From 32 rows, where the CPU has AMX-INT8, the int32 group sums come from AMX tiles of unpacked
// nibbles (amx_int4_gemm.cpp), scaled by the same fp32 operations: a row's output does not depend on
// the kernel, the tile, the thread, or the other rows of the batch (each row is quantized alone).
#include "int4_gemm.h"
#include "int4_operands.h"

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

using namespace formwork::int4;

inline int32_t x_quad(const Operands& op, int64_t row, int64_t q) {
  int32_t quad;
  std::memcpy(&quad, op.x + row * op.kp + 4 * q, sizeof quad);
  return quad;
}

#if defined(__AVX512VNNI__)
// rows [m0, m0 + MR) x blocks [b0, b0 + NB)
template <int MR, int NB>
void tile(const Operands& op, int64_t m0, int64_t b0) {
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  __m512 scaled[MR][NB];
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NB; ++j) scaled[m][j] = _mm512_setzero_ps();
  for (int64_t g = 0; g < op.groups(); ++g) {
    __m512i acc[MR][NB];
    for (int m = 0; m < MR; ++m)
      for (int j = 0; j < NB; ++j) acc[m][j] = _mm512_setzero_si512();
    for (int64_t c = g * kGroupChunks; c < (g + 1) * kGroupChunks; ++c) {
      __m512i lo[NB], hi[NB];
      for (int j = 0; j < NB; ++j) {
        _mm_prefetch(reinterpret_cast<const char*>(op.chunk(b0 + j, c + 8)), _MM_HINT_T0);
        const __m512i w = _mm512_loadu_si512(op.chunk(b0 + j, c));
        lo[j] = _mm512_and_si512(w, nibble);
        hi[j] = _mm512_and_si512(_mm512_srli_epi16(w, 4), nibble);
      }
      for (int m = 0; m < MR; ++m) {
        const __m512i x_lo = _mm512_set1_epi32(x_quad(op, m0 + m, 2 * c));
        const __m512i x_hi = _mm512_set1_epi32(x_quad(op, m0 + m, 2 * c + 1));
        for (int j = 0; j < NB; ++j)
          acc[m][j] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(acc[m][j], lo[j], x_lo), hi[j], x_hi);
      }
    }
    for (int m = 0; m < MR; ++m) {
      const __m512 x_scale = _mm512_set1_ps(op.x_scale(m0 + m, g));
      const __m512 x_offset = _mm512_set1_ps(op.x_offset(m0 + m, g));
      for (int j = 0; j < NB; ++j) {
        const __m512 scale = _mm512_mul_ps(formwork::widen_half16(op.w_d(b0 + j, g)), x_scale);
        scaled[m][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[m][j]), scale, scaled[m][j]);
        scaled[m][j] = _mm512_fmadd_ps(formwork::widen_half16(op.w_m(b0 + j, g)), x_offset, scaled[m][j]);
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
  const __m256i ones = _mm256_set1_epi16(1), nibble = _mm256_set1_epi8(0x0F);
  for (int j = 0; j < NB; ++j) {
    __m256 scaled[MR][2];
    for (int m = 0; m < MR; ++m) scaled[m][0] = scaled[m][1] = _mm256_setzero_ps();
    for (int64_t g = 0; g < op.groups(); ++g) {
      __m256i acc[MR][2];
      for (int m = 0; m < MR; ++m) acc[m][0] = acc[m][1] = _mm256_setzero_si256();
      for (int64_t c = g * kGroupChunks; c < (g + 1) * kGroupChunks; ++c) {
        const uint8_t* w = op.chunk(b0 + j, c);
        _mm_prefetch(reinterpret_cast<const char*>(op.chunk(b0 + j, c + 8)), _MM_HINT_T0);
        __m256i lo[2], hi[2];  // columns 0-7, 8-15
        for (int h = 0; h < 2; ++h) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 32 * h));
          lo[h] = _mm256_and_si256(v, nibble);
          hi[h] = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
        }
        for (int m = 0; m < MR; ++m) {
          const __m256i x_lo = _mm256_set1_epi32(x_quad(op, m0 + m, 2 * c));
          const __m256i x_hi = _mm256_set1_epi32(x_quad(op, m0 + m, 2 * c + 1));
          for (int h = 0; h < 2; ++h) {
            const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(lo[h], x_lo), _mm256_maddubs_epi16(hi[h], x_hi));
            acc[m][h] = _mm256_add_epi32(acc[m][h], _mm256_madd_epi16(pairs, ones));
          }
        }
      }
      for (int h = 0; h < 2; ++h) {
        const __m256 d = formwork::widen_half8(op.w_d(b0 + j, g) + 8 * h);
        const __m256 mins = formwork::widen_half8(op.w_m(b0 + j, g) + 8 * h);
        for (int m = 0; m < MR; ++m) {
          const __m256 scale = _mm256_mul_ps(d, _mm256_set1_ps(op.x_scale(m0 + m, g)));
          scaled[m][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[m][h]), scale, scaled[m][h]);
          scaled[m][h] = _mm256_fmadd_ps(mins, _mm256_set1_ps(op.x_offset(m0 + m, g)), scaled[m][h]);
        }
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
      const int8_t* x = op.x + (m0 + m) * op.kp;
      float sums[kBlock] = {};
      for (int64_t g = 0; g < op.groups(); ++g) {
        const uint16_t* d = op.w_d(b0 + j, g);
        const uint16_t* mins = op.w_m(b0 + j, g);
        for (int64_t i = 0; i < kBlock; ++i) {
          int32_t acc = 0;
          for (int64_t c = g * kGroupChunks; c < (g + 1) * kGroupChunks; ++c)
            for (int64_t t = 0; t < 4; ++t) {
              const uint8_t b = op.chunk(b0 + j, c)[4 * i + t];
              acc += x[8 * c + t] * (b & 0x0F) + x[8 * c + 4 + t] * (b >> 4);
            }
          const float scale = formwork::half_bits_to_float(d[i]) * op.x_scale(m0 + m, g);
          sums[i] = std::fma(static_cast<float>(acc), scale, sums[i]);
          sums[i] = std::fma(formwork::half_bits_to_float(mins[i]), op.x_offset(m0 + m, g), sums[i]);
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
  if (op.m >= kAmxMinRows && amx_int4_ready()) return multiply_amx(op);  // the same sums, the same scaling
  formwork::quantized::multiply_panels(op.m, op.n, op.kp, op.num_blocks(), [&](int64_t m0, int64_t rows, int64_t b0,
                                                                               int64_t blocks) {
    tile_for(rows, blocks)(op, m0, b0);
  });
}

// x's rows into q [m, kp], scales and offsets [m, kp / 32]: an offset is the group's sum of q times
// its scale, what a column's m multiplies
void quantize(const torch::Tensor& x, int64_t kp, int8_t* q, float* scales, float* offsets) {
  formwork::quantized::quantize_rows_into(x, kp, kGroup, q, scales, [&](int64_t i, int32_t sum, float scale) {
    offsets[i] = static_cast<float>(sum) * scale;
  });
}

}  // namespace

std::vector<torch::Tensor> int4_quantize_rows(torch::Tensor x) {
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1 && x.is_floating_point(), "x: 2-D float with contiguous rows");
  const int64_t m = x.size(0), kp = (x.size(1) + kGroup - 1) / kGroup * kGroup;
  auto q = torch::empty({m, kp}, torch::kInt8);
  auto scales = torch::empty({m, kp / kGroup}, torch::kFloat);
  std::vector<float> offsets(m * (kp / kGroup));
  if (m > 0) quantize(x, kp, q.data_ptr<int8_t>(), scales.data_ptr<float>(), offsets.data());
  return {q.narrow(1, 0, x.size(1)), scales};
}

torch::Tensor int4_gemm(torch::Tensor x, torch::Tensor packed, torch::Tensor scales, int64_t n,
                        c10::optional<torch::Tensor> bias, bool fp32_out) {
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1 && x.is_floating_point(), "x: 2-D float with contiguous rows");
  const int64_t m = x.size(0), k = x.size(1), kp = padded_k(k), num_blocks = (n + kBlock - 1) / kBlock;
  TORCH_CHECK(packed.dim() == 4 && packed.scalar_type() == torch::kUInt8 && packed.is_contiguous()
              && packed.size(0) == num_blocks && packed.size(1) == kp / kChunkValues && packed.size(2) == kBlock
              && packed.size(3) == 4, "packed: the 4-bit layout of an [N, K] weight, K = x's columns");
  TORCH_CHECK(scales.dim() == 4 && scales.scalar_type() == torch::kHalf && scales.is_contiguous()
              && scales.size(0) == num_blocks && scales.size(1) == kp / kGroup && scales.size(2) == 2
              && scales.size(3) == kBlock, "scales: fp16 [blocks, K / 32 (padded), 2, 16]");
  if (bias) {
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == n && bias->scalar_type() == torch::kFloat && bias->is_contiguous(),
                "bias: contiguous fp32 [N]");
  }
  const bool y_bf16 = !fp32_out && x.scalar_type() == torch::kBFloat16;
  auto y = torch::empty({m, n}, x.options().dtype(y_bf16 ? torch::kBFloat16 : torch::kFloat));
  if (m == 0 || n == 0) return y;
  const int64_t rows = (m + 15) / 16 * 16;  // whole AMX tiles of rows, the extra ones zero
  std::vector<int8_t> q(rows * kp, 0);
  std::vector<float> x_scales(rows * (kp / kGroup), 0.f), x_offsets(rows * (kp / kGroup), 0.f);
  quantize(x, kp, q.data(), x_scales.data(), x_offsets.data());
  const Operands op{q.data(), x_scales.data(), x_offsets.data(), m, kp, packed.data_ptr<uint8_t>(),
                    static_cast<const uint16_t*>(scales.data_ptr()), bias ? bias->data_ptr<float>() : nullptr, n,
                    y.data_ptr(), y_bf16};
  multiply(op);
  return y;
}

std::string int4_gemm_isa() {
  if (amx_int4_ready()) return "amx_int8";  // from 32 rows; avx512_vnni below
#if defined(__AVX512VNNI__)
  return "avx512_vnni";
#elif defined(__AVX2__)
  return "avx2";
#else
  return "portable";
#endif
}
