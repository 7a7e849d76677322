// fp32 <-> the kernels' storage dtypes, shared by engine/kernels/csrc/*.cpp. All arithmetic is fp32.
#pragma once

#include <torch/extension.h>

#include <cstdint>
#include <cstring>
#if defined(__AVX512F__) || defined(__F16C__)
#include <immintrin.h>
#endif
#if defined(__AVX2__) && !defined(__F16C__)
#error "the AVX2 kernels widen fp16 scales with F16C: build with -mf16c (every AVX2 CPU has it)"
#endif

namespace formwork {

inline float to_float(float x) { return x; }
inline float to_float(double x) { return static_cast<float>(x); }
inline float to_float(c10::Half x) { return static_cast<float>(x); }
inline float to_float(c10::BFloat16 x) {  // bf16 is the top half of an fp32: a shift the compiler vectorizes
  uint32_t bits = static_cast<uint32_t>(x.x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

template <typename scalar_t>
inline scalar_t from_float(float x) { return static_cast<scalar_t>(x); }
// bf16: round to nearest even in integer arithmetic, bit for bit what c10's conversion does save its
// per-element NaN branch, which keeps loops from vectorizing (the decoder holds no NaNs)
template <>
inline c10::BFloat16 from_float<c10::BFloat16>(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  bits += 0x7FFF + ((bits >> 16) & 1);
  return c10::BFloat16(static_cast<uint16_t>(bits >> 16), c10::BFloat16::from_bits());
}

// bf16 bit patterns (the GEMM's raw uint16_t operands) <-> fp32, as the two functions above
inline float bf16_bits_to_float(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
inline uint16_t float_to_bf16_bits(float x) { return from_float<c10::BFloat16>(x).x; }

// fp16 bit patterns (the quantized weights' scales, as GGUF files store them) -> fp32, exactly
inline float half_bits_to_float(uint16_t b) { return static_cast<float>(c10::Half(b, c10::Half::from_bits())); }
#if defined(__AVX512F__)
// 16 fp16 values at p -> 16 fp32 lanes
inline __m512 widen_half16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
#endif
#if defined(__F16C__)
// 8 fp16 values at p -> 8 fp32 lanes
inline __m256 widen_half8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
#endif

#if defined(__AVX512BF16__)
// 16 bf16 values at p -> 16 fp32 lanes
inline __m512 widen16(const void* p) {
  const __m256i x = _mm256_loadu_si256(static_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(x), 16));
}
#endif

}  // namespace formwork
