#pragma once

// Internal to kernels/cpu: AVX-512 math helpers shared by the *_avx512.cc kernels. Include
// only from translation units compiled with -mavx512f (kernels/CMakeLists.txt), and call
// only after a run-time CPU check.

#include <immintrin.h>

namespace loom::kernels::cpu::internal {

/// e^x on 16 float lanes, within 2 ulp of the exact value over the whole float range
/// (tests/kernels/activation_test.cc measures it). Large arguments saturate as expf does:
/// x <= -104 gives +0, x >= 89 gives +Inf; NaN stays NaN.
inline __m512 Exp512(__m512 x) {
  // Clamp first so that range reduction below stays finite; min/max are ordered to pass a
  // NaN in x through (they return their second operand when either is NaN).
  x = _mm512_max_ps(_mm512_set1_ps(-104.0f), _mm512_min_ps(_mm512_set1_ps(89.0f), x));
  // x = n ln2 + r, |r| <= ln2 / 2; ln2 split in two (Cody-Waite) so n * ln2_hi is exact.
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  // e^r = 1 + (r + r^2 p(r)), p Cephes' minimax polynomial for expf; the 1 is added last so
  // that r keeps its low bits.
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 r2 = _mm512_mul_ps(r, r);
  p = _mm512_add_ps(_mm512_fmadd_ps(p, r2, r), _mm512_set1_ps(1.0f));
  // p * 2^n with IEEE overflow to Inf and gradual underflow to subnormals and zero.
  return _mm512_scalef_ps(p, n);
}

}  // namespace loom::kernels::cpu::internal
