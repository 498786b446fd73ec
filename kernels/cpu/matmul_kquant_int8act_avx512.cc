// AVX-512 VNNI kernel of matmul_kquant_int8act.cc (the same bits): a 64-byte line of a row
// block is 16 rows x 4 INT8 columns (q + 128) or 16 rows x 8 INT4 columns (two nibbles), so
// one vpdpbusd per 4 columns adds every row's unsigned-weight x signed-activation products;
// INT8's offset comes off once per group (128 * xsum). Tokens run one at a time over a row
// block, whose bytes stay in L1/L2 between them. Compiled with -mavx512f -mavx512bw
// -mavx512vl -mavx512vnni -mfma (kernels/CMakeLists.txt); called after a run-time check.

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/matmul_internal.h"

namespace loom::kernels::cpu::internal {
namespace {

inline __m512i Broadcast4(const int8_t* x) {
  int32_t four;
  std::memcpy(&four, x, 4);
  return _mm512_set1_epi32(four);
}

template <bool kInt8>
void Run(const MatmulArgs& a, int64_t block_begin, int64_t block_end, int64_t t_begin,
         int64_t t_end) {
  const PackedWeight& w = *a.weight;
  const int64_t k = w.cols, n = w.rows, group = w.group_size;
  const int64_t block_bytes = BlockDataBytes(w.format, k);
  const int64_t groups = k / group;
  constexpr int64_t kColsPerLine = kInt8 ? 4 : 8;
  const __m512i low_nibbles = _mm512_set1_epi8(0x0f);
  for (int64_t b = block_begin; b < block_end; ++b) {
    const uint8_t* data = w.data.data() + b * block_bytes;
    const int64_t valid = std::min<int64_t>(kRowBlock, n - b * kRowBlock);
    const __mmask16 mask = static_cast<__mmask16>((1u << valid) - 1);
    const __m512 bias = a.bias != nullptr ? _mm512_maskz_loadu_ps(mask, a.bias + b * kRowBlock)
                                          : _mm512_setzero_ps();
    for (int64_t t = t_begin; t < t_end; ++t) {
      const int8_t* xq = a.xq.q + t * k;
      __m512 acc = _mm512_setzero_ps();
      for (int64_t g = 0; g < groups; ++g) {
        __m512i dot = _mm512_setzero_si512();
        for (int64_t line = g * group / kColsPerLine; line < (g + 1) * group / kColsPerLine;
             ++line) {
          const __m512i bytes = _mm512_loadu_si512(data + line * 64);
          const int8_t* x = xq + line * kColsPerLine;
          if constexpr (kInt8) {
            dot = _mm512_dpbusd_epi32(dot, bytes, Broadcast4(x));
          } else {
            dot = _mm512_dpbusd_epi32(dot, _mm512_and_si512(bytes, low_nibbles), Broadcast4(x));
            dot = _mm512_dpbusd_epi32(
                dot, _mm512_and_si512(_mm512_srli_epi16(bytes, 4), low_nibbles), Broadcast4(x + 4));
          }
        }
        const int32_t xsum = GroupActivationSum(a, t, g * group, group);
        if constexpr (kInt8) dot = _mm512_sub_epi32(dot, _mm512_set1_epi32(128 * xsum));
        const int64_t index = (b * groups + g) * kRowBlock;
        const __m512 p = _mm512_fmadd_ps(
            _mm512_loadu_ps(w.mins_f32.data() + index), _mm512_set1_ps(static_cast<float>(xsum)),
            _mm512_mul_ps(_mm512_cvtepi32_ps(dot), _mm512_loadu_ps(w.scales_f32.data() + index)));
        acc = _mm512_fmadd_ps(
            p, _mm512_set1_ps(a.xq.scale[t * (k / a.xq_group) + g * group / a.xq_group]), acc);
      }
      _mm512_mask_storeu_ps(a.y + t * n + b * kRowBlock, mask, _mm512_add_ps(acc, bias));
    }
  }
}

}  // namespace

void MatmulKQuantInt8ActTokensAvx512(const MatmulArgs& a, int64_t block_begin, int64_t block_end,
                                     int64_t t_begin, int64_t t_end) {
  if (a.weight->format == WeightFormat::kInt8) {
    Run<true>(a, block_begin, block_end, t_begin, t_end);
  } else {
    Run<false>(a, block_begin, block_end, t_begin, t_end);
  }
}

void MatmulKQuantInt8ActBlocksAvx512(const MatmulArgs& a, int64_t block_begin, int64_t block_end) {
  MatmulKQuantInt8ActTokensAvx512(a, block_begin, block_end, 0, a.m);
}

}  // namespace loom::kernels::cpu::internal
