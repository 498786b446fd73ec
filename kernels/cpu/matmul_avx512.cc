// AVX-512 (F, BW, VL, VNNI) matmul kernels. Compiled with -mavx512f -mavx512bw -mavx512vl
// -mavx512vnni -mf16c -mfma (kernels/CMakeLists.txt) and only called after a run-time
// CPU check, so nothing here may run on its own at static-initialization time.

#include <immintrin.h>
#include <unistd.h>

#include <algorithm>

#include "kernels/cpu/matmul_internal.h"
#include "kernels/cpu/matmul_store_avx512.h"

namespace loom::kernels::cpu::internal {
namespace {

// Tile shapes: kMr activation rows by kNb row blocks of 16 weight rows. A GEMV (m = 1)
// keeps several independent accumulator chains by walking 4 row blocks at once; a GEMM
// reuses every weight vector for kMr tokens from registers.
constexpr int kGemvBlocks = 4;
constexpr int kFloatMr = 8;
constexpr int kFloatNb = 2;
constexpr int kIntMr = 4;
constexpr int kIntNb = 2;
// Token rows of the int8-activation GEMM's tiles (MatmulInt8ActGemmBlocksAvx512): 6 rows
// (12 int32 and 12 float sums in the 32 registers) ran 5-20% slower than 4 (measured on
// Zen 4, 1536x576 to 2048x2048, m = 8..512).
constexpr int kGemmIntMr = 4;

// Columns c and c + 1 (c even) of a BF16 row block, one load: the line's dwords hold c's BF16
// in their low halves (shifted up) and c + 1's in their high ones (masked).
inline void LoadBf16Pair(const uint8_t* base, int64_t c, __m512& even, __m512& odd) {
  const __m512i pair = _mm512_loadu_si512(base + Bf16Index(0, c) * 2);
  even = _mm512_castsi512_ps(_mm512_slli_epi32(pair, 16));
  odd = _mm512_castsi512_ps(_mm512_and_si512(pair, _mm512_set1_epi32(-65536)));
}

// Column `col` of an F32 / F16 / BF16 row block (BF16: even columns only, FloatTile's tail).
template <WeightFormat kFormat>
inline __m512 LoadWeights(const uint8_t* base, int64_t col) {
  if constexpr (kFormat == WeightFormat::kF16) {
    return _mm512_cvtph_ps(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + col * kRowBlock * 2)));
  } else if constexpr (kFormat == WeightFormat::kBf16) {
    __m512 even, odd;
    LoadBf16Pair(base, col, even, odd);
    return even;
  } else {
    return _mm512_loadu_ps(reinterpret_cast<const float*>(base + col * kRowBlock * 4));
  }
}

// F32 / F16 / BF16 weights: acc[r][j] += W[block j, :, col] * x[r, col] over all columns, in
// column order (the same bits for the same values in any of the three).
template <WeightFormat kFormat, int Mr, int Nb>
void FloatTile(const MatmulArgs& a, int64_t block0, int64_t token0) {
  const PackedWeight& w = *a.weight;
  const int64_t k = w.cols;
  const uint8_t* base[Nb];
  for (int j = 0; j < Nb; ++j) base[j] = KernelBlockData(a, block0 + j);
  const float* x = a.x + token0 * k;
  __m512 acc[Mr][Nb];
  for (int r = 0; r < Mr; ++r) {
    for (int j = 0; j < Nb; ++j) acc[r][j] = _mm512_setzero_ps();
  }
  auto step = [&](const __m512(&wv)[Nb], int64_t c) {
    for (int r = 0; r < Mr; ++r) {
      const __m512 xv = _mm512_set1_ps(x[r * k + c]);
      for (int j = 0; j < Nb; ++j) acc[r][j] = _mm512_fmadd_ps(wv[j], xv, acc[r][j]);
    }
  };
  int64_t c = 0;
  if constexpr (kFormat == WeightFormat::kBf16) {  // a column pair per load
    for (; c + 2 <= k; c += 2) {
      __m512 even[Nb], odd[Nb];
      for (int j = 0; j < Nb; ++j) LoadBf16Pair(base[j], c, even[j], odd[j]);
      step(even, c);
      step(odd, c + 1);
    }
  }
  for (; c < k; ++c) {
    __m512 wv[Nb];
    for (int j = 0; j < Nb; ++j) wv[j] = LoadWeights<kFormat>(base[j], c);
    step(wv, c);
  }
  for (int r = 0; r < Mr; ++r) {
    for (int j = 0; j < Nb; ++j) StoreOutput(acc[r][j], a, block0 + j, token0 + r);
  }
}

inline int32_t LoadI32(const int8_t* p) {
  int32_t value;
  __builtin_memcpy(&value, p, 4);
  return value;
}

// INT8 / INT4 weights against int8 activations: per 32-column group, VNNI dot products
// of 16 rows x 4 columns per instruction into int32, then one float scaling per group:
//   INT4: y += x_scale * (w_scale * dot(q, xq) + w_min * sum(xq))
//   INT8: y += x_scale * w_scale * (dot(q + 128, xq) - 128 * sum(xq))
// INT5 is INT4 with each line's fifth bits ORed into its nibbles. kFormat is a
// WeightFormat (an int for TileTable).
template <int kFormat, int Mr, int Nb>
void IntTile(const MatmulArgs& a, int64_t block0, int64_t token0) {
  constexpr bool kInt4 = kFormat != static_cast<int>(WeightFormat::kInt8);
  constexpr bool kInt5 = kFormat == static_cast<int>(WeightFormat::kInt5);
  const PackedWeight& w = *a.weight;
  const int64_t k = w.cols;
  const int64_t x_groups = k / kActGroup;
  const int64_t scale_groups = k / w.group_size;
  const int64_t groups_per_scale = w.group_size / kActGroup;
  constexpr int kLinesPerGroup = kInt4 ? 4 : 8;  // 64-byte lines per 32 columns
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
  const __m512i low_mask = _mm512_set1_epi8(0x0f);
  const __m512i fifth_bit = _mm512_set1_epi8(0x10);
  __m512 acc[Mr][Nb];
  for (int r = 0; r < Mr; ++r) {
    for (int j = 0; j < Nb; ++j) acc[r][j] = _mm512_setzero_ps();
  }
  for (int64_t sg = 0; sg < scale_groups; ++sg) {
    __m512 scale[Nb], min[Nb];
    for (int j = 0; j < Nb; ++j) {
      scale[j] = _mm512_cvtph_ps(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales[j] + sg * kRowBlock)));
      if constexpr (kInt4) {
        min[j] = _mm512_cvtph_ps(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(mins[j] + sg * kRowBlock)));
      }
    }
    for (int64_t g = sg * groups_per_scale; g < (sg + 1) * groups_per_scale; ++g) {
      __m512i dot[Mr][Nb];
      for (int r = 0; r < Mr; ++r) {
        for (int j = 0; j < Nb; ++j) dot[r][j] = _mm512_setzero_si512();
      }
      const uint8_t* lines[Nb];
      for (int j = 0; j < Nb; ++j) lines[j] = base[j] + g * kLinesPerGroup * 64;
      for (int line = 0; line < kLinesPerGroup; ++line) {
        if constexpr (kInt4) {
          __m512i lo[Nb], hi[Nb];
          for (int j = 0; j < Nb; ++j) {
            const __m512i bytes = _mm512_loadu_si512(lines[j] + line * 64);
            lo[j] = _mm512_and_si512(bytes, low_mask);
            hi[j] = _mm512_and_si512(_mm512_srli_epi16(bytes, 4), low_mask);
            if constexpr (kInt5) {
              // lo | (high << 4 & 0x10) per byte, one ternary-logic op each (A | B & C).
              const __m512i high =
                  _mm512_srl_epi32(_mm512_loadu_si512(base[j] + Int5HighOffset(k, 0, g)),
                                   _mm_cvtsi32_si128(2 * line));
              lo[j] = _mm512_ternarylogic_epi32(lo[j], _mm512_slli_epi32(high, 4), fifth_bit, 0xf8);
              hi[j] = _mm512_ternarylogic_epi32(hi[j], _mm512_slli_epi32(high, 3), fifth_bit, 0xf8);
            }
          }
          for (int r = 0; r < Mr; ++r) {
            const int8_t* xr = xq + r * k + g * kActGroup + line * 8;
            const __m512i x_lo = _mm512_set1_epi32(LoadI32(xr));
            const __m512i x_hi = _mm512_set1_epi32(LoadI32(xr + 4));
            for (int j = 0; j < Nb; ++j) {
              dot[r][j] = _mm512_dpbusd_epi32(dot[r][j], lo[j], x_lo);
              dot[r][j] = _mm512_dpbusd_epi32(dot[r][j], hi[j], x_hi);
            }
          }
        } else {
          __m512i bytes[Nb];
          for (int j = 0; j < Nb; ++j) bytes[j] = _mm512_loadu_si512(lines[j] + line * 64);
          for (int r = 0; r < Mr; ++r) {
            const __m512i xv = _mm512_set1_epi32(LoadI32(xq + r * k + g * kActGroup + line * 4));
            for (int j = 0; j < Nb; ++j) dot[r][j] = _mm512_dpbusd_epi32(dot[r][j], bytes[j], xv);
          }
        }
      }
      for (int r = 0; r < Mr; ++r) {
        const __m512 xs = _mm512_set1_ps(x_scale[r * x_groups + g]);
        if constexpr (kInt4) {
          const __m512 sum = _mm512_set1_ps(static_cast<float>(x_sum[r * x_groups + g]));
          for (int j = 0; j < Nb; ++j) {
            const __m512 part = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[r][j]), scale[j],
                                                _mm512_mul_ps(min[j], sum));
            acc[r][j] = _mm512_fmadd_ps(part, xs, acc[r][j]);
          }
        } else {
          const __m512i offset = _mm512_set1_epi32(128 * x_sum[r * x_groups + g]);
          for (int j = 0; j < Nb; ++j) {
            const __m512 part =
                _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(dot[r][j], offset)), scale[j]);
            acc[r][j] = _mm512_fmadd_ps(part, xs, acc[r][j]);
          }
        }
      }
    }
  }
  for (int r = 0; r < Mr; ++r) {
    for (int j = 0; j < Nb; ++j) StoreOutput(acc[r][j], a, block0 + j, token0 + r);
  }
}

using TileFn = void (*)(const MatmulArgs&, int64_t, int64_t);

// Runtime (rows, blocks) -> compile-time tile, for tile edges.
template <template <int, int, int> class Kernel, int kFlag, int MaxMr, int MaxNb>
struct TileTable {
  TileFn fns[MaxMr + 1][MaxNb + 1] = {};
  constexpr TileTable() { Fill<1>(); }
  template <int Mr>
  constexpr void Fill() {
    if constexpr (Mr <= MaxMr) {
      FillNb<Mr, 1>();
      Fill<Mr + 1>();
    }
  }
  template <int Mr, int Nb>
  constexpr void FillNb() {
    if constexpr (Nb <= MaxNb) {
      fns[Mr][Nb] = &Kernel<kFlag, Mr, Nb>::Run;
      FillNb<Mr, Nb + 1>();
    }
  }
};

template <int kFormat, int Mr, int Nb>
struct FloatKernel {
  static void Run(const MatmulArgs& a, int64_t block0, int64_t token0) {
    FloatTile<static_cast<WeightFormat>(kFormat), Mr, Nb>(a, block0, token0);
  }
};
template <int kFormat, int Mr, int Nb>
struct IntKernel {
  static void Run(const MatmulArgs& a, int64_t block0, int64_t token0) {
    IntTile<kFormat, Mr, Nb>(a, block0, token0);
  }
};
constexpr int kF32Kernel = static_cast<int>(WeightFormat::kF32);
constexpr int kF16Kernel = static_cast<int>(WeightFormat::kF16);
constexpr int kBf16Kernel = static_cast<int>(WeightFormat::kBf16);
constexpr int kInt8Kernel = static_cast<int>(WeightFormat::kInt8);
constexpr int kInt4Kernel = static_cast<int>(WeightFormat::kInt4);
constexpr int kInt5Kernel = static_cast<int>(WeightFormat::kInt5);

constexpr int kMaxMr = kFloatMr > kIntMr ? kFloatMr : kIntMr;
constexpr int kMaxNb = kGemvBlocks;

// Tokens [t0, t1) (all of them by default) over row blocks [block_begin, block_end).
template <template <int, int, int> class Kernel, int kFlag>
void RunTiles(const MatmulArgs& a, int64_t block_begin, int64_t block_end, int mr, int nb,
              int64_t t0 = 0, int64_t t1 = -1) {
  static constexpr TileTable<Kernel, kFlag, kMaxMr, kMaxNb> table;
  if (t1 < 0) t1 = a.m;
  if (t1 - t0 == 1) {
    mr = 1;
    nb = kGemvBlocks;
  }
  // Balanced row tiles: m = 17 with mr 8 runs 6 + 6 + 5, not 8 + 8 + 1.
  const int64_t num_tiles = (t1 - t0 + mr - 1) / mr;
  // No software prefetch of the next blocks: the hardware prefetchers follow these
  // sequential streams, and prefetcht1 per line cost 9% of batched decode (measured).
  for (int64_t b = block_begin; b < block_end; b += nb) {
    const int nb_here = static_cast<int>(std::min<int64_t>(nb, block_end - b));
    for (int64_t tile = 0, t = t0; tile < num_tiles; ++tile) {
      const int64_t t_end = t0 + (t1 - t0) * (tile + 1) / num_tiles;
      table.fns[t_end - t][nb_here](a, b, t);
      t = t_end;
    }
  }
}

// Bytes of quantized activations a token panel of the int8-activation GEMM may hold: half
// the L2 (sysconf), 256 KiB when the C library does not know it.
int64_t TokenPanelBytes() {
  static const int64_t bytes = [] {
    const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return l2 > 0 ? static_cast<int64_t>(l2) / 2 : int64_t{256} << 10;
  }();
  return bytes;
}

// The int8-activation GEMM over tokens [t0, t1): token panels that stay in L2 while the
// thread's row blocks pass over them, kGemmIntMr x kIntNb VNNI tiles inside (IntTile: the
// same bits as the tile path, whatever the tiling).
template <int kFormat>
void RunIntGemm(const MatmulArgs& a, int64_t block_begin, int64_t block_end, int64_t t0,
                int64_t t1) {
  const int64_t k = a.weight->cols;
  const int64_t panel_tokens = std::max<int64_t>(kGemmIntMr, TokenPanelBytes() / k);
  const int64_t num_panels = (t1 - t0 + panel_tokens - 1) / panel_tokens;
  for (int64_t p = 0; p < num_panels; ++p) {
    RunTiles<IntKernel, kFormat>(a, block_begin, block_end, kGemmIntMr, kIntNb,
                                 t0 + (t1 - t0) * p / num_panels,
                                 t0 + (t1 - t0) * (p + 1) / num_panels);
  }
}

}  // namespace

// Bit-identical to QuantizeActivationRows: the same float operations, and cvtps_epi32
// rounds to nearest even like the scalar version.
void QuantizeActivationRowsAvx512(const float* x, int64_t num_rows, int64_t k, int8_t* q,
                                  float* scale, int32_t* qsum) {
  const int64_t groups = k / kActGroup;
  for (int64_t row = 0; row < num_rows; ++row) {
    for (int64_t g = 0; g < groups; ++g) {
      const float* src = x + row * k + g * kActGroup;
      const __m512 v0 = _mm512_loadu_ps(src), v1 = _mm512_loadu_ps(src + 16);
      const float amax = _mm512_reduce_max_ps(
          _mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
      const float inverse = amax > 0.0f ? 127.0f / amax : 0.0f;
      const __m512 inv = _mm512_set1_ps(inverse);
      const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, inv));
      const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, inv));
      int8_t* dst = q + row * k + g * kActGroup;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm512_cvtepi32_epi8(q0));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 16), _mm512_cvtepi32_epi8(q1));
      scale[row * groups + g] = amax / 127.0f;
      qsum[row * groups + g] = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
    }
  }
}

void MatmulInt8ActGemmTokensAvx512(const MatmulArgs& a, int64_t block_begin, int64_t block_end,
                                   int64_t t0, int64_t t1) {
  if (t1 <= t0) return;
  switch (KernelFormat(a)) {
    case WeightFormat::kInt4:
      RunIntGemm<kInt4Kernel>(a, block_begin, block_end, t0, t1);
      return;
    case WeightFormat::kInt5:
      RunIntGemm<kInt5Kernel>(a, block_begin, block_end, t0, t1);
      return;
    default:
      RunIntGemm<kInt8Kernel>(a, block_begin, block_end, t0, t1);
      return;
  }
}

void MatmulInt8ActGemmBlocksAvx512(const MatmulArgs& a, int64_t block_begin, int64_t block_end) {
  MatmulInt8ActGemmTokensAvx512(a, block_begin, block_end, 0, a.m);
}

void MatmulBlocksAvx512(const MatmulArgs& a, int64_t block_begin, int64_t block_end) {
  switch (KernelFormat(a)) {
    case WeightFormat::kF32:
      RunTiles<FloatKernel, kF32Kernel>(a, block_begin, block_end, kFloatMr, kFloatNb);
      return;
    case WeightFormat::kF16:
      RunTiles<FloatKernel, kF16Kernel>(a, block_begin, block_end, kFloatMr, kFloatNb);
      return;
    case WeightFormat::kBf16:
      RunTiles<FloatKernel, kBf16Kernel>(a, block_begin, block_end, kFloatMr, kFloatNb);
      return;
    case WeightFormat::kInt8:
      RunTiles<IntKernel, kInt8Kernel>(a, block_begin, block_end, kIntMr, kIntNb);
      return;
    case WeightFormat::kInt4:
      RunTiles<IntKernel, kInt4Kernel>(a, block_begin, block_end, kIntMr, kIntNb);
      return;
    case WeightFormat::kInt5:
      RunTiles<IntKernel, kInt5Kernel>(a, block_begin, block_end, kIntMr, kIntNb);
      return;
    case WeightFormat::kNl4:  // read as INT8 (KernelFormat)
      return;
  }
}

}  // namespace loom::kernels::cpu::internal
