// The softmax of paged_attention_bf16.h's score rows: e^(s - max) by whole 16-lane chunks, in fp32
// (for the vector value pass) or rounded to bf16 (AMX's A operand of the value pass), and 1 / the
// sum of exactly the weights the value pass multiplies by.
#pragma once
#if defined(__AVX512BF16__)

#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "paged_attention_step.h"

namespace formwork::paged {

// e^x for x <= 0 to about 1 ulp (Cephes' polynomial of x - n ln 2, times 2^n); exactly 0 below -87,
// where e^x leaves the normal floats (so padding scores weigh nothing)
inline __m512 exp_nonpositive(__m512 x) {
  const __m512 lowest = _mm512_set1_ps(-87.f);
  const __mmask16 normal = _mm512_cmp_ps_mask(x, lowest, _CMP_GT_OQ);
  x = _mm512_max_ps(x, lowest);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);  // ln 2 in two parts: r is exact
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  return _mm512_maskz_mov_ps(normal, _mm512_scalef_ps(p, n));
}

// One query head's row of num_chunks whole chunks of scores (its non-keys kPadScore), capped first
// to softcap * tanh(s / softcap) when softcap > 0, into the softmax's unnormalized weights
// e^(s - max) in place; returns 1 / their sum. One compiled function for every row (never inlined
// into differently scheduled copies): its results depend on the row alone.
__attribute__((noinline)) inline float softmax_weights(float* __restrict row, int64_t num_chunks, float softcap) {
  const int64_t n = num_chunks * kKeys;
  if (softcap > 0.f) {
    const float inv = 1.f / softcap;
    for (int64_t t = 0; t < n; ++t)
      if (row[t] > kPadScore) row[t] = softcap * std::tanh(row[t] * inv);
  }
  __m512 max = _mm512_set1_ps(kPadScore);
  for (int64_t t = 0; t < n; t += kKeys) max = _mm512_max_ps(max, _mm512_load_ps(row + t));
  const __m512 top = _mm512_set1_ps(_mm512_reduce_max_ps(max));
  __m512 sum = _mm512_setzero_ps();
  for (int64_t t = 0; t < n; t += kKeys) {
    const __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_load_ps(row + t), top));
    _mm512_store_ps(row + t, e);
    sum = _mm512_add_ps(sum, e);
  }
  return 1.f / _mm512_reduce_add_ps(sum);
}

// e^x for x <= 0, for weights rounded to bf16's 8 bits next: 2^n times a degree-6 polynomial of the
// fraction f = x log2(e) - n in [-1/2, 1/2] (Taylor's: under 2e-7 off, but x log2(e)'s rounding,
// up to 6e-8 |x| relative, is not corrected); far below 0, 2^n takes it to 0 (padding weighs nothing)
inline __m512 exp_for_bf16(__m512 x) {
  const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  __m512 p = _mm512_set1_ps(1.5403530393e-4f);  // ln(2)^k / k!
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558146e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291076e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504108665e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650696e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718056e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}

// softmax_weights, the weights rounded to bf16 (to nearest even) into weights[0 .. 16 num_chunks)
// and 1 / the sum of the rounded weights returned: the value pass then averages with weights that
// sum to 1 as it reads them. One compiled function for every row, as above.
__attribute__((noinline)) inline float softmax_weights_bf16(float* __restrict row, int64_t num_chunks, float softcap,
                                                            uint16_t* __restrict weights) {
  const int64_t n = num_chunks * kKeys;
  if (softcap > 0.f) {
    const float inv = 1.f / softcap;
    for (int64_t t = 0; t < n; ++t)
      if (row[t] > kPadScore) row[t] = softcap * std::tanh(row[t] * inv);
  }
  __m512 max = _mm512_set1_ps(kPadScore);
  for (int64_t t = 0; t < n; t += kKeys) max = _mm512_max_ps(max, _mm512_load_ps(row + t));
  const __m512 top = _mm512_set1_ps(_mm512_reduce_max_ps(max));
  __m512 sum = _mm512_setzero_ps();
  for (int64_t t = 0; t < n; t += kKeys) {
    const __m256i e = (__m256i)_mm512_cvtneps_pbh(exp_for_bf16(_mm512_sub_ps(_mm512_load_ps(row + t), top)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(weights + t), e);
    sum = _mm512_add_ps(sum, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(e), 16)));
  }
  return 1.f / _mm512_reduce_add_ps(sum);
}

}  // namespace formwork::paged

#endif
