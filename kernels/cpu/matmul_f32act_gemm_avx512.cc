// AVX-512 GEMM for INT8/INT4/INT5 weights against float activations, for batches of tokens
// (batched decode, prefill). Compiled with -mavx512f -mavx512bw -mavx512vl -mfma -mf16c
// (kernels/CMakeLists.txt) and only called after a run-time CPU check.
//
// The GEMV-style tile kernel (matmul_f32act_avx512.cc) decodes every weight once per
// tile of <= 4 tokens and keeps per-group accumulators, so decoding and broadcasts take
// most of its issue slots. Here each weight is decoded once per call (per token panel):
// for a panel of kPanelBlocks row blocks (32 weight rows) and a chunk of <= kChunkCols
// columns, the first token tile (DecodeTile, <= kDecodeMr tokens) dequantizes the chunk
// in registers, multiplies it into its own tokens and stores it into a per-thread,
// L1-resident float scratch
//   panel[c][j][16] = scale * q + min  (INT4)   or   scale * q  (INT8),
// and every other token tile (PanelTile, <= kMaxMr tokens x 32 rows, the same register
// blocking as the F32-weight kernel) runs over that scratch. Per weight the decode costs
// 3 vector ops per 16 weights, against m FMAs: ~0.84 of the FMA rate at m = 16, ~0.95 at
// m = 64. Sums continue across chunks through y (loaded and stored per chunk), in the
// order of one pass over k.
//
// Numerics: scale * q + min is one fused multiply-add of exact operands (q * scale is
// exact: 4- or 8-bit by 11-bit mantissas), so the scratch holds the very floats that
// DequantizeRows gives; the result differs from MatmulReference by float accumulation
// over k only.

#include <immintrin.h>

#include <algorithm>
#include <utility>

#include "kernels/cpu/matmul_decoders_avx512.h"
#include "kernels/cpu/matmul_internal.h"

namespace loom::kernels::cpu::internal {
namespace {

// Row blocks per weight panel: the microkernel's width (2 x 16 rows).
constexpr int kPanelBlocks = 2;
// Tokens per microkernel tile: kMaxMr x kPanelBlocks accumulators (24) + the panel's two
// weight vectors + one broadcast fit the 32 zmm registers.
constexpr int kMaxMr = 12;
// Tokens of the tile that decodes (its registers also hold the packed bytes, scales,
// mins and the decode constants).
constexpr int kDecodeMr = 8;
// Columns decoded at a time: the panel chunk (32 rows x kChunkCols floats, 24 KiB) and a
// tile's activations (kMaxMr x kChunkCols floats) stay in L1 while every token tile runs
// over them. A whole-k panel would not fit, and its stores alone would then cost more
// than decoding.
constexpr int64_t kChunkCols = 192;
// Token panels: the activations of one panel (tokens x k floats) should stay in L2 while
// every weight panel of the thread's range runs over them; each extra token panel costs
// one more decode of the range.
constexpr int64_t kTokenPanelBytes = int64_t{768} << 10;

// One microkernel call: columns [c0, c0 + cols) of the panel's row blocks
// [block0, block0 + Nb) for Mr tokens from token0. The first chunk starts the sums from
// zero, later ones continue the sums stored in y (the same additions in the same order
// as one pass over k), and the last adds the bias.
struct TileCall {
  int64_t block0;
  int64_t token0;
  int64_t c0;
  int64_t cols;
  bool first_chunk;
  bool last_chunk;
};

template <int Mr, int Nb>
struct Accumulators {
  __m512 acc[Mr][Nb];
  __mmask16 mask[Nb];
  float* y[Nb];

  Accumulators(const MatmulArgs& a, const TileCall& call) {
    const int64_t n = a.weight->rows;
    for (int j = 0; j < Nb; ++j) {
      const int64_t row0 = (call.block0 + j) * kRowBlock;
      const int64_t valid = std::min<int64_t>(kRowBlock, n - row0);
      mask[j] = static_cast<__mmask16>((1u << valid) - 1);
      y[j] = a.y + call.token0 * n + row0;
    }
    for (int r = 0; r < Mr; ++r) {
      for (int j = 0; j < Nb; ++j) {
        acc[r][j] =
            call.first_chunk ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mask[j], y[j] + r * n);
      }
    }
  }

  void Store(const MatmulArgs& a, const TileCall& call) const {
    const int64_t n = a.weight->rows;
    for (int j = 0; j < Nb; ++j) {
      const __m512 bias =
          call.last_chunk && a.bias != nullptr
              ? _mm512_maskz_loadu_ps(mask[j], a.bias + (call.block0 + j) * kRowBlock)
              : _mm512_setzero_ps();
      for (int r = 0; r < Mr; ++r) {
        _mm512_mask_storeu_ps(y[j] + r * n, mask[j], _mm512_add_ps(acc[r][j], bias));
      }
    }
  }
};

// The decoding tile: dequantizes the chunk of the panel in registers, multiplies it into
// its own Mr tokens and, when more tiles follow (kStore), stores it into the panel
// scratch, panel[(c - c0) * Nb * 16 + j * 16 + r], for them. Asks for the same bytes of
// the panel after next (`prefetch`, the first block's data, or nullptr) on the way.
template <typename Decoder, int Mr, int Nb, bool kStore>
void DecodeTile(const MatmulArgs& a, float* panel, const TileCall& call, const uint8_t* prefetch) {
  constexpr int kCols = Decoder::kColsPerLine;
  const PackedWeight& w = *a.weight;
  const int64_t k = w.cols, group = w.group_size;
  const int64_t block_bytes = BlockDataBytes(KernelFormat(a), k);
  const uint8_t* data = KernelBlockData(a, call.block0);
  const float* x = a.x + call.token0 * k;
  const Decoder decoder(w);
  Accumulators<Mr, Nb> out(a, call);
  const int64_t c1 = call.c0 + call.cols;
  for (int64_t c = call.c0; c < c1;) {
    const int64_t g = c / group;
    const int64_t group_end = std::min(c1, (g + 1) * group);
    typename Decoder::Group groups[Nb];
    for (int j = 0; j < Nb; ++j) groups[j] = Decoder::LoadGroup(w, call.block0 + j, g);
    for (int64_t line = c / kCols; line < group_end / kCols; ++line) {
      typename Decoder::Line bytes[Nb];
      for (int j = 0; j < Nb; ++j) {
        if (prefetch != nullptr) decoder.Prefetch(prefetch + j * block_bytes, line);
        bytes[j] = decoder.LoadLine(data + j * block_bytes, line);
      }
      const int64_t col0 = line * kCols;
      float* dst = panel + (col0 - call.c0) * Nb * kRowBlock;
      Unrolled(
          [&](auto col_constant) {
            constexpr int kCol = decltype(col_constant)::value;
            __m512 wv[Nb];
            for (int j = 0; j < Nb; ++j) {
              wv[j] = decoder.template Column<kCol>(bytes[j], groups[j]);
              if constexpr (kStore) _mm512_store_ps(dst + (kCol * Nb + j) * kRowBlock, wv[j]);
            }
            for (int r = 0; r < Mr; ++r) {
              const __m512 xv = _mm512_set1_ps(x[r * k + col0 + kCol]);
              for (int j = 0; j < Nb; ++j)
                out.acc[r][j] = _mm512_fmadd_ps(wv[j], xv, out.acc[r][j]);
            }
          },
          std::make_integer_sequence<int, kCols>{});
    }
    c = group_end;
  }
  out.Store(a, call);
}

// The other tiles: y (+)= panel chunk x activations for Mr tokens and Nb row blocks.
template <int Mr, int Nb>
void PanelTile(const MatmulArgs& a, const float* panel, const TileCall& call) {
  const int64_t k = a.weight->cols;
  const float* x = a.x + call.token0 * k + call.c0;
  Accumulators<Mr, Nb> out(a, call);
  for (int64_t c = 0; c < call.cols; ++c) {
    __m512 wv[Nb];
    for (int j = 0; j < Nb; ++j) wv[j] = _mm512_load_ps(panel + (c * Nb + j) * kRowBlock);
    for (int r = 0; r < Mr; ++r) {
      const __m512 xv = _mm512_set1_ps(x[r * k + c]);
      for (int j = 0; j < Nb; ++j) out.acc[r][j] = _mm512_fmadd_ps(wv[j], xv, out.acc[r][j]);
    }
  }
  out.Store(a, call);
}

using DecodeTileFn = void (*)(const MatmulArgs&, float*, const TileCall&, const uint8_t*);
using PanelTileFn = void (*)(const MatmulArgs&, const float*, const TileCall&);

// Runtime (tokens, blocks, more tiles follow) -> compile-time tiles.
template <typename Decoder>
struct TileTable {
  DecodeTileFn decode[kDecodeMr + 1][kPanelBlocks + 1][2] = {};
  PanelTileFn panel[kMaxMr + 1][kPanelBlocks + 1] = {};
  constexpr TileTable() {
    FillDecode<1>();
    FillPanel<1>();
  }
  template <int Mr>
  constexpr void FillDecode() {
    if constexpr (Mr <= kDecodeMr) {
      decode[Mr][1][0] = &DecodeTile<Decoder, Mr, 1, false>;
      decode[Mr][1][1] = &DecodeTile<Decoder, Mr, 1, true>;
      decode[Mr][2][0] = &DecodeTile<Decoder, Mr, 2, false>;
      decode[Mr][2][1] = &DecodeTile<Decoder, Mr, 2, true>;
      FillDecode<Mr + 1>();
    }
  }
  template <int Mr>
  constexpr void FillPanel() {
    if constexpr (Mr <= kMaxMr) {
      panel[Mr][1] = &PanelTile<Mr, 1>;
      panel[Mr][2] = &PanelTile<Mr, 2>;
      FillPanel<Mr + 1>();
    }
  }
};
static_assert(kPanelBlocks == 2, "TileTable fills Nb = 1 and 2");

template <typename Decoder>
void RunGemm(const MatmulArgs& a, int64_t block_begin, int64_t block_end) {
  static constexpr TileTable<Decoder> table;
  const PackedWeight& w = *a.weight;
  const int64_t k = w.cols;
  const int64_t scale_groups = k / w.group_size;
  // One panel chunk per thread, kept between calls.
  float* const panel = ThreadScratch(kPanelBlocks * kRowBlock * kChunkCols);

  // Balanced column chunks of at most kChunkCols, multiples of 32 (whole lines and INT5
  // fifth-bit words; k is a multiple of 32): k = 576 runs as 3 x 192, k = 1536 as 8 x 192.
  const int64_t num_chunks = (k + kChunkCols - 1) / kChunkCols;
  const int64_t chunk_cols = ((k + num_chunks - 1) / num_chunks + 31) / 32 * 32;
  // Balanced token panels; in each, the decoding tile takes up to kDecodeMr tokens and
  // balanced tiles of up to kMaxMr the rest: 16 tokens run as 8 + 8, 64 as 8 + 5 x ~11.
  const int64_t panel_tokens =
      std::max<int64_t>(kMaxMr, kTokenPanelBytes / (k * static_cast<int64_t>(sizeof(float))));
  const int64_t num_token_panels = (a.m + panel_tokens - 1) / panel_tokens;
  const GroupArrays arrays(w);
  for (int64_t p = 0; p < num_token_panels; ++p) {
    const int64_t t0 = a.m * p / num_token_panels, t1 = a.m * (p + 1) / num_token_panels;
    const int64_t decode_tokens = std::min<int64_t>(kDecodeMr, t1 - t0);
    const int64_t rest = t1 - t0 - decode_tokens;
    const int64_t num_tiles = (rest + kMaxMr - 1) / kMaxMr;
    for (int64_t b = block_begin; b < block_end; b += kPanelBlocks) {
      const int nb = static_cast<int>(std::min<int64_t>(kPanelBlocks, block_end - b));
      const int64_t ahead = b + kPanelBlocks;
      const uint8_t* prefetch = nullptr;
      if (ahead + nb <= block_end) {
        prefetch = KernelBlockData(a, ahead);
        // The next panel's scales (and mins): its weight bytes are prefetched line by
        // line as this panel decodes; these would otherwise miss once per group.
        const int64_t bytes = nb * scale_groups * kRowBlock * arrays.element_bytes;
        const int64_t first = ahead * scale_groups * kRowBlock * arrays.element_bytes;
        for (int64_t offset = 0; offset < bytes; offset += 64) {
          _mm_prefetch(arrays.scales + first + offset, _MM_HINT_T1);
          if (arrays.mins != nullptr) _mm_prefetch(arrays.mins + first + offset, _MM_HINT_T1);
        }
      }
      for (int64_t c0 = 0; c0 < k; c0 += chunk_cols) {
        TileCall call{b, t0, c0, std::min(chunk_cols, k - c0), c0 == 0, c0 + chunk_cols >= k};
        table.decode[decode_tokens][nb][num_tiles > 0](a, panel, call, prefetch);
        for (int64_t tile = 0, t = t0 + decode_tokens; tile < num_tiles; ++tile) {
          const int64_t t_end = t0 + decode_tokens + rest * (tile + 1) / num_tiles;
          call.token0 = t;
          table.panel[t_end - t][nb](a, panel, call);
          t = t_end;
        }
      }
    }
  }
}

}  // namespace

void MatmulF32ActGemmBlocksAvx512(const MatmulArgs& a, int64_t block_begin, int64_t block_end) {
  if (KernelFormat(a) == WeightFormat::kInt5) {
    RunGemm<Int5Decoder>(a, block_begin, block_end);
    return;
  }
  const bool int4 = KernelFormat(a) == WeightFormat::kInt4;
  if (a.weight->f32_scaled()) {
    int4 ? RunGemm<Int4F32Decoder>(a, block_begin, block_end)
         : RunGemm<Int8F32Decoder>(a, block_begin, block_end);
  } else {
    int4 ? RunGemm<Int4Decoder>(a, block_begin, block_end)
         : RunGemm<Int8Decoder>(a, block_begin, block_end);
  }
}

}  // namespace loom::kernels::cpu::internal
