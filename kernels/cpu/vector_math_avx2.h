#pragma once

// Internal to kernels/cpu: AVX2 math helpers shared by the *_avx2.cc kernels. Include only
// from translation units compiled with -mavx2 -mfma (kernels/CMakeLists.txt), and call only
// after a run-time CPU check.

#include <immintrin.h>

namespace loom::kernels::cpu::internal {

/// The core of the AVX2 exps (the polynomial of Exp512 in vector_math_avx512.h) for a
/// clamped x: n = round(x / ln 2) and p ~ e^(x - n ln 2), so e^x = p * 2^n. How 2^n is
/// applied (and so how the ends of the range behave) is the caller's.
struct ExpParts256 {
  __m256 n, p;
};
inline ExpParts256 ExpReduce256(__m256 x) {
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  const __m256 r2 = _mm256_mul_ps(r, r);
  return {n, _mm256_add_ps(_mm256_fmadd_ps(p, r2, r), _mm256_set1_ps(1.0f))};
}

}  // namespace loom::kernels::cpu::internal
