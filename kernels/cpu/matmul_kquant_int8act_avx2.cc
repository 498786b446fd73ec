// AVX2 kernel of matmul_kquant_int8act.cc (the same bits). Each half of a 64-byte line is 8
// rows x 4 columns; vpmaddubsw multiplies unsigned by signed bytes into int16 pairs and
// vpmaddwd adds the pairs into one int32 per row. INT4 nibbles (0..15) go in as they are;
// INT8 q goes in as |q| with the activation taking q's sign (|q| <= 128, so a pair stays
// below 2 * 128 * 127 < 2^15). Compiled with -mavx2 -mfma (kernels/CMakeLists.txt); called
// after a run-time check.

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/matmul_internal.h"

namespace loom::kernels::cpu::internal {
namespace {

inline __m256i Broadcast4(const int8_t* x) {
  int32_t four;
  std::memcpy(&four, x, 4);
  return _mm256_set1_epi32(four);
}

// Per row (dword), the sum of 4 unsigned-by-signed byte products.
inline __m256i Dot4(__m256i unsigned_bytes, __m256i signed_bytes) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(unsigned_bytes, signed_bytes),
                           _mm256_set1_epi16(1));
}

template <bool kInt8>
void Run(const MatmulArgs& a, int64_t block_begin, int64_t block_end) {
  const PackedWeight& w = *a.weight;
  const int64_t k = w.cols, n = w.rows, group = w.group_size;
  const int64_t block_bytes = BlockDataBytes(w.format, k);
  const int64_t groups = k / group;
  constexpr int64_t kColsPerLine = kInt8 ? 4 : 8;
  const __m256i low_nibbles = _mm256_set1_epi8(0x0f);
  const __m256i sign_flip = _mm256_set1_epi8(static_cast<char>(0x80));
  for (int64_t b = block_begin; b < block_end; ++b) {
    const uint8_t* data = w.data.data() + b * block_bytes;
    const int64_t valid = std::min<int64_t>(kRowBlock, n - b * kRowBlock);
    for (int64_t t = 0; t < a.m; ++t) {
      const int8_t* xq = a.xq.q + t * k;
      __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
      for (int64_t g = 0; g < groups; ++g) {
        __m256i dot[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
        for (int64_t line = g * group / kColsPerLine; line < (g + 1) * group / kColsPerLine;
             ++line) {
          const int8_t* x = xq + line * kColsPerLine;
          for (int h = 0; h < 2; ++h) {
            const __m256i bytes =
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(data + line * 64 + h * 32));
            if constexpr (kInt8) {
              const __m256i q = _mm256_xor_si256(bytes, sign_flip);
              dot[h] = _mm256_add_epi32(
                  dot[h], Dot4(_mm256_sign_epi8(q, q), _mm256_sign_epi8(Broadcast4(x), q)));
            } else {
              dot[h] = _mm256_add_epi32(dot[h],
                                        Dot4(_mm256_and_si256(bytes, low_nibbles), Broadcast4(x)));
              dot[h] = _mm256_add_epi32(
                  dot[h], Dot4(_mm256_and_si256(_mm256_srli_epi16(bytes, 4), low_nibbles),
                               Broadcast4(x + 4)));
            }
          }
        }
        const int32_t xsum = GroupActivationSum(a, t, g * group, group);
        const __m256 xsum_v = _mm256_set1_ps(static_cast<float>(xsum));
        const __m256 x_scale =
            _mm256_set1_ps(a.xq.scale[t * (k / a.xq_group) + g * group / a.xq_group]);
        const int64_t index = (b * groups + g) * kRowBlock;
        for (int h = 0; h < 2; ++h) {
          const __m256 p = _mm256_fmadd_ps(
              _mm256_loadu_ps(w.mins_f32.data() + index + h * 8), xsum_v,
              _mm256_mul_ps(_mm256_cvtepi32_ps(dot[h]),
                            _mm256_loadu_ps(w.scales_f32.data() + index + h * 8)));
          acc[h] = _mm256_fmadd_ps(p, x_scale, acc[h]);
        }
      }
      alignas(32) float lanes[kRowBlock];
      _mm256_store_ps(lanes, acc[0]);
      _mm256_store_ps(lanes + 8, acc[1]);
      StoreBlockOutput(lanes, a.bias ? a.bias + b * kRowBlock : nullptr, valid,
                       a.y + t * n + b * kRowBlock);
    }
  }
}

}  // namespace

void MatmulKQuantInt8ActBlocksAvx2(const MatmulArgs& a, int64_t block_begin, int64_t block_end) {
  if (a.weight->format == WeightFormat::kInt8) {
    Run<true>(a, block_begin, block_end);
  } else {
    Run<false>(a, block_begin, block_end);
  }
}

}  // namespace loom::kernels::cpu::internal
