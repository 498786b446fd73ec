// AVX2 GEMM for INT8/INT4 weights against int8 activations (ActivationPrecision::kInt8),
// for batches of tokens (which m and formats Matmul gives it: kInt8ActGemmMinTokens in
// matmul_internal.h; any m works). Compiled with -mavx2 -mfma -mf16c (kernels/CMakeLists.txt) and
// only called after a run-time CPU check.
//
// Scheme (the one llama.cpp and oneDNN use without VNNI): u8 x s8 products by
// vpmaddubsw, pairs summed into int32 by vpmaddwd.
//   * The activations are quantized once per call (Matmul) and read in token panels
//     sized from the L2 cache read at start-up (half of it), so a panel stays in L2 while
//     every weight row block of the thread's range passes over it.
//   * The weights are already in panels: one row block (16 rows, the packed layout of
//     matmul_internal.h) stays in L1 while every token tile of the panel runs over it.
//   * The microkernel is a tile of up to 4 (INT4) or 2 (INT8) tokens x 16 rows. Each
//     weight vector is unpacked once per line and reused for the tile's tokens from
//     registers.
//   * INT4: the nibbles (0..15) are the unsigned operand and the activations (|q| <= 127)
//     the signed one, so a vpmaddubsw lane is at most 2 * 15 * 127 = 3810: the 8 lanes of
//     one 32-column group (4 lines, low and high nibbles) sum in int16 without overflow
//     (<= 30480), and one vpmaddwd per group widens them to int32 (the tile kernel pays one
//     per line and nibble: 8 per group).
//   * INT8: the stored q + 128 would saturate vpmaddubsw's int16 pairs, so the unsigned
//     operand is |q| (<= 128) and the signed one sign(x, q) (2 * 128 * 127 = 32512 fits);
//     widened to int32 every line.
// Numerics: the per-group integer dot products are exact, and each group is applied with
// the float operations of the tile kernels (matmul_avx2.cc, matmul_avx512.cc) in the same
// order, so the result is the same bits as theirs, on every ISA and for every m.

#include <immintrin.h>
#include <unistd.h>

#include <algorithm>

#include "kernels/cpu/matmul_internal.h"

namespace loom::kernels::cpu::internal {
namespace {


// Bytes of quantized activations a token panel may hold: half the L2 (sysconf), 256 KiB
// when the C library does not know it.
int64_t TokenPanelBytes() {
  static const int64_t bytes = [] {
    const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return l2 > 0 ? static_cast<int64_t>(l2) / 2 : int64_t{256} << 10;
  }();
  return bytes;
}

inline __m256i Broadcast4(const int8_t* p) {
  int32_t value;
  __builtin_memcpy(&value, p, 4);
  return _mm256_set1_epi32(value);
}

inline __m256 LoadHalf8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// y[token0 .. token0 + Mr, block's 16 rows] over all of k.
template <bool kInt4, int Mr>
void Tile(const MatmulArgs& a, int64_t block, int64_t token0) {
  const PackedWeight& w = *a.weight;
  const int64_t k = w.cols, n = w.rows;
  const int64_t x_groups = k / kActGroup;
  const int64_t scale_groups = k / w.group_size;
  const int64_t groups_per_scale = w.group_size / kActGroup;
  const uint8_t* data = KernelBlockData(a, block);
  const uint16_t* scales = w.scales.data() + block * scale_groups * kRowBlock;
  const uint16_t* mins = kInt4 ? w.mins.data() + block * scale_groups * kRowBlock : nullptr;
  const int8_t* xq = a.xq.q + token0 * k;
  const float* x_scale = a.xq.scale + token0 * x_groups;
  const int32_t* x_sum = a.xq.qsum + token0 * x_groups;
  const __m256i ones16 = _mm256_set1_epi16(1);
  // INT4 (4 tokens): the float sums live in memory between groups, the integer sums need
  // the registers; INT8 (2 tokens) keeps them in registers (in memory the INT8 GEMM ran
  // 6-13% behind the tile kernel, in registers 3-6%).
  alignas(32) float acc[Mr][kRowBlock] = {};
  __m256 reg_acc[Mr][2];
#pragma GCC unroll 4
  for (int r = 0; r < Mr; ++r) reg_acc[r][0] = reg_acc[r][1] = _mm256_setzero_ps();
  for (int64_t g = 0; g < x_groups; ++g) {
    __m256i dot[Mr][2];
    if constexpr (kInt4) {
      const __m256i low_mask = _mm256_set1_epi8(0x0f);
      __m256i sum16[Mr][2];
#pragma GCC unroll 4
      for (int r = 0; r < Mr; ++r) sum16[r][0] = sum16[r][1] = _mm256_setzero_si256();
      const uint8_t* lines = data + g * 4 * 64;
#pragma GCC unroll 4
      for (int line = 0; line < 4; ++line) {
        __m256i lo[2], hi[2];
        for (int h = 0; h < 2; ++h) {
          const __m256i bytes =
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(lines + line * 64 + h * 32));
          lo[h] = _mm256_and_si256(bytes, low_mask);
          hi[h] = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low_mask);
        }
#pragma GCC unroll 4
        for (int r = 0; r < Mr; ++r) {
          const int8_t* xr = xq + r * k + g * kActGroup + line * 8;
          const __m256i x_lo = Broadcast4(xr);
          const __m256i x_hi = Broadcast4(xr + 4);
          for (int h = 0; h < 2; ++h) {
            sum16[r][h] = _mm256_add_epi16(
                sum16[r][h], _mm256_add_epi16(_mm256_maddubs_epi16(lo[h], x_lo),
                                              _mm256_maddubs_epi16(hi[h], x_hi)));
          }
        }
      }
#pragma GCC unroll 4
      for (int r = 0; r < Mr; ++r) {
        dot[r][0] = _mm256_madd_epi16(sum16[r][0], ones16);
        dot[r][1] = _mm256_madd_epi16(sum16[r][1], ones16);
      }
    } else {
      const __m256i sign_flip = _mm256_set1_epi8(static_cast<char>(0x80));
#pragma GCC unroll 4
      for (int r = 0; r < Mr; ++r) dot[r][0] = dot[r][1] = _mm256_setzero_si256();
      const uint8_t* lines = data + g * 8 * 64;
#pragma GCC unroll 8
      for (int line = 0; line < 8; ++line) {
        __m256i q[2], q_abs[2];
        for (int h = 0; h < 2; ++h) {
          q[h] = _mm256_xor_si256(
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(lines + line * 64 + h * 32)),
              sign_flip);                     // q + 128 -> q
          q_abs[h] = _mm256_abs_epi8(q[h]);  // -128 -> 128 as u8
        }
#pragma GCC unroll 4
        for (int r = 0; r < Mr; ++r) {
          const __m256i xv = Broadcast4(xq + r * k + g * kActGroup + line * 4);
          for (int h = 0; h < 2; ++h) {
            dot[r][h] = _mm256_add_epi32(
                dot[r][h], _mm256_madd_epi16(
                               _mm256_maddubs_epi16(q_abs[h], _mm256_sign_epi8(xv, q[h])),
                               ones16));
          }
        }
      }
    }
    // Apply the group exactly as the tile kernels do.
    const int64_t sg = (g / groups_per_scale) * kRowBlock;
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const __m256 scale = LoadHalf8(scales + sg + h * 8);
      __m256 min = _mm256_setzero_ps();
      if constexpr (kInt4) min = LoadHalf8(mins + sg + h * 8);
#pragma GCC unroll 4
      for (int r = 0; r < Mr; ++r) {
        const __m256 xs = _mm256_set1_ps(x_scale[r * x_groups + g]);
        __m256 part;
        if constexpr (kInt4) {
          const __m256 sum = _mm256_set1_ps(static_cast<float>(x_sum[r * x_groups + g]));
          part = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[r][h]), scale, _mm256_mul_ps(min, sum));
        } else {
          part = _mm256_mul_ps(_mm256_cvtepi32_ps(dot[r][h]), scale);
        }
        if constexpr (kInt4) {
          float* lanes = acc[r] + h * 8;
          _mm256_store_ps(lanes, _mm256_fmadd_ps(part, xs, _mm256_load_ps(lanes)));
        } else {
          reg_acc[r][h] = _mm256_fmadd_ps(part, xs, reg_acc[r][h]);
        }
      }
    }
  }
  const int64_t row0 = block * kRowBlock;
  const int64_t valid = std::min<int64_t>(kRowBlock, n - row0);
  if constexpr (!kInt4) {
#pragma GCC unroll 4
    for (int r = 0; r < Mr; ++r) {
      _mm256_store_ps(acc[r], reg_acc[r][0]);
      _mm256_store_ps(acc[r] + 8, reg_acc[r][1]);
    }
  }
  for (int r = 0; r < Mr; ++r) {
    StoreBlockOutput(acc[r], a.bias != nullptr ? a.bias + row0 : nullptr, valid,
                     a.y + (token0 + r) * n + row0);
  }
}

using TileFn = void (*)(const MatmulArgs&, int64_t, int64_t);

template <bool kInt4>
void RunGemm(const MatmulArgs& a, int64_t block_begin, int64_t block_end) {
  static constexpr TileFn kTiles[5] = {nullptr, &Tile<kInt4, 1>, &Tile<kInt4, 2>,
                                       &Tile<kInt4, 3>, &Tile<kInt4, 4>};
  // Tokens per tile: 4 for INT4 (8 int16 sums, 4 unpacked nibble vectors, 2 broadcasts);
  // INT8 needs q and |q| of both halves and a sign per product, and ran fastest with 2
  // (measured, 576x1536 and 2048x2048 at m = 512).
  constexpr int kMaxMr = kInt4 ? 4 : 2;
  const int64_t k = a.weight->cols;
  const int64_t panel_tokens = std::max<int64_t>(kMaxMr, TokenPanelBytes() / k);
  const int64_t num_panels = (a.m + panel_tokens - 1) / panel_tokens;
  for (int64_t p = 0; p < num_panels; ++p) {
    const int64_t t0 = a.m * p / num_panels, t1 = a.m * (p + 1) / num_panels;
    // Balanced token tiles: 5 tokens run as 2 + 3, not 4 + 1.
    const int64_t num_tiles = (t1 - t0 + kMaxMr - 1) / kMaxMr;
    for (int64_t b = block_begin; b < block_end; ++b) {
      for (int64_t tile = 0, t = t0; tile < num_tiles; ++tile) {
        const int64_t t_end = t0 + (t1 - t0) * (tile + 1) / num_tiles;
        kTiles[t_end - t](a, b, t);
        t = t_end;
      }
    }
  }
}

}  // namespace

void MatmulInt8ActGemmBlocksAvx2(const MatmulArgs& a, int64_t block_begin, int64_t block_end) {
  if (KernelFormat(a) == WeightFormat::kInt4) {
    RunGemm<true>(a, block_begin, block_end);
  } else {
    RunGemm<false>(a, block_begin, block_end);
  }
}

}  // namespace loom::kernels::cpu::internal
