// AVX2 inner loop of PagedAttention (compiled with -mavx2 -mfma -mf16c, see
// kernels/CMakeLists.txt); called only after a run-time CPU check, for head dims that are
// a multiple of 8 (others take the scalar loop). The scalar loop's online softmax, one
// head at a time, with the q·k dot products and the V accumulation on 8-lane FMAs.

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu/paged_attention_internal.h"
#include "kernels/cpu/paged_attention_tiled.h"
#include "kernels/cpu/vector_math_avx2.h"

namespace loom::kernels::cpu::internal {
namespace {

constexpr int64_t kChunk = 32;

// 8 int8 codes as float (exact).
inline __m256 Int8ToFloat8(const void* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(static_cast<const __m128i*>(p))));
}

// 8 E4M3 codes as float, 2^-8 of their value (KvDecodeFactor): each code sign-extended to
// 16 bits and shifted left 7 puts its exponent and mantissa where F16 keeps them and its
// sign in bit 15 (bit 14, a copy of the sign, is cleared), exact F16 for every code but NaN.
inline __m256 Fp8ToFloat8(const void* p) {
  const __m128i wide = _mm_cvtepi8_epi16(_mm_loadl_epi64(static_cast<const __m128i*>(p)));
  return _mm256_cvtph_ps(
      _mm_and_si128(_mm_slli_epi16(wide, 7), _mm_set1_epi16(static_cast<short>(0xbfff))));
}

// 8 BF16 values as float (exact: the bits become the high half of each lane).
inline __m256 Bf16ToFloat8(const uint16_t* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(
      _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
}

// Elements [index, index + 8) of a K or V pool as float (8-bit codes unscaled).
template <KvDtype kDtype>
inline __m256 Load8(const void* base, int64_t index) {
  if constexpr (kDtype == KvDtype::kF16) {
    return _mm256_cvtph_ps(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + index)));
  } else if constexpr (kDtype == KvDtype::kBf16) {
    return Bf16ToFloat8(static_cast<const uint16_t*>(base) + index);
  } else if constexpr (kDtype == KvDtype::kF32) {
    return _mm256_loadu_ps(static_cast<const float*>(base) + index);
  } else if constexpr (kDtype == KvDtype::kInt8) {
    return Int8ToFloat8(static_cast<const int8_t*>(base) + index);
  } else {
    return Fp8ToFloat8(static_cast<const uint8_t*>(base) + index);
  }
}

inline float HorizontalSum(__m256 v) {
  __m128 sum = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  sum = _mm_add_ps(sum, _mm_movehl_ps(sum, sum));
  sum = _mm_add_ss(sum, _mm_movehdup_ps(sum));
  return _mm_cvtss_f32(sum);
}

// 8-bit KV: a position's K scale multiplies its score and its V scale its weight (the
// tiled kernel's file comment says why).
template <KvDtype kDtype>
void Attend(const KvLayerView& cache, float scale, const AttentionTask& task) {
  constexpr bool kQuantized = IsQuantizedKv(kDtype);
  const float decode = KvDecodeFactor(kDtype);
  const int64_t d = cache.head_dim, bs = cache.block_size, vecs = d / 8;
  for (int64_t h = 0; h < task.num_heads; ++h) {
    const float* q = task.q + h * d;
    alignas(32) float acc[kMaxHeadDim];
    std::fill(acc, acc + d, 0.0f);
    float running_max = -std::numeric_limits<float>::infinity();
    float denominator = 0.0f;
    float scores[kChunk];
    for (int64_t pos = LowerLimit(task, 0); pos < task.attend_len;) {
      const int64_t block = task.blocks[pos / bs];
      const int64_t count = std::min({kChunk, bs - pos % bs, task.attend_len - pos});
      const int64_t slot0 = block * bs + pos % bs;
      float chunk_max = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < count; ++j) {
        const int64_t head = (slot0 + j) * cache.num_kv_heads + task.kv_head;
        const int64_t base = head * d;
        __m256 dot0 = _mm256_setzero_ps(), dot1 = _mm256_setzero_ps();
        int64_t v = 0;
        for (; v + 2 <= vecs; v += 2) {
          dot0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + v * 8), Load8<kDtype>(cache.k, base + v * 8),
                                 dot0);
          dot1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + v * 8 + 8),
                                 Load8<kDtype>(cache.k, base + v * 8 + 8), dot1);
        }
        if (v < vecs) {
          dot0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + v * 8), Load8<kDtype>(cache.k, base + v * 8),
                                 dot0);
        }
        float score_scale = scale;
        if constexpr (kQuantized) {
          score_scale *= decode * Bf16ToFloat(cache.k_scale[head]);
        }
        scores[j] = HorizontalSum(_mm256_add_ps(dot0, dot1)) * score_scale;
        chunk_max = std::max(chunk_max, scores[j]);
      }
      const float new_max = std::max(running_max, chunk_max);
      const float correction = std::exp(running_max - new_max);  // 0 on the first chunk
      denominator *= correction;
      const __m256 correction8 = _mm256_set1_ps(correction);
      for (int64_t v = 0; v < vecs; ++v) {
        _mm256_store_ps(acc + v * 8, _mm256_mul_ps(_mm256_load_ps(acc + v * 8), correction8));
      }
      for (int64_t j = 0; j < count; ++j) {
        const float weight = std::exp(scores[j] - new_max);
        denominator += weight;
        const int64_t head = (slot0 + j) * cache.num_kv_heads + task.kv_head;
        const int64_t base = head * d;
        const __m256 weight8 = _mm256_set1_ps(
            kQuantized ? weight * (decode * Bf16ToFloat(cache.v_scale[head])) : weight);
        for (int64_t v = 0; v < vecs; ++v) {
          _mm256_store_ps(acc + v * 8,
                          _mm256_fmadd_ps(weight8, Load8<kDtype>(cache.v, base + v * 8),
                                          _mm256_load_ps(acc + v * 8)));
        }
      }
      running_max = new_max;
      pos += count;
    }
    const __m256 inverse = _mm256_set1_ps(1.0f / WithSink(task, h, denominator, running_max));
    for (int64_t v = 0; v < vecs; ++v) {
      _mm256_storeu_ps(task.out + h * d + v * 8, _mm256_mul_ps(_mm256_load_ps(acc + v * 8), inverse));
    }
  }
}

// e^x on 8 lanes (the polynomial of Exp512 in vector_math_avx512.h, with 2^n built in the
// exponent bits): within a few ulp for x in [-87, 88]; x < -87 gives +0 (e^x < 2^-125
// there), x > 88 saturates at e^88; NaN stays NaN.
inline __m256 Exp256(__m256 x) {
  const __m256 underflow = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_LT_OQ);
  x = _mm256_max_ps(_mm256_set1_ps(-87.0f), _mm256_min_ps(_mm256_set1_ps(88.0f), x));
  const auto [n, p] = ExpReduce256(x);
  // n in [-126, 127]: 2^n is a normal float.
  const __m256i bits = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(underflow, _mm256_mul_ps(p, _mm256_castsi256_ps(bits)));
}

// The vector ISA of paged_attention_tiled.h: 8 lanes, 16 registers.
struct Avx2Vectors {
  static constexpr int kLanes = 8;
  static constexpr int kQkVecs = 2;       // scores: 2 x 4 accumulators,
  static constexpr int kQkPositions = 4;  // 2 loads and 4 broadcasts per 8 FMAs
  static constexpr int kPvQueries = 2;    // outputs: 2 x 4 accumulators and 4 V vectors,
  static constexpr int kPvVecs = 4;       // 4 loads and 2 broadcasts per 8 FMAs
  using Vec = __m256;
  static Vec Zero() { return _mm256_setzero_ps(); }
  static Vec Load(const float* p) { return _mm256_loadu_ps(p); }
  static void Store(float* p, Vec x) { _mm256_storeu_ps(p, x); }
  static Vec Set1(float x) { return _mm256_set1_ps(x); }
  static Vec Broadcast(const float* p) { return _mm256_broadcast_ss(p); }
  static Vec Fmadd(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
  static Vec Mul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
  static Vec Add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
  static Vec Sub(Vec a, Vec b) { return _mm256_sub_ps(a, b); }
  static Vec Max(Vec a, Vec b) { return _mm256_max_ps(a, b); }
  static Vec Exp(Vec x) { return Exp256(x); }
  static __m256i LoadLimit(const int32_t* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  }
  // Lanes whose limit <= position or whose lower > position take `fill`.
  static Vec MaskOutside(Vec x, __m256i lower, __m256i limit, int64_t position, Vec fill) {
    const __m256i at = _mm256_set1_epi32(static_cast<int32_t>(position));
    const __m256i valid =
        _mm256_andnot_si256(_mm256_cmpgt_epi32(lower, at), _mm256_cmpgt_epi32(limit, at));
    return _mm256_blendv_ps(fill, x, _mm256_castsi256_ps(valid));
  }
  // r[i][j] becomes r[j][i] (an 8 x 8 transpose).
  static void Transpose(Vec* r) {
    __m256 t[8], x[8];
    for (int i = 0; i < 4; ++i) {
      t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    // x[4h + c], 128-bit lane L: column 4L + c of rows 4h .. 4h + 3.
    for (int h = 0; h < 2; ++h) {
      x[4 * h] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], _MM_SHUFFLE(1, 0, 1, 0));
      x[4 * h + 1] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], _MM_SHUFFLE(3, 2, 3, 2));
      x[4 * h + 2] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], _MM_SHUFFLE(1, 0, 1, 0));
      x[4 * h + 3] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int c = 0; c < 4; ++c) {
      r[c] = _mm256_permute2f128_ps(x[c], x[4 + c], 0x20);
      r[4 + c] = _mm256_permute2f128_ps(x[c], x[4 + c], 0x31);
    }
  }
  static Vec LoadHalf(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static Vec LoadBf16(const uint16_t* p) { return Bf16ToFloat8(p); }
  static Vec LoadInt8(const int8_t* p) { return Int8ToFloat8(p); }
  static Vec LoadFp8(const uint8_t* p) { return Fp8ToFloat8(p); }
};

}  // namespace

void AttendTileAvx2(const KvLayerView& cache, float scale, const AttentionTask& tile) {
  WithKvDtype(cache.dtype, [&](auto dtype) {
    tiled::TileKernel<Avx2Vectors, decltype(dtype)::value>::Run(cache, scale, tile);
  });
}

void AttendAvx2(const KvLayerView& cache, float scale, const AttentionTask& task) {
  if (cache.head_dim % 8 != 0) return AttendScalar(cache, scale, task);
  WithKvDtype(cache.dtype, [&](auto dtype) { Attend<decltype(dtype)::value>(cache, scale, task); });
}

void RotateRowsAvx2(float* rows, int64_t count, int64_t n) {
  // In-vector stages h = 1, 2, 4: x[j] = a + b and x[j + h] = a - b as one FMA against the
  // partner lanes, x * (+-1) + partner (exact products, so the bits of the scalar a + b,
  // a - b).
  const __m256 signs1 = _mm256_setr_ps(1, -1, 1, -1, 1, -1, 1, -1);
  const __m256 signs2 = _mm256_setr_ps(1, 1, -1, -1, 1, 1, -1, -1);
  const __m256 signs4 = _mm256_setr_ps(1, 1, 1, 1, -1, -1, -1, -1);
  const __m256 norm = _mm256_set1_ps(1.0f / std::sqrt(static_cast<float>(n)));
  for (int64_t r = 0; r < count; ++r) {
    float* x = rows + r * n;
    for (int64_t i = 0; i < n; i += 8) {
      __m256 v = _mm256_loadu_ps(x + i);
      v = _mm256_fmadd_ps(v, signs1, _mm256_permute_ps(v, _MM_SHUFFLE(2, 3, 0, 1)));
      v = _mm256_fmadd_ps(v, signs2, _mm256_permute_ps(v, _MM_SHUFFLE(1, 0, 3, 2)));
      v = _mm256_fmadd_ps(v, signs4, _mm256_permute2f128_ps(v, v, 1));
      _mm256_storeu_ps(x + i, v);
    }
    for (int64_t h = 8; h < n; h *= 2) {
      for (int64_t i = 0; i < n; i += 2 * h) {
        for (int64_t j = i; j < i + h; j += 8) {
          const __m256 a = _mm256_loadu_ps(x + j), b = _mm256_loadu_ps(x + j + h);
          _mm256_storeu_ps(x + j, _mm256_add_ps(a, b));
          _mm256_storeu_ps(x + j + h, _mm256_sub_ps(a, b));
        }
      }
    }
    for (int64_t i = 0; i < n; i += 8) {
      _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), norm));
    }
  }
}

void QuantizeKvRowAvx2(KvDtype dtype, const float* x, int64_t n, void* codes, uint16_t* scale) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 amax = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 8) {
    // max_ps returns its second operand when the first is NaN: NaNs are skipped.
    amax = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + i), abs_mask), amax);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, amax);
  float m = 0.0f;
  for (float lane : lanes) m = lane > m ? lane : m;
  *scale = KvRowScale(dtype, m);
  const float s = Bf16ToFloat(*scale);
  const __m256 inverse = _mm256_set1_ps(s > 0.0f ? 1.0f / s : 0.0f);
  uint8_t* out = static_cast<uint8_t*>(codes);
  for (int64_t i = 0; i < n; i += 8) {
    __m256 q = _mm256_mul_ps(_mm256_loadu_ps(x + i), inverse);
    __m256i code;
    if (dtype == KvDtype::kInt8) {
      q = _mm256_and_ps(q, _mm256_cmp_ps(q, q, _CMP_ORD_Q));  // NaN -> 0
      q = _mm256_min_ps(_mm256_max_ps(q, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f));
      code = _mm256_cvtps_epi32(q);  // to nearest even, as RoundToInt
    } else {                         // FloatToFp8E4m3, lane by lane
      const __m256i bits = _mm256_castps_si256(q);
      const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(bits, 24), _mm256_set1_epi32(0x80));
      const __m256i abs = _mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff));
      const __m256i nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000));
      const __m256i big = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x43dfffff));
      const __m256i small = _mm256_cmpgt_epi32(_mm256_set1_epi32(0x3c800000), abs);
      const __m256i subnormal =
          _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_castsi256_ps(abs), _mm256_set1_ps(512.0f)));
      const __m256i rounded =
          _mm256_add_epi32(_mm256_add_epi32(abs, _mm256_set1_epi32(0x7ffff)),
                           _mm256_and_si256(_mm256_srli_epi32(abs, 20), _mm256_set1_epi32(1)));
      __m256i normal =
          _mm256_sub_epi32(_mm256_srli_epi32(rounded, 20), _mm256_set1_epi32(120 << 3));
      normal = _mm256_min_epi32(normal, _mm256_set1_epi32(0x7e));
      code = _mm256_blendv_epi8(normal, subnormal, small);
      code = _mm256_blendv_epi8(code, _mm256_set1_epi32(0x7e), big);
      code = _mm256_blendv_epi8(code, _mm256_set1_epi32(0x7f), nan);
      code = _mm256_or_si256(code, sign);
    }
    // 8 x int32 in [-127, 255] to 8 bytes (int8 codes two's complement, E4M3 codes as is).
    const __m128i words =
        _mm_packs_epi32(_mm256_castsi256_si128(code), _mm256_extracti128_si256(code, 1));
    const __m128i bytes =
        dtype == KvDtype::kInt8 ? _mm_packs_epi16(words, words) : _mm_packus_epi16(words, words);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out + i), bytes);
  }
}

void FloatToBf16Avx2(const float* src, int64_t count, uint16_t* dst) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  const __m256i exponent = _mm256_set1_epi32(0x7f800000);
  const __m256i zero = _mm256_setzero_si256();
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m256i bits = _mm256_castps_si256(_mm256_loadu_ps(src + i));
    const __m256i high = _mm256_srli_epi32(bits, 16);
    // Nearest even: add 0x7fff plus the kept part's lowest bit, keep the high half.
    const __m256i rounded = _mm256_srli_epi32(
        _mm256_add_epi32(bits, _mm256_add_epi32(_mm256_set1_epi32(0x7fff),
                                                _mm256_and_si256(high, _mm256_set1_epi32(1)))),
        16);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(bits, abs_mask), exponent);
    const __m256i subnormal = _mm256_cmpeq_epi32(_mm256_and_si256(bits, exponent), zero);
    __m256i out = _mm256_blendv_epi8(rounded, _mm256_or_si256(high, _mm256_set1_epi32(0x40)), nan);
    out = _mm256_blendv_epi8(out, _mm256_and_si256(high, _mm256_set1_epi32(0x8000)), subnormal);
    // Lanes hold values <= 0xffff, so the unsigned saturating pack keeps them; it interleaves
    // 128-bit halves, which the permute puts back in order.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(out, out), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm256_castsi256_si128(packed));
  }
  for (; i < count; ++i) dst[i] = FloatToBf16(src[i]);
}

void FloatToHalfAvx2(const float* src, int64_t count, uint16_t* dst) {
  constexpr int kRounding = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), kRounding));
  }
  if (i < count) {
    alignas(32) float tail[8] = {};
    alignas(16) uint16_t halves[8];
    std::copy(src + i, src + count, tail);
    _mm_store_si128(reinterpret_cast<__m128i*>(halves), _mm256_cvtps_ph(_mm256_load_ps(tail), kRounding));
    std::copy(halves, halves + (count - i), dst + i);
  }
}

}  // namespace loom::kernels::cpu::internal
