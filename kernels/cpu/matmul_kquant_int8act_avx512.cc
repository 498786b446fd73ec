// AVX-512 VNNI kernel of matmul_kquant_int8act.cc (the same bits): a 64-byte line of a row
// block is 16 rows x 4 INT8 columns (q + 128) or 16 rows x 8 INT4 columns (two nibbles), so
// one vpdpbusd per 4 columns adds every row's unsigned-weight x signed-activation products;
// INT8's offset comes off once per group (128 * xsum). Register tiles of up to 4 tokens x 2
// row blocks (a single token: up to 4 row blocks, independent chains for decode) reuse
// every weight line and activation broadcast; a pair of row blocks stays in L1/L2 while
// the tokens pass over it. Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512vnni -mfma
// (kernels/CMakeLists.txt); called after a run-time check.

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/matmul_internal.h"

namespace loom::kernels::cpu::internal {
namespace {

constexpr int kMaxMr = 4;   // tokens per tile
constexpr int kGemmNb = 2;  // row blocks per tile with several tokens
constexpr int kGemvNb = 4;  // row blocks per tile with one token

inline __m512i Broadcast4(const int8_t* x) {
  int32_t four;
  std::memcpy(&four, x, 4);
  return _mm512_set1_epi32(four);
}

// Tokens [t0, t0 + Mr) x row blocks [block0, block0 + Nb): per weight group the exact
// integer dot products, then per token and block
//   p = fma(min, xsum, float(dot) * scale);   acc = fma(p, x_scale, acc)
// and the bias (or zeros) added at the end, as the scalar kernel orders them.
template <bool kInt8, int Mr, int Nb>
void Tile(const MatmulArgs& a, int64_t block0, int64_t t0) {
  const PackedWeight& w = *a.weight;
  const int64_t k = w.cols, n = w.rows, group = w.group_size;
  const int64_t block_bytes = BlockDataBytes(w.format, k);
  const int64_t groups = k / group;
  constexpr int64_t kColsPerLine = kInt8 ? 4 : 8;
  const __m512i low_nibbles = _mm512_set1_epi8(0x0f);
  const uint8_t* data[Nb];
  for (int j = 0; j < Nb; ++j) data[j] = w.data.data() + (block0 + j) * block_bytes;
  const int8_t* xq[Mr];
  for (int r = 0; r < Mr; ++r) xq[r] = a.xq.q + (t0 + r) * k;
  __m512 acc[Mr][Nb];
  for (int r = 0; r < Mr; ++r) {
    for (int j = 0; j < Nb; ++j) acc[r][j] = _mm512_setzero_ps();
  }
  for (int64_t g = 0; g < groups; ++g) {
    __m512i dot[Mr][Nb];
    for (int r = 0; r < Mr; ++r) {
      for (int j = 0; j < Nb; ++j) dot[r][j] = _mm512_setzero_si512();
    }
    for (int64_t line = g * group / kColsPerLine; line < (g + 1) * group / kColsPerLine; ++line) {
      if constexpr (kInt8) {
        __m512i bytes[Nb];
        for (int j = 0; j < Nb; ++j) bytes[j] = _mm512_loadu_si512(data[j] + line * 64);
        for (int r = 0; r < Mr; ++r) {
          const __m512i x = Broadcast4(xq[r] + line * kColsPerLine);
          for (int j = 0; j < Nb; ++j) dot[r][j] = _mm512_dpbusd_epi32(dot[r][j], bytes[j], x);
        }
      } else {
        __m512i lo[Nb], hi[Nb];
        for (int j = 0; j < Nb; ++j) {
          const __m512i bytes = _mm512_loadu_si512(data[j] + line * 64);
          lo[j] = _mm512_and_si512(bytes, low_nibbles);
          hi[j] = _mm512_and_si512(_mm512_srli_epi16(bytes, 4), low_nibbles);
        }
        for (int r = 0; r < Mr; ++r) {
          const __m512i x_lo = Broadcast4(xq[r] + line * kColsPerLine);
          const __m512i x_hi = Broadcast4(xq[r] + line * kColsPerLine + 4);
          for (int j = 0; j < Nb; ++j) {
            dot[r][j] = _mm512_dpbusd_epi32(dot[r][j], lo[j], x_lo);
            dot[r][j] = _mm512_dpbusd_epi32(dot[r][j], hi[j], x_hi);
          }
        }
      }
    }
    for (int r = 0; r < Mr; ++r) {
      const int32_t xsum = GroupActivationSum(a, t0 + r, g * group, group);
      const __m512 xsum_v = _mm512_set1_ps(static_cast<float>(xsum));
      const __m512 x_scale =
          _mm512_set1_ps(a.xq.scale[(t0 + r) * (k / a.xq_group) + g * group / a.xq_group]);
      for (int j = 0; j < Nb; ++j) {
        __m512i d = dot[r][j];
        if constexpr (kInt8) d = _mm512_sub_epi32(d, _mm512_set1_epi32(128 * xsum));
        const int64_t index = ((block0 + j) * groups + g) * kRowBlock;
        const __m512 p = _mm512_fmadd_ps(
            _mm512_loadu_ps(w.mins_f32.data() + index), xsum_v,
            _mm512_mul_ps(_mm512_cvtepi32_ps(d), _mm512_loadu_ps(w.scales_f32.data() + index)));
        acc[r][j] = _mm512_fmadd_ps(p, x_scale, acc[r][j]);
      }
    }
  }
  for (int j = 0; j < Nb; ++j) {
    const int64_t b = block0 + j;
    const int64_t valid = std::min<int64_t>(kRowBlock, n - b * kRowBlock);
    const __mmask16 mask = static_cast<__mmask16>((1u << valid) - 1);
    const __m512 bias = a.bias != nullptr ? _mm512_maskz_loadu_ps(mask, a.bias + b * kRowBlock)
                                          : _mm512_setzero_ps();
    for (int r = 0; r < Mr; ++r) {
      _mm512_mask_storeu_ps(a.y + (t0 + r) * n + b * kRowBlock, mask,
                            _mm512_add_ps(acc[r][j], bias));
    }
  }
}

using TileFn = void (*)(const MatmulArgs&, int64_t, int64_t);

// Tiles by (tokens, row blocks): [Mr][Nb], Nb up to kGemvNb for one token, kGemmNb else.
template <bool kInt8>
struct Tiles {
  static constexpr TileFn kFns[kMaxMr + 1][kGemvNb + 1] = {
      {},
      {nullptr, Tile<kInt8, 1, 1>, Tile<kInt8, 1, 2>, Tile<kInt8, 1, 3>, Tile<kInt8, 1, 4>},
      {nullptr, Tile<kInt8, 2, 1>, Tile<kInt8, 2, 2>},
      {nullptr, Tile<kInt8, 3, 1>, Tile<kInt8, 3, 2>},
      {nullptr, Tile<kInt8, 4, 1>, Tile<kInt8, 4, 2>},
  };
};

template <bool kInt8>
void Run(const MatmulArgs& a, int64_t block_begin, int64_t block_end, int64_t t_begin,
         int64_t t_end) {
  const int64_t tokens = t_end - t_begin;
  if (tokens <= 0) return;
  const int nb = tokens == 1 ? kGemvNb : kGemmNb;
  // Balanced token tiles: 6 tokens run 3 + 3, not 4 + 2.
  const int64_t num_tiles = (tokens + kMaxMr - 1) / kMaxMr;
  for (int64_t b = block_begin; b < block_end; b += nb) {
    const int nb_here = static_cast<int>(std::min<int64_t>(nb, block_end - b));
    for (int64_t tile = 0, t = t_begin; tile < num_tiles; ++tile) {
      const int64_t t_next = t_begin + tokens * (tile + 1) / num_tiles;
      Tiles<kInt8>::kFns[t_next - t][nb_here](a, b, t);
      t = t_next;
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
