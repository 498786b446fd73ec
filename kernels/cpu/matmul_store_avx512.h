#pragma once

// The AVX-512 matmul kernels' output store (one 16-row block of one token, bias added, the
// tail of a partial block masked). Included only by files compiled with AVX-512 flags.

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/matmul_internal.h"

namespace loom::kernels::cpu::internal {

inline void StoreOutput(__m512 acc, const MatmulArgs& a, int64_t block, int64_t token) {
  const int64_t n = a.weight->rows;
  const int64_t row0 = block * kRowBlock;
  float* y = a.y + token * n + row0;
  const int64_t valid = std::min<int64_t>(kRowBlock, n - row0);
  if (valid == kRowBlock) {
    if (a.bias != nullptr) acc = _mm512_add_ps(acc, _mm512_loadu_ps(a.bias + row0));
    _mm512_storeu_ps(y, acc);
  } else {
    const __mmask16 mask = static_cast<__mmask16>((1u << valid) - 1);
    if (a.bias != nullptr) acc = _mm512_add_ps(acc, _mm512_maskz_loadu_ps(mask, a.bias + row0));
    _mm512_mask_storeu_ps(y, mask, acc);
  }
}

}  // namespace loom::kernels::cpu::internal
