#pragma once

// Internal to kernels/cpu: the AMX-BF16 B-tile row shared by the AMX-BF16 kernels
// (matmul_bf16act_amx.cc, paged_attention_amx.cc). Include only from translation units
// compiled with -mavx512bf16 -mavx512bw (kernels/CMakeLists.txt), and call only after a
// run-time CPU check.

#include <immintrin.h>

namespace loom::kernels::cpu::internal {

/// One B-tile row from two 16-float vectors: lane r holds the BF16 of (even[r], odd[r]) (each
/// rounded to nearest even), interleaved. A B tile's row is one pair of its k values for 16
/// columns: a column pair of 16 weight rows in the GEMM, two positions' V values for 16 head
/// dims in attention.
inline __m512i PairUp(__m512 even, __m512 odd) {
  const __m512i interleave =
      _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                       21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  // cvtne2ps_pbh(a, b): elements 0-15 from b, 16-31 from a.
  const __m512i both = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(odd, even));
  return _mm512_permutexvar_epi16(interleave, both);
}

}  // namespace loom::kernels::cpu::internal
