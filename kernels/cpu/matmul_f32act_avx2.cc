// AVX2 + FMA + F16C kernels for INT8/INT4 weights against float activations, compiled
// with -mavx2 -mfma -mf16c (kernels/CMakeLists.txt) and only called after a run-time CPU
// check. A row block of 16 weight rows is two 8-lane halves (32 bytes of each line).
//
// A column's value sits in a fixed bit field of each row's dword (see
// matmul_f32act_avx512.cc). Here it is moved to the top of the dword with zeros below,
// so the int32 conversion is exact and the group scale carries the power of two:
//   INT4: bytes XOR 0x88 make each nibble the 4-bit two's complement of q - 8, giving
//         (q - 8) * 2^28;
//   INT8: bytes XOR 0x80 give int8 q, giving q * 2^24.

#include <immintrin.h>

#include <algorithm>
#include <utility>

#include "kernels/cpu/matmul_internal.h"

namespace loom::kernels::cpu::internal {
namespace {

constexpr int kGemvBlocks = 2;
constexpr int kGemmMr = 2;

inline void StoreOutput(__m256 lo, __m256 hi, const MatmulArgs& a, int64_t block, int64_t token) {
  const int64_t n = a.weight->rows;
  const int64_t row0 = block * kRowBlock;
  float* y = a.y + token * n + row0;
  const int64_t valid = std::min<int64_t>(kRowBlock, n - row0);
  if (valid == kRowBlock) {
    if (a.bias != nullptr) {
      lo = _mm256_add_ps(lo, _mm256_loadu_ps(a.bias + row0));
      hi = _mm256_add_ps(hi, _mm256_loadu_ps(a.bias + row0 + 8));
    }
    _mm256_storeu_ps(y, lo);
    _mm256_storeu_ps(y + 8, hi);
  } else {
    alignas(32) float lanes[kRowBlock];
    _mm256_store_ps(lanes, lo);
    _mm256_store_ps(lanes + 8, hi);
    StoreBlockOutput(lanes, a.bias ? a.bias + row0 : nullptr, valid, y);
  }
}

template <typename F, int... kJ>
inline void Unrolled(F&& f, std::integer_sequence<int, kJ...>) {
  (f(std::integral_constant<int, kJ>{}), ...);
}

// Column kCol of a line whose fields are kBits wide (4: INT4, 8: INT8), already made
// signed, as float value * 2^(32 - kBits).
template <int kBits, int kCol>
inline __m256 Column(__m256i signed_fields) {
  constexpr int kShift = kBits == 4 ? 8 * (kCol % 4) + 4 * (kCol / 4) : 8 * kCol;
  constexpr int kToTop = 32 - kBits - kShift;
  const __m256i top = _mm256_set1_epi32(static_cast<int>(~0u << (32 - kBits)));
  __m256i field;
  if constexpr (kToTop == 0) {
    field = _mm256_and_si256(signed_fields, top);
  } else if constexpr (kShift == 0) {
    field = _mm256_slli_epi32(signed_fields, kToTop);
  } else {
    field = _mm256_and_si256(_mm256_slli_epi32(signed_fields, kToTop), top);
  }
  return _mm256_cvtepi32_ps(field);
}

template <bool kInt4, int Mr, int Nb>
void Tile(const MatmulArgs& a, int64_t block0, int64_t token0) {
  constexpr int kBits = kInt4 ? 4 : 8;
  constexpr int kColsPerLine = kInt4 ? 8 : 4;
  const PackedWeight& w = *a.weight;
  const int64_t k = w.cols;
  const int64_t group = w.group_size;
  const int64_t scale_groups = k / group;
  const int64_t lines_per_group = group / kColsPerLine;
  const uint8_t* base[Nb];
  const uint16_t* scales[Nb];
  const uint16_t* mins[Nb];
  for (int j = 0; j < Nb; ++j) {
    base[j] = KernelBlockData(a, block0 + j);
    scales[j] = w.scales.data() + (block0 + j) * scale_groups * kRowBlock;
    mins[j] = kInt4 ? w.mins.data() + (block0 + j) * scale_groups * kRowBlock : nullptr;
  }
  const float* x = a.x + token0 * k;
  const float* x_sum = kInt4 ? a.x_group_sum + token0 * scale_groups : nullptr;
  const __m256i sign_flip = _mm256_set1_epi8(static_cast<char>(kInt4 ? 0x88 : 0x80));
  const __m256 value_unit =
      _mm256_set1_ps(kInt4 ? 1.0f / 268435456.0f : 1.0f / 16777216.0f);  // 2^-28, 2^-24

  __m256 acc[Mr][Nb][2];
  for (int r = 0; r < Mr; ++r) {
    for (int j = 0; j < Nb; ++j) acc[r][j][0] = acc[r][j][1] = _mm256_setzero_ps();
  }
  for (int64_t sg = 0; sg < scale_groups; ++sg) {
    __m256 group_acc[Mr][Nb][2];
    for (int r = 0; r < Mr; ++r) {
      for (int j = 0; j < Nb; ++j) group_acc[r][j][0] = group_acc[r][j][1] = _mm256_setzero_ps();
    }
    for (int64_t line = sg * lines_per_group; line < (sg + 1) * lines_per_group; ++line) {
      __m256i fields[Nb][2];
      for (int j = 0; j < Nb; ++j) {
        for (int h = 0; h < 2; ++h) {
          fields[j][h] = _mm256_xor_si256(
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base[j] + line * 64 + h * 32)),
              sign_flip);
        }
      }
      const float* xc = x + line * kColsPerLine;
      Unrolled(
          [&](auto col_constant) {
            constexpr int kCol = decltype(col_constant)::value;
            for (int j = 0; j < Nb; ++j) {
              for (int h = 0; h < 2; ++h) {
                const __m256 wv = Column<kBits, kCol>(fields[j][h]);
                for (int r = 0; r < Mr; ++r) {
                  group_acc[r][j][h] =
                      _mm256_fmadd_ps(wv, _mm256_broadcast_ss(xc + r * k + kCol), group_acc[r][j][h]);
                }
              }
            }
          },
          std::make_integer_sequence<int, kColsPerLine>{});
    }
    for (int j = 0; j < Nb; ++j) {
      for (int h = 0; h < 2; ++h) {
        const int64_t index = sg * kRowBlock + h * 8;
        const __m256 raw_scale =
            _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scales[j] + index)));
        const __m256 scale = _mm256_mul_ps(raw_scale, value_unit);
        __m256 centred_min = _mm256_setzero_ps();
        if constexpr (kInt4) {
          const __m256 min =
              _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(mins[j] + index)));
          centred_min = _mm256_fmadd_ps(raw_scale, _mm256_set1_ps(8.0f), min);
        }
        for (int r = 0; r < Mr; ++r) {
          acc[r][j][h] = _mm256_fmadd_ps(group_acc[r][j][h], scale, acc[r][j][h]);
          if constexpr (kInt4) {
            acc[r][j][h] = _mm256_fmadd_ps(
                centred_min, _mm256_set1_ps(x_sum[r * scale_groups + sg]), acc[r][j][h]);
          }
        }
      }
    }
  }
  for (int r = 0; r < Mr; ++r) {
    for (int j = 0; j < Nb; ++j) StoreOutput(acc[r][j][0], acc[r][j][1], a, block0 + j, token0 + r);
  }
}

template <bool kInt4>
void Run(const MatmulArgs& a, int64_t block_begin, int64_t block_end) {
  if (a.m == 1) {
    int64_t b = block_begin;
    for (; b + kGemvBlocks <= block_end; b += kGemvBlocks) Tile<kInt4, 1, kGemvBlocks>(a, b, 0);
    for (; b < block_end; ++b) Tile<kInt4, 1, 1>(a, b, 0);
    return;
  }
  for (int64_t b = block_begin; b < block_end; ++b) {
    int64_t t = 0;
    for (; t + kGemmMr <= a.m; t += kGemmMr) Tile<kInt4, kGemmMr, 1>(a, b, t);
    if (t < a.m) Tile<kInt4, 1, 1>(a, b, t);
  }
}

}  // namespace

void MatmulF32ActBlocksAvx2(const MatmulArgs& a, int64_t block_begin, int64_t block_end) {
  if (KernelFormat(a) == WeightFormat::kInt4) {
    Run<true>(a, block_begin, block_end);
  } else {
    Run<false>(a, block_begin, block_end);
  }
}

}  // namespace loom::kernels::cpu::internal
