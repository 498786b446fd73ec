// AVX-512 kernels for INT8/INT4 weights against float activations ("W8A32" / "W4A32").
// Compiled with -mavx512f -mavx512bw -mavx512vl -mfma -mf16c (kernels/CMakeLists.txt) and
// only called after a run-time CPU check.
//
// Each 64-byte line of the packed layout holds one dword per weight row (16 rows); a
// column's value sits in a fixed bit field of every dword, so one shift puts it in place
// for all 16 rows at once:
//   INT4: column j of the line (8 columns) at bits 8 * (j % 4) + 4 * (j / 4), 4 bits.
//         vpermps reads only bits 3:0 of each index, so a shift plus one permute of the
//         table {-8, ..., 7} turns the nibble into the float q - 8.
//   INT8: column j (4 columns) in byte j, stored as q + 128. XOR 0x80 gives q as int8;
//         moving that byte to bits 31:24 (zeros below) makes an int32 of q * 2^24, which
//         converts exactly; the group scale carries the 2^-24.
// The weight vectors are multiplied into per-group float accumulators (x broadcast), and
// each group is scaled once: y += scale * acc_g (+ (min + 8 scale) * sum_g x for INT4).

#include <immintrin.h>

#include <algorithm>
#include <utility>

#include "kernels/cpu/matmul_internal.h"
#include "kernels/cpu/matmul_store_avx512.h"

namespace loom::kernels::cpu::internal {
namespace {

// Tile shapes: a GEMV (m = 1) walks kGemvBlocks row blocks at once with two accumulator
// chains each (even / odd columns) to hide the FMA latency; a GEMM reuses each
// dequantized weight vector for up to kGemmMr tokens from registers.
constexpr int kGemvBlocks = 4;
constexpr int kGemmMr = 4;
constexpr int kGemmNb = 2;
constexpr int kMaxMr = kGemmMr;
constexpr int kMaxNb = kGemvBlocks;

// Calls f(std::integral_constant<int, j>) for j = 0 .. N-1, unrolled at compile time (the
// shift counts must be immediates).
template <typename F, int... kJ>
inline void Unrolled(F&& f, std::integer_sequence<int, kJ...>) {
  (f(std::integral_constant<int, kJ>{}), ...);
}

// Column kCol of an INT4 line (raw bytes) as floats q - 8, one per row.
template <int kCol>
inline __m512 Int4Column(__m512i bytes, __m512 centred_table) {
  constexpr int kShift = 8 * (kCol % 4) + 4 * (kCol / 4);
  const __m512i index = kShift == 0 ? bytes : _mm512_srli_epi32(bytes, kShift);
  return _mm512_permutexvar_ps(index, centred_table);
}

// Column kCol of an INT8 line (bytes already XORed with 0x80, i.e. int8 q) as q * 2^24.
template <int kCol>
inline __m512 Int8Column(__m512i signed_bytes) {
  const __m512i top_byte = _mm512_set1_epi32(static_cast<int>(0xff000000u));
  __m512i field;
  if constexpr (kCol == 3) {
    field = _mm512_and_si512(signed_bytes, top_byte);
  } else if constexpr (kCol == 0) {
    field = _mm512_slli_epi32(signed_bytes, 24);
  } else {
    field = _mm512_and_si512(_mm512_slli_epi32(signed_bytes, 24 - 8 * kCol), top_byte);
  }
  return _mm512_cvtepi32_ps(field);
}

// acc[r][j] over tokens token0 .. token0 + Mr and row blocks block0 .. block0 + Nb.
template <bool kInt4, int Mr, int Nb>
void Tile(const MatmulArgs& a, int64_t block0, int64_t token0) {
  constexpr int kChains = Mr == 1 ? 2 : 1;
  constexpr int kColsPerLine = kInt4 ? 8 : 4;
  const PackedWeight& w = *a.weight;
  const int64_t k = w.cols;
  const int64_t group = w.group_size;
  const int64_t block_bytes = BlockDataBytes(KernelFormat(a), k);
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
  // The hardware prefetcher alone leaves the memory idle while this tile computes: the
  // first token tile asks for the same line of the blocks one tile ahead as it reads each
  // line (the line itself where no such block exists); the other token tiles of these
  // blocks find them in cache. Worth ~15% on a GEMV streaming from memory.
  const int64_t num_blocks = NumRowBlocks(w.rows);
  const bool first_token_tile = token0 == 0;
  const uint8_t* ahead[Nb];
  for (int j = 0; j < Nb; ++j) {
    ahead[j] = block0 + Nb + j < num_blocks ? base[j] + Nb * block_bytes : base[j];
  }
  const float* x = a.x + token0 * k;
  const float* x_sum = kInt4 ? a.x_group_sum + token0 * scale_groups : nullptr;
  const __m512 centred_table = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4,
                                              5, 6, 7);
  const __m512i sign_flip = _mm512_set1_epi8(static_cast<char>(0x80));
  // INT8 columns come out as q * 2^24.
  const __m512 value_unit = _mm512_set1_ps(kInt4 ? 1.0f : 1.0f / 16777216.0f);

  __m512 acc[Mr][Nb];
  for (int r = 0; r < Mr; ++r) {
    for (int j = 0; j < Nb; ++j) acc[r][j] = _mm512_setzero_ps();
  }
  for (int64_t sg = 0; sg < scale_groups; ++sg) {
    __m512 group_acc[Mr][Nb][kChains];
    for (int r = 0; r < Mr; ++r) {
      for (int j = 0; j < Nb; ++j) {
        for (int c = 0; c < kChains; ++c) group_acc[r][j][c] = _mm512_setzero_ps();
      }
    }
    for (int64_t line = sg * lines_per_group; line < (sg + 1) * lines_per_group; ++line) {
      __m512i bytes[Nb];
      for (int j = 0; j < Nb; ++j) {
        if (first_token_tile) {
          _mm_prefetch(reinterpret_cast<const char*>(ahead[j] + line * 64), _MM_HINT_T0);
        }
        bytes[j] = _mm512_loadu_si512(base[j] + line * 64);
        if constexpr (!kInt4) bytes[j] = _mm512_xor_si512(bytes[j], sign_flip);
      }
      const float* xc = x + line * kColsPerLine;
      Unrolled(
          [&](auto col_constant) {
            constexpr int kCol = decltype(col_constant)::value;
            __m512 wv[Nb];
            for (int j = 0; j < Nb; ++j) {
              if constexpr (kInt4) {
                wv[j] = Int4Column<kCol>(bytes[j], centred_table);
              } else {
                wv[j] = Int8Column<kCol>(bytes[j]);
              }
            }
            for (int r = 0; r < Mr; ++r) {
              const __m512 xv = _mm512_set1_ps(xc[r * k + kCol]);
              for (int j = 0; j < Nb; ++j) {
                __m512& chain = group_acc[r][j][kCol % kChains];
                chain = _mm512_fmadd_ps(wv[j], xv, chain);
              }
            }
          },
          std::make_integer_sequence<int, kColsPerLine>{});
    }
    for (int j = 0; j < Nb; ++j) {
      const __m512 scale = _mm512_mul_ps(
          _mm512_cvtph_ps(
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales[j] + sg * kRowBlock))),
          value_unit);
      __m512 centred_min = _mm512_setzero_ps();
      if constexpr (kInt4) {
        const __m512 min = _mm512_cvtph_ps(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(mins[j] + sg * kRowBlock)));
        centred_min = _mm512_fmadd_ps(scale, _mm512_set1_ps(8.0f), min);
      }
      for (int r = 0; r < Mr; ++r) {
        __m512 sum = group_acc[r][j][0];
        if constexpr (kChains == 2) sum = _mm512_add_ps(sum, group_acc[r][j][1]);
        acc[r][j] = _mm512_fmadd_ps(sum, scale, acc[r][j]);
        if constexpr (kInt4) {
          acc[r][j] = _mm512_fmadd_ps(centred_min, _mm512_set1_ps(x_sum[r * scale_groups + sg]),
                                      acc[r][j]);
        }
      }
    }
  }
  for (int r = 0; r < Mr; ++r) {
    for (int j = 0; j < Nb; ++j) StoreOutput(acc[r][j], a, block0 + j, token0 + r);
  }
}

using TileFn = void (*)(const MatmulArgs&, int64_t, int64_t);

// Runtime (tokens, blocks) -> compile-time tile, for tile edges.
template <bool kInt4>
struct TileTable {
  TileFn fns[kMaxMr + 1][kMaxNb + 1] = {};
  constexpr TileTable() { Fill<1>(); }
  template <int Mr>
  constexpr void Fill() {
    if constexpr (Mr <= kMaxMr) {
      FillNb<Mr, 1>();
      Fill<Mr + 1>();
    }
  }
  template <int Mr, int Nb>
  constexpr void FillNb() {
    if constexpr (Nb <= kMaxNb) {
      fns[Mr][Nb] = &Tile<kInt4, Mr, Nb>;
      FillNb<Mr, Nb + 1>();
    }
  }
};

template <bool kInt4>
void RunTiles(const MatmulArgs& a, int64_t block_begin, int64_t block_end) {
  static constexpr TileTable<kInt4> table;
  const int mr = a.m == 1 ? 1 : kGemmMr;
  const int nb = a.m == 1 ? kGemvBlocks : kGemmNb;
  // Balanced token tiles: m = 17 with mr 4 runs 3 + 3 + 4 + 3 + 4, not 4 x 4 + 1.
  const int64_t num_tiles = (a.m + mr - 1) / mr;
  for (int64_t b = block_begin; b < block_end; b += nb) {
    const int nb_here = static_cast<int>(std::min<int64_t>(nb, block_end - b));
    for (int64_t tile = 0, t = 0; tile < num_tiles; ++tile) {
      const int64_t t_end = a.m * (tile + 1) / num_tiles;
      table.fns[t_end - t][nb_here](a, b, t);
      t = t_end;
    }
  }
}

}  // namespace

void MatmulF32ActBlocksAvx512(const MatmulArgs& a, int64_t block_begin, int64_t block_end) {
  if (KernelFormat(a) == WeightFormat::kInt4) {
    RunTiles<true>(a, block_begin, block_end);
  } else {
    RunTiles<false>(a, block_begin, block_end);
  }
}

}  // namespace loom::kernels::cpu::internal
