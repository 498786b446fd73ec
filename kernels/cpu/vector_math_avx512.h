#pragma once

// Internal to kernels/cpu: AVX-512 math helpers shared by the *_avx512.cc kernels. Include
// only from translation units compiled with -mavx512f (kernels/CMakeLists.txt), and call
// only after a run-time CPU check.

#include <immintrin.h>

#include <cstdint>

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

/// x with the lanes whose limit <= position or whose lower > position set to `fill`: the causal
/// and sliding-window mask of the attention tiles (AVX-512's and AMX's).
inline __m512 MaskOutside16(__m512 x, __m512i lower, __m512i limit, int64_t position, __m512 fill) {
  const __m512i at = _mm512_set1_epi32(static_cast<int32_t>(position));
  const __mmask16 valid = static_cast<__mmask16>(_mm512_cmpgt_epi32_mask(limit, at) &
                                                 ~_mm512_cmpgt_epi32_mask(lower, at));
  return _mm512_mask_blend_ps(valid, fill, x);
}

/// r[i][j] becomes r[j][i] (a 16 x 16 transpose of 32-bit lanes: 4x4 within 128-bit lanes, then the
/// 4x4 grid of 128-bit blocks). permutex2var rather than unpacklo/hi_ps, whose GCC 12
/// headers trip -Wuninitialized.
inline void Transpose16x16(__m512* r) {
  const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 4, 20, 5, 21, 8, 24, 9, 25, 12, 28, 13, 29);
  const __m512i hi = _mm512_setr_epi32(2, 18, 3, 19, 6, 22, 7, 23, 10, 26, 11, 27, 14, 30, 15, 31);
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {  // per 128-bit lane: a0 b0 a1 b1 / a2 b2 a3 b3
    t[2 * i] = _mm512_permutex2var_ps(r[2 * i], lo, r[2 * i + 1]);
    t[2 * i + 1] = _mm512_permutex2var_ps(r[2 * i], hi, r[2 * i + 1]);
  }
  // x[4g + c], 128-bit lane L: column 4L + c of rows 4g .. 4g + 3.
  __m512 x[16];
  for (int g = 0; g < 4; ++g) {
    x[4 * g] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], _MM_SHUFFLE(1, 0, 1, 0));
    x[4 * g + 1] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], _MM_SHUFFLE(3, 2, 3, 2));
    x[4 * g + 2] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], _MM_SHUFFLE(1, 0, 1, 0));
    x[4 * g + 3] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  // Column 4L + c: lane L of x[c], x[4 + c], x[8 + c], x[12 + c].
  const __m512i low_halves =
      _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23);
  const __m512i high_halves = _mm512_add_epi32(low_halves, _mm512_set1_epi32(8));
  const __m512i even_blocks =
      _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
  const __m512i odd_blocks = _mm512_add_epi32(even_blocks, _mm512_set1_epi32(4));
  for (int c = 0; c < 4; ++c) {
    const __m512 u0 = _mm512_permutex2var_ps(x[c], low_halves, x[4 + c]);   // L0 L1 | L0 L1
    const __m512 u1 = _mm512_permutex2var_ps(x[c], high_halves, x[4 + c]);  // L2 L3 | L2 L3
    const __m512 u2 = _mm512_permutex2var_ps(x[8 + c], low_halves, x[12 + c]);
    const __m512 u3 = _mm512_permutex2var_ps(x[8 + c], high_halves, x[12 + c]);
    r[c] = _mm512_permutex2var_ps(u0, even_blocks, u2);
    r[4 + c] = _mm512_permutex2var_ps(u0, odd_blocks, u2);
    r[8 + c] = _mm512_permutex2var_ps(u1, even_blocks, u3);
    r[12 + c] = _mm512_permutex2var_ps(u1, odd_blocks, u3);
  }
}

}  // namespace loom::kernels::cpu::internal
