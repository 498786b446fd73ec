// AVX-512 inner loop of SiluMul (compiled with -mavx512f, see kernels/CMakeLists.txt);
// called only after a run-time CPU check.

#include <immintrin.h>

#include "kernels/cpu/activation_internal.h"
#include "kernels/cpu/vector_math_avx512.h"

namespace loom::kernels::cpu::internal {
namespace {

// silu(g) * up = g / (1 + e^-g) * up, rounded in the scalar kernel's order: dividing
// before multiplying keeps g = -90, up = 1e38 at -0 rather than -Inf / Inf = NaN.
inline __m512 SiluMul16(__m512 gate, __m512 up) {
  const __m512 denominator =
      _mm512_add_ps(_mm512_set1_ps(1.0f), Exp512(_mm512_sub_ps(_mm512_setzero_ps(), gate)));
  return _mm512_mul_ps(_mm512_div_ps(gate, denominator), up);
}

}  // namespace

void SiluMulSpanAvx512(const float* gate, const float* up, int64_t count, float* out) {
  int64_t i = 0;
  for (; i + 16 <= count; i += 16) {
    _mm512_storeu_ps(out + i, SiluMul16(_mm512_loadu_ps(gate + i), _mm512_loadu_ps(up + i)));
  }
  if (i < count) {
    const __mmask16 tail = static_cast<__mmask16>((1u << (count - i)) - 1);
    _mm512_mask_storeu_ps(
        out + i, tail,
        SiluMul16(_mm512_maskz_loadu_ps(tail, gate + i), _mm512_maskz_loadu_ps(tail, up + i)));
  }
}

}  // namespace loom::kernels::cpu::internal
