// The int8-activation GEMMs on AMX (Intel Sapphire Rapids and later): the F16-scaled
// formats' (MatmulInt8ActGemmBlocksAmx) and the K-quants' (MatmulKQuantInt8ActBlocksAmx),
// one body with the depth of a product and the float step chosen by format. Compiled with the
// AVX-512 flags plus -mamx-tile -mamx-int8 (kernels/CMakeLists.txt) and only called when
// ActiveCpuIsa() is kAmx (cpuid and the kernel's permission checked), so nothing here may
// run at static-initialization time.
//
// A row block's packed bytes are already AMX's B-tile layout: each 64-byte line holds 16
// weight rows x 4 consecutive columns, which is one B row of a 16-column tile. So one
// 32-column group of 16 tokens x 16 weight rows is
//   C (16 x 16 int32) = A (16 tokens x 32 int8, signed) . B (8 lines of 64 bytes, unsigned)
// in one TDPBSUD: INT8 weights read in place (offset binary, q + 128, as VNNI takes them),
// INT4/INT5 codes widened to bytes once per call into the thread's scratch (a panel of
// row blocks at a time). Each group's exact int32 dot products are then applied with
// IntTile's float operations in its order (matmul_avx512.cc), so the result is the AVX-512
// kernels' bits, for every m: a token's output does not depend on whether it fell in a
// 16-token tile or the remainder (batch invariance).
//
// The activation scale's group (32 columns) bounds this kernel: every TDPBSUD (K = 32, half
// the unit's depth) is followed by a tile store of 16 x 16 int32 and 16 rows of float steps
// (~5 AVX-512 operations each). Measured on a 2-core Xeon with AMX (cpu_kernels_bench
// --section a8gemm, 1 thread, weights in cache): 1.31-1.60x the VNNI GEMM at m = 64-256,
// 0.07-0.085 of the AMX unit's int8 peak (TDPBSUD at K = 64) in the same run. The K-quants
// run one product per weight group (16, 32 or 64 columns) with their kernel's float step
// (matmul_kquant_int8act_avx512.cc), the same way.

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/amx_tile_config.h"
#include "kernels/cpu/matmul_internal.h"
#include "kernels/cpu/matmul_store_avx512.h"

namespace loom::kernels::cpu::internal {
namespace {

// Tiles: four C tiles (tmm0-3, the int32 results of groups g % 4), A in tmm4-5 (16 tokens'
// activations of a group, by g % 2), B in tmm6-7 (a row block's group, depth / 4 lines). Step g
// applies group g - 1's stored results on AVX-512, stores group g's (the tile unit runs in
// order, so this waits for its product only) and issues group g + 3: three products run
// while the core works, and no load of a result sits right behind the tile store that
// wrote it (a group's product, store and float step would otherwise follow one another;
// measured: 1.0-1.2x the VNNI GEMM with one group in flight, ~1.4x like this). GCC's tile
// intrinsics paste their operand into the assembly text, so the tile numbers are literals.
constexpr int kSlots = 4;  // C tiles in flight
constexpr int kLookahead = kSlots - 1;
constexpr int kTokens = 16;  // A rows: tokens per tile

// `depth`: columns per product (a group: 16, 32 or 64), A's bytes per row and 4x B's rows.
void ConfigureTiles(int depth) {
  AmxTileConfig config;
  for (int c = 0; c < 4; ++c) {
    config.rows[c] = kTokens;
    config.colsb[c] = kRowBlock * 4;
  }
  for (int t = 4; t < 6; ++t) {
    config.rows[t] = kTokens;
    config.colsb[t] = static_cast<uint16_t>(depth);
  }
  for (int t = 6; t < 8; ++t) {
    config.rows[t] = static_cast<uint8_t>(depth / 4);
    config.colsb[t] = 64;
  }
  LoadTileConfig(config);
}

// C = A (signed) . B (unsigned) for one group: A from `x` (16 rows `stride` apart), B from
// `lines` (depth / 4 lines).
#define LOOM_AMX_GROUP(c, a, b, x, stride, lines) \
  do {                                            \
    _tile_zero(c);                                \
    _tile_loadd(a, x, stride);                    \
    _tile_loadd(b, lines, 64);                    \
    _tile_dpbsud(c, a, b);                        \
  } while (0)

// Issues group g (`depth` columns) of 16 tokens into C tile g % 4 (A and B tiles alternate
// by g % 2).
inline void IssueGroup(const int8_t* xq, int64_t k, const uint8_t* lines, int64_t depth,
                       int64_t g) {
  const int8_t* x = xq + g * depth;
  const uint8_t* w = lines + g * depth / 4 * 64;
  switch (g % kSlots) {
    case 0:
      LOOM_AMX_GROUP(0, 4, 6, x, k, w);
      break;
    case 1:
      LOOM_AMX_GROUP(1, 5, 7, x, k, w);
      break;
    case 2:
      LOOM_AMX_GROUP(2, 4, 6, x, k, w);
      break;
    default:
      LOOM_AMX_GROUP(3, 5, 7, x, k, w);
      break;
  }
}

#undef LOOM_AMX_GROUP

// Stores group g's C tile (g % 4) to `dots`.
inline void StoreGroup(int64_t g, int32_t* dots) {
  switch (g % kSlots) {
    case 0:
      _tile_stored(0, dots, kRowBlock * 4);
      break;
    case 1:
      _tile_stored(1, dots, kRowBlock * 4);
      break;
    case 2:
      _tile_stored(2, dots, kRowBlock * 4);
      break;
    default:
      _tile_stored(3, dots, kRowBlock * 4);
      break;
  }
}

// INT4/INT5 row block -> INT8's layout, one code per byte (0..15 / 0..31): INT4 line l
// (columns 8 l .. 8 l + 7) gives INT8 lines 2 l (its low nibbles) and 2 l + 1 (high).
template <bool kInt5>
void WidenBlock(const uint8_t* data, int64_t cols, uint8_t* out) {
  const __m512i low_mask = _mm512_set1_epi8(0x0f);
  const __m512i fifth_bit = _mm512_set1_epi8(0x10);
  for (int64_t l = 0; l < cols / 8; ++l) {
    const __m512i bytes = _mm512_loadu_si512(data + l * 64);
    __m512i lo = _mm512_and_si512(bytes, low_mask);
    __m512i hi = _mm512_and_si512(_mm512_srli_epi16(bytes, 4), low_mask);
    if constexpr (kInt5) {  // as IntTile ORs them in (matmul_avx512.cc)
      const __m512i high =
          _mm512_srl_epi32(_mm512_loadu_si512(data + Int5HighOffset(cols, 0, l / 4)),
                           _mm_cvtsi32_si128(2 * (l % 4)));
      lo = _mm512_ternarylogic_epi32(lo, _mm512_slli_epi32(high, 4), fifth_bit, 0xf8);
      hi = _mm512_ternarylogic_epi32(hi, _mm512_slli_epi32(high, 3), fifth_bit, 0xf8);
    }
    _mm512_storeu_si512(out + 2 * l * 64, lo);
    _mm512_storeu_si512(out + (2 * l + 1) * 64, hi);
  }
}

// One token's int32 `dots` (16 rows) of a group applied to `acc` with the float operations
// of the AVX-512 kernel this one matches, in its order:
//   F16-scaled (IntTile, matmul_avx512.cc): INT4 fma(fma(dot, scale, min * sum), xs, acc),
//     `term` float(sum); INT8 fma((dot - term) * scale, xs, acc), `term` 128 * sum;
//   K-quants (matmul_kquant_int8act_avx512.cc): fma(fma(min, sum, dot' * scale), xs, acc),
//     `term` float(sum), dot' = dot - `offset` (128 * sum) for INT8.
template <bool kInt4, bool kKQuant>
inline __m512 ApplyGroup(__m512 acc, const int32_t* dots, float x_scale, int32_t term,
                         int32_t offset, __m512 scale, __m512 min) {
  __m512i dot = _mm512_load_si512(dots);
  const __m512 xs = _mm512_set1_ps(x_scale);
  if constexpr (kKQuant) {
    if constexpr (!kInt4) dot = _mm512_sub_epi32(dot, _mm512_set1_epi32(offset));
    const __m512 sum = _mm512_castsi512_ps(_mm512_set1_epi32(term));  // float(sum)
    const __m512 p = _mm512_fmadd_ps(min, sum, _mm512_mul_ps(_mm512_cvtepi32_ps(dot), scale));
    return _mm512_fmadd_ps(p, xs, acc);
  } else if constexpr (kInt4) {
    const __m512 sum = _mm512_castsi512_ps(_mm512_set1_epi32(term));  // float(sum)
    const __m512 part = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, _mm512_mul_ps(min, sum));
    return _mm512_fmadd_ps(part, xs, acc);
  } else {
    const __m512i sub = _mm512_set1_epi32(term);  // 128 * sum
    const __m512 part = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(dot, sub)), scale);
    return _mm512_fmadd_ps(part, xs, acc);
  }
}

// The K-quant kernel's output store: the bias (or zeros) added, masked to the block's rows.
inline void StoreKQuantOutput(__m512 acc, const MatmulArgs& a, int64_t block, int64_t token) {
  const int64_t n = a.weight->rows;
  const int64_t valid = std::min<int64_t>(kRowBlock, n - block * kRowBlock);
  const __mmask16 mask = static_cast<__mmask16>((1u << valid) - 1);
  const __m512 bias = a.bias != nullptr ? _mm512_maskz_loadu_ps(mask, a.bias + block * kRowBlock)
                                        : _mm512_setzero_ps();
  _mm512_mask_storeu_ps(a.y + token * n + block * kRowBlock, mask, _mm512_add_ps(acc, bias));
}

// The 16 accumulators of a token tile are 16 named variables, not an array: the tile
// instructions' memory clobbers would keep an array in memory (a load and a store per row
// and group, beside the tile store's 16).
#define LOOM_AMX_ROWS(X) \
  X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15)

// Tokens [0, tokens) (a multiple of kTokens) over row blocks [block_begin, block_end), one
// product per `depth` columns: the activation group (32) for F16-scaled weights, the weight
// group (16, 32 or 64) for the K-quants' F32-scaled ones.
template <int kFormat, bool kKQuant>
void AmxGemm(const MatmulArgs& a, int64_t block_begin, int64_t block_end, int64_t tokens) {
  constexpr bool kInt4 = kFormat != static_cast<int>(WeightFormat::kInt8);
  constexpr bool kInt5 = kFormat == static_cast<int>(WeightFormat::kInt5);
  const PackedWeight& w = *a.weight;
  const int64_t k = w.cols;
  const int64_t depth = kKQuant ? w.group_size : kActGroup;
  const int64_t groups = k / depth;
  // F16-scaled: a weight scale spans groups_per_scale groups.
  const int64_t groups_per_scale = kKQuant ? 1 : w.group_size / kActGroup;
  const int64_t scale_groups = k / w.group_size;
  // Row blocks run in panels of about 256 KiB of (widened) weights, which stay in L2 while
  // every token tile passes over them; a token tile's activations (16 x k bytes) stay in L1
  // across the panel's blocks.
  const int64_t wide_block_bytes = k * kRowBlock;
  const int64_t panel_blocks = std::max<int64_t>(1, (int64_t{256} << 10) / wide_block_bytes);
  uint8_t* wide = kInt4 ? reinterpret_cast<uint8_t*>(ThreadScratch(
                              std::min(panel_blocks, block_end - block_begin) * k * kRowBlock / 4))
                        : nullptr;
  alignas(64) int32_t dots[2][kTokens * kRowBlock];
  for (int64_t b0 = block_begin; b0 < block_end; b0 += panel_blocks) {
    const int64_t b1 = std::min(block_end, b0 + panel_blocks);
    if constexpr (kInt4) {
      for (int64_t b = b0; b < b1; ++b) {
        WidenBlock<kInt5>(KernelBlockData(a, b), k, wide + (b - b0) * wide_block_bytes);
      }
    }
    for (int64_t t0 = 0; t0 < tokens; t0 += kTokens) {
      for (int64_t b = b0; b < b1; ++b) {
        const uint8_t* lines = kInt4 ? wide + (b - b0) * wide_block_bytes : KernelBlockData(a, b);
        const int8_t* xq = a.xq.q + t0 * k;
        const float* x_scale = a.amx_scales + t0 * groups;
        const int32_t* terms = a.amx_terms + t0 * groups;
        const int32_t* offsets = a.amx_offsets != nullptr ? a.amx_offsets + t0 * groups : terms;
#define LOOM_AMX_DECLARE(r) __m512 acc##r = _mm512_setzero_ps();
        LOOM_AMX_ROWS(LOOM_AMX_DECLARE)
#undef LOOM_AMX_DECLARE
        for (int64_t g = 0; g < std::min<int64_t>(kLookahead, groups); ++g) {
          IssueGroup(xq, k, lines, depth, g);
        }
        // The pipeline above: apply g - 1, store g, issue g + 3.
        int64_t sg = 0, sg_end = groups_per_scale;  // weight scale group of g - 1
        for (int64_t g = 0; g <= groups; ++g) {
          if (g > 0) {
            const int64_t applied = g - 1;
            if (applied == sg_end) {
              ++sg;
              sg_end += groups_per_scale;
            }
            const int64_t index = (b * scale_groups + sg) * kRowBlock;
            __m512 scale, min = _mm512_setzero_ps();
            if constexpr (kKQuant) {
              scale = _mm512_loadu_ps(w.scales_f32.data() + index);
              min = _mm512_loadu_ps(w.mins_f32.data() + index);
            } else {
              scale = _mm512_cvtph_ps(
                  _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.scales.data() + index)));
              if constexpr (kInt4) {
                min = _mm512_cvtph_ps(
                    _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.mins.data() + index)));
              }
            }
            const int32_t* group_dots = dots[applied % 2];
            const float* xs = x_scale + applied * kTokens;
            const int32_t* ts = terms + applied * kTokens;
            const int32_t* os = offsets + applied * kTokens;
#define LOOM_AMX_APPLY(r)                                                                      \
  acc##r = ApplyGroup<kInt4, kKQuant>(acc##r, group_dots + (r)*kRowBlock, xs[r], ts[r], os[r], \
                                      scale, min);
            LOOM_AMX_ROWS(LOOM_AMX_APPLY)
#undef LOOM_AMX_APPLY
          }
          if (g < groups) {
            StoreGroup(g, dots[g % 2]);
            if (g + kLookahead < groups) IssueGroup(xq, k, lines, depth, g + kLookahead);
          }
        }
#define LOOM_AMX_STORE(r)                      \
  if constexpr (kKQuant) {                     \
    StoreKQuantOutput(acc##r, a, b, t0 + (r)); \
  } else {                                     \
    StoreOutput(acc##r, a, b, t0 + (r));       \
  }
        LOOM_AMX_ROWS(LOOM_AMX_STORE)
#undef LOOM_AMX_STORE
      }
    }
  }
}

#undef LOOM_AMX_ROWS

}  // namespace

void PrepareAmxActivations(MatmulArgs& a) {
  const PackedWeight& w = *a.weight;
  const bool kquant = w.f32_scaled();
  // The format the kernel will read: NL4 is widened to INT8 only inside Matmul's threads.
  const bool int4 = w.format == WeightFormat::kInt4 || w.format == WeightFormat::kInt5;
  const int64_t k = w.cols;
  const int64_t depth = kquant ? w.group_size : kActGroup;
  const int64_t groups = k / depth;
  const int64_t tokens = a.m / kTokens * kTokens;
  // The values the matched kernel computes in registers: INT8 F16-scaled takes 128 * sum as
  // its term, the others float(sum) (bits in an int32); K-quant INT8 also 128 * sum as its
  // offset.
  thread_local std::vector<float> scales;
  thread_local std::vector<int32_t> terms, offsets;
  const bool with_offsets = kquant && !int4;
  scales.resize(static_cast<size_t>(tokens * groups));
  terms.resize(static_cast<size_t>(tokens * groups));
  offsets.resize(with_offsets ? static_cast<size_t>(tokens * groups) : 0);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t to = ((t / kTokens) * groups + g) * kTokens + t % kTokens;
      int32_t sum;
      if (kquant) {
        sum = GroupActivationSum(a, t, g * depth, depth);
        scales[to] = a.xq.scale[t * (k / a.xq_group) + g * depth / a.xq_group];
      } else {
        sum = a.xq.qsum[t * groups + g];
        scales[to] = a.xq.scale[t * groups + g];
      }
      if (with_offsets) offsets[to] = 128 * sum;
      if (int4 || kquant) {
        const float sum_f = static_cast<float>(sum);
        std::memcpy(&terms[to], &sum_f, sizeof(sum_f));
      } else {
        terms[to] = 128 * sum;
      }
    }
  }
  a.amx_scales = scales.data();
  a.amx_terms = terms.data();
  a.amx_offsets = with_offsets ? offsets.data() : nullptr;
}

void MatmulInt8ActGemmBlocksAmx(const MatmulArgs& a, int64_t block_begin, int64_t block_end) {
  const int64_t full = a.m / kTokens * kTokens;
  if (full > 0) {
    ConfigureTiles(kActGroup);
    switch (KernelFormat(a)) {
      case WeightFormat::kInt4:
        AmxGemm<static_cast<int>(WeightFormat::kInt4), false>(a, block_begin, block_end, full);
        break;
      case WeightFormat::kInt5:
        AmxGemm<static_cast<int>(WeightFormat::kInt5), false>(a, block_begin, block_end, full);
        break;
      default:
        AmxGemm<static_cast<int>(WeightFormat::kInt8), false>(a, block_begin, block_end, full);
        break;
    }
    _tile_release();
  }
  MatmulInt8ActGemmTokensAvx512(a, block_begin, block_end, full, a.m);
}

bool KQuantAmxSupports(const PackedWeight& w) {
  return w.f32_scaled() && (w.format == WeightFormat::kInt4 || w.format == WeightFormat::kInt8) &&
         (w.group_size == 16 || w.group_size == 32 || w.group_size == 64);
}

void MatmulKQuantInt8ActBlocksAmx(const MatmulArgs& a, int64_t block_begin, int64_t block_end) {
  const int64_t full = a.m / kTokens * kTokens;
  if (full > 0) {
    ConfigureTiles(static_cast<int>(a.weight->group_size));
    if (a.weight->format == WeightFormat::kInt8) {
      AmxGemm<static_cast<int>(WeightFormat::kInt8), true>(a, block_begin, block_end, full);
    } else {
      AmxGemm<static_cast<int>(WeightFormat::kInt4), true>(a, block_begin, block_end, full);
    }
    _tile_release();
  }
  MatmulKQuantInt8ActTokensAvx512(a, block_begin, block_end, full, a.m);
}

}  // namespace loom::kernels::cpu::internal
