// AVX2 inner loop of SiluMul (compiled with -mavx2 -mfma, see kernels/CMakeLists.txt);
// called only after a run-time CPU check.

#include <immintrin.h>

#include "kernels/cpu/activation_internal.h"
#include "kernels/cpu/vector_math_avx2.h"

namespace loom::kernels::cpu::internal {
namespace {

// e^x on 8 float lanes: the AVX-512 Exp512 (vector_math_avx512.h) step for step, so within
// 2 ulp over the whole float range, with its saturation (x <= -104 gives +0, x >= 89 gives
// +Inf; NaN stays NaN). AVX2 has no vscalefps: p * 2^n is two exact-exponent multiplies,
// p * 2^(n/2) (exact: a normal result) then * 2^(n - n/2), which rounds once, so overflow to
// Inf and gradual underflow to subnormals and zero match scalef's.
inline __m256 Exp256(__m256 x) {
  x = _mm256_max_ps(_mm256_set1_ps(-104.0f), _mm256_min_ps(_mm256_set1_ps(89.0f), x));
  const auto [n, p] = ExpReduce256(x);
  // n in [-150, 128]: both halves in [-75, 64], so each 2^half is a normal float. A NaN
  // x gives a NaN n, whose conversion (0x80000000) gives a finite factor: p stays NaN.
  const __m256i n_int = _mm256_cvtps_epi32(n);
  const __m256i half = _mm256_srai_epi32(n_int, 1);
  const __m256i rest = _mm256_sub_epi32(n_int, half);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 scale1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, bias), 23));
  const __m256 scale2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(rest, bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, scale1), scale2);
}

// silu(g) * up = g / (1 + e^-g) * up in the scalar kernel's order (see the AVX-512 span).
inline __m256 SiluMul8(__m256 gate, __m256 up) {
  const __m256 denominator =
      _mm256_add_ps(_mm256_set1_ps(1.0f), Exp256(_mm256_sub_ps(_mm256_setzero_ps(), gate)));
  return _mm256_mul_ps(_mm256_div_ps(gate, denominator), up);
}

}  // namespace

void SiluMulSpanAvx2(const float* gate, const float* up, int64_t count, float* out) {
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    _mm256_storeu_ps(out + i, SiluMul8(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
  }
  if (i < count) {
    alignas(32) float g[8] = {}, u[8] = {}, o[8];
    for (int64_t j = i; j < count; ++j) g[j - i] = gate[j], u[j - i] = up[j];
    _mm256_store_ps(o, SiluMul8(_mm256_load_ps(g), _mm256_load_ps(u)));
    for (int64_t j = i; j < count; ++j) out[j] = o[j - i];
  }
}

}  // namespace loom::kernels::cpu::internal
