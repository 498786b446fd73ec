// AVX2 + FMA + F16C matmul kernels, compiled with -mavx2 -mfma -mf16c (see
// kernels/CMakeLists.txt) and only called after a run-time CPU check. A row block of 16
// weight rows is two 8-lane halves.

#include <immintrin.h>

#include <algorithm>

#include "kernels/cpu/matmul_internal.h"

namespace loom::kernels::cpu::internal {
namespace {

constexpr int kGemvBlocks = 2;
constexpr int kFloatMr = 4;
constexpr int kIntMr = 2;

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

// Rows [8 half, 8 half + 8) of columns c and c + 1 (c even) of a BF16 row block, one load:
// the dwords hold c's BF16 in their low halves (shifted up) and c + 1's in their high ones
// (masked).
inline void LoadBf16Pair(const uint8_t* base, int64_t c, int half, __m256& even, __m256& odd) {
  const __m256i pair =
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + Bf16Index(half * 8, c) * 2));
  even = _mm256_castsi256_ps(_mm256_slli_epi32(pair, 16));
  odd = _mm256_castsi256_ps(_mm256_and_si256(pair, _mm256_set1_epi32(-65536)));
}

// Rows [8 half, 8 half + 8) of column `col` of an F32 / F16 / BF16 row block (BF16: even
// columns only, FloatTile's tail).
template <WeightFormat kFormat>
inline __m256 LoadWeights(const uint8_t* base, int64_t col, int half) {
  if constexpr (kFormat == WeightFormat::kF16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(
        reinterpret_cast<const __m128i*>(base + (col * kRowBlock + half * 8) * 2)));
  } else if constexpr (kFormat == WeightFormat::kBf16) {
    __m256 even, odd;
    LoadBf16Pair(base, col, half, even, odd);
    return even;
  } else {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(base) + col * kRowBlock + half * 8);
  }
}

template <WeightFormat kFormat, int Mr, int Nb>
void FloatTile(const MatmulArgs& a, int64_t block0, int64_t token0) {
  const PackedWeight& w = *a.weight;
  const int64_t k = w.cols;
  const uint8_t* base[Nb];
  for (int j = 0; j < Nb; ++j) base[j] = KernelBlockData(a, block0 + j);
  const float* x = a.x + token0 * k;
  __m256 acc[Mr][Nb][2];
  for (int r = 0; r < Mr; ++r) {
    for (int j = 0; j < Nb; ++j) acc[r][j][0] = acc[r][j][1] = _mm256_setzero_ps();
  }
  // acc += column c's weights times x[, c].
  auto step = [&](const __m256(&wv)[Nb][2], int64_t c) {
    for (int r = 0; r < Mr; ++r) {
      const __m256 xv = _mm256_set1_ps(x[r * k + c]);
      for (int j = 0; j < Nb; ++j) {
        acc[r][j][0] = _mm256_fmadd_ps(wv[j][0], xv, acc[r][j][0]);
        acc[r][j][1] = _mm256_fmadd_ps(wv[j][1], xv, acc[r][j][1]);
      }
    }
  };
  int64_t c = 0;
  if constexpr (kFormat == WeightFormat::kBf16) {  // a column pair per load
    for (; c + 2 <= k; c += 2) {
      __m256 even[Nb][2], odd[Nb][2];
      for (int j = 0; j < Nb; ++j) {
        for (int h = 0; h < 2; ++h) LoadBf16Pair(base[j], c, h, even[j][h], odd[j][h]);
      }
      step(even, c);
      step(odd, c + 1);
    }
  }
  for (; c < k; ++c) {
    __m256 wv[Nb][2];
    for (int j = 0; j < Nb; ++j) {
      wv[j][0] = LoadWeights<kFormat>(base[j], c, 0);
      wv[j][1] = LoadWeights<kFormat>(base[j], c, 1);
    }
    step(wv, c);
  }
  for (int r = 0; r < Mr; ++r) {
    for (int j = 0; j < Nb; ++j) StoreOutput(acc[r][j][0], acc[r][j][1], a, block0 + j, token0 + r);
  }
}

inline int32_t LoadI32(const int8_t* p) {
  int32_t value;
  __builtin_memcpy(&value, p, 4);
  return value;
}

// u8 x s8 dot products of 4-byte lanes into int32 (maddubs pairs, then madd pairs). The
// u8 operand is at most 128 here, so the int16 pair sums cannot saturate.
inline __m256i Dot4(__m256i unsigned_bytes, __m256i signed_bytes, __m256i ones16) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(unsigned_bytes, signed_bytes), ones16);
}

// Same arithmetic as the AVX-512 kernel; INT8 weights use |q| and sign(x, q) instead of
// the offset form (no VNNI: maddubs would saturate on q + 128). kFormat is INT8, INT4 or
// INT5 (INT4 with each line's fifth bits ORed into its nibbles; q <= 31 keeps maddubs
// exact).
// NL4 runs as INT8 straight from its codes: INT8's lines 2 L and 2 L + 1 are the levels of
// code line L's low and high nibbles (a byte shuffle).
template <WeightFormat kFormat, int Mr, int Nb>
void IntTile(const MatmulArgs& a, int64_t block0, int64_t token0) {
  constexpr bool kNl4 = kFormat == WeightFormat::kNl4;
  constexpr bool kInt4 = kFormat != WeightFormat::kInt8 && !kNl4;
  constexpr bool kInt5 = kFormat == WeightFormat::kInt5;
  const PackedWeight& w = *a.weight;
  const int64_t k = w.cols;
  const int64_t x_groups = k / kActGroup;
  const int64_t scale_groups = k / w.group_size;
  const int64_t groups_per_scale = w.group_size / kActGroup;
  constexpr int kLinesPerGroup = kInt4 ? 4 : 8;
  const uint8_t* base[Nb];
  const uint16_t* scales[Nb];
  const uint16_t* mins[Nb];
  for (int j = 0; j < Nb; ++j) {
    base[j] = KernelBlockData(a, block0 + j);
    scales[j] = w.scales.data() + (block0 + j) * scale_groups * kRowBlock;
    mins[j] = kInt4 ? w.mins.data() + (block0 + j) * scale_groups * kRowBlock : nullptr;
  }
  const int8_t* xq = a.xq.q + token0 * k;
  const float* x_scale = a.xq.scale + token0 * x_groups;
  const int32_t* x_sum = a.xq.qsum + token0 * x_groups;
  const __m256i low_mask = _mm256_set1_epi8(0x0f);
  const __m256i fifth_bit = _mm256_set1_epi8(0x10);
  const __m256i sign_flip = _mm256_set1_epi8(static_cast<char>(0x80));
  const __m256i ones16 = _mm256_set1_epi16(1);
  const __m256i levels = _mm256_broadcastsi128_si256(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(w.levels.data())));
  __m256 acc[Mr][Nb][2];
  for (int r = 0; r < Mr; ++r) {
    for (int j = 0; j < Nb; ++j) acc[r][j][0] = acc[r][j][1] = _mm256_setzero_ps();
  }
  for (int64_t g = 0; g < x_groups; ++g) {
    __m256i dot[Mr][Nb][2];
    for (int r = 0; r < Mr; ++r) {
      for (int j = 0; j < Nb; ++j) dot[r][j][0] = dot[r][j][1] = _mm256_setzero_si256();
    }
    for (int line = 0; line < kLinesPerGroup; ++line) {
      for (int j = 0; j < Nb; ++j) {
        const uint8_t* p = kNl4 ? base[j] + (g * kLinesPerGroup + line) / 2 * 64
                                : base[j] + (g * kLinesPerGroup + line) * 64;
        for (int h = 0; h < 2; ++h) {
          __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + h * 32));
          if constexpr (kNl4) {  // the levels: INT8's q
            if (line % 2 == 1) bytes = _mm256_srli_epi16(bytes, 4);
            bytes = _mm256_shuffle_epi8(levels, _mm256_and_si256(bytes, low_mask));
          }
          if constexpr (kInt4) {
            __m256i lo = _mm256_and_si256(bytes, low_mask);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low_mask);
            if constexpr (kInt5) {
              const __m256i high = _mm256_srl_epi32(
                  _mm256_loadu_si256(
                      reinterpret_cast<const __m256i*>(base[j] + Int5HighOffset(k, h * 8, g))),
                  _mm_cvtsi32_si128(2 * line));
              lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi32(high, 4), fifth_bit));
              hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi32(high, 3), fifth_bit));
            }
            for (int r = 0; r < Mr; ++r) {
              const int8_t* xr = xq + r * k + g * kActGroup + line * 8;
              const __m256i x_lo = _mm256_set1_epi32(LoadI32(xr));
              const __m256i x_hi = _mm256_set1_epi32(LoadI32(xr + 4));
              dot[r][j][h] = _mm256_add_epi32(dot[r][j][h], Dot4(lo, x_lo, ones16));
              dot[r][j][h] = _mm256_add_epi32(dot[r][j][h], Dot4(hi, x_hi, ones16));
            }
          } else {
            const __m256i q = kNl4 ? bytes : _mm256_xor_si256(bytes, sign_flip);  // q + 128 -> q
            const __m256i q_abs = _mm256_abs_epi8(q);                 // -128 -> 128 as u8
            for (int r = 0; r < Mr; ++r) {
              const __m256i xv =
                  _mm256_set1_epi32(LoadI32(xq + r * k + g * kActGroup + line * 4));
              dot[r][j][h] =
                  _mm256_add_epi32(dot[r][j][h], Dot4(q_abs, _mm256_sign_epi8(xv, q), ones16));
            }
          }
        }
      }
    }
    const int64_t sg = (groups_per_scale == 1 ? g : g / groups_per_scale) * kRowBlock;
    for (int j = 0; j < Nb; ++j) {
      for (int h = 0; h < 2; ++h) {
        const __m256 scale = _mm256_cvtph_ps(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(scales[j] + sg + h * 8)));
        __m256 min = _mm256_setzero_ps();
        if constexpr (kInt4) {
          min = _mm256_cvtph_ps(
              _mm_loadu_si128(reinterpret_cast<const __m128i*>(mins[j] + sg + h * 8)));
        }
        for (int r = 0; r < Mr; ++r) {
          const __m256 xs = _mm256_set1_ps(x_scale[r * x_groups + g]);
          __m256 part;
          if constexpr (kInt4) {
            const __m256 sum = _mm256_set1_ps(static_cast<float>(x_sum[r * x_groups + g]));
            part = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[r][j][h]), scale, _mm256_mul_ps(min, sum));
          } else {
            part = _mm256_mul_ps(_mm256_cvtepi32_ps(dot[r][j][h]), scale);
          }
          acc[r][j][h] = _mm256_fmadd_ps(part, xs, acc[r][j][h]);
        }
      }
    }
  }
  for (int r = 0; r < Mr; ++r) {
    for (int j = 0; j < Nb; ++j) StoreOutput(acc[r][j][0], acc[r][j][1], a, block0 + j, token0 + r);
  }
}

template <WeightFormat kFormat>
void RunFloat(const MatmulArgs& a, int64_t block_begin, int64_t block_end) {
  if (a.m == 1) {
    int64_t b = block_begin;
    for (; b + kGemvBlocks <= block_end; b += kGemvBlocks)
      FloatTile<kFormat, 1, kGemvBlocks>(a, b, 0);
    for (; b < block_end; ++b) FloatTile<kFormat, 1, 1>(a, b, 0);
    return;
  }
  for (int64_t b = block_begin; b < block_end; ++b) {
    int64_t t = 0;
    for (; t + kFloatMr <= a.m; t += kFloatMr) FloatTile<kFormat, kFloatMr, 1>(a, b, t);
    switch (a.m - t) {
      case 3:
        FloatTile<kFormat, 3, 1>(a, b, t);
        break;
      case 2:
        FloatTile<kFormat, 2, 1>(a, b, t);
        break;
      case 1:
        FloatTile<kFormat, 1, 1>(a, b, t);
        break;
      default:
        break;
    }
  }
}

template <WeightFormat kFormat>
void RunInt(const MatmulArgs& a, int64_t block_begin, int64_t block_end) {
  for (int64_t b = block_begin; b < block_end; ++b) {
    int64_t t = 0;
    for (; t + kIntMr <= a.m; t += kIntMr) IntTile<kFormat, kIntMr, 1>(a, b, t);
    if (t < a.m) IntTile<kFormat, 1, 1>(a, b, t);
  }
}

}  // namespace

void ExpandNl4BlocksAvx2(const PackedWeight& w, int64_t block_begin, int64_t block_end,
                         uint8_t* out) {
  // ExpandNl4BlocksScalar's mapping: each 32 bytes of codes give the low nibbles' levels
  // (+ 128: XOR 0x80) at twice their offset and the high nibbles' 64 bytes further.
  const int64_t bytes = BlockDataBytes(WeightFormat::kNl4, w.cols);
  const uint8_t* src = w.data.data() + block_begin * bytes;
  const int64_t total = (block_end - block_begin) * bytes;
  const __m128i table = _mm_xor_si128(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(w.levels.data())), _mm_set1_epi8(-128));
  const __m256i lut = _mm256_broadcastsi128_si256(table);
  const __m256i low_mask = _mm256_set1_epi8(0x0f);
  for (int64_t i = 0; i < total; i += 64) {
    for (int h = 0; h < 2; ++h) {
      const __m256i codes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + h * 32));
      const __m256i lo = _mm256_shuffle_epi8(lut, _mm256_and_si256(codes, low_mask));
      const __m256i hi =
          _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(codes, 4), low_mask));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2 * i + h * 32), lo);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2 * i + 64 + h * 32), hi);
    }
  }
}

void MatmulBlocksAvx2(const MatmulArgs& a, int64_t block_begin, int64_t block_end) {
  switch (KernelFormat(a)) {
    case WeightFormat::kF32:
      RunFloat<WeightFormat::kF32>(a, block_begin, block_end);
      return;
    case WeightFormat::kF16:
      RunFloat<WeightFormat::kF16>(a, block_begin, block_end);
      return;
    case WeightFormat::kBf16:
      RunFloat<WeightFormat::kBf16>(a, block_begin, block_end);
      return;
    case WeightFormat::kInt8:
      RunInt<WeightFormat::kInt8>(a, block_begin, block_end);
      return;
    case WeightFormat::kInt4:
      RunInt<WeightFormat::kInt4>(a, block_begin, block_end);
      return;
    case WeightFormat::kInt5:
      RunInt<WeightFormat::kInt5>(a, block_begin, block_end);
      return;
    case WeightFormat::kNl4:
      RunInt<WeightFormat::kNl4>(a, block_begin, block_end);
      return;
  }
}

}  // namespace loom::kernels::cpu::internal
