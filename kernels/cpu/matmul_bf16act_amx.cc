// BF16 activations on AMX (--activations bf16; Intel Sapphire Rapids and later): every weight
// format, for every m. Compiled with the AVX-512 flags plus -mamx-tile -mamx-bf16
// -mavx512bf16 (kernels/CMakeLists.txt) and only called when ActivationPrecisionStatus(kBf16) is
// OK (cpuid, the kernel's permission for the tile state, LOOM_CPU_ISA at amx).
//
// What it computes: y = bf16(x) . bf16(W)^T (+ bias), products exact in F32 and summed in F32
// by TDPBF16PS, 32 columns per product in column order. W is the weight's dequantized value
// (DequantizeRows' floats) rounded once to BF16 (round to nearest even), as a BF16 copy of the
// checkpoint holds it; x is rounded the same way, once per Matmul call
// (PrepareBf16Activations, rows padded to a multiple of 16 and columns to 32 with zeros).
//
// How: a panel of two row blocks (32 weight rows) is dequantized into the thread's scratch as
// AMX's BF16 B layout (a row of a B tile is 16 weight rows x one column pair, 64 bytes;
// ColumnPairs*), and the 16-token tiles of activations run over it, 2 x 2 C tiles at a time
// (tmm0-3; A in tmm4-5, B in tmm6-7). Above 32 tokens the whole k is dequantized first and
// every pass of 32 tokens reuses it (PanelPass); up to 32 (decode) it is dequantized a few
// product steps ahead of the products into a small ring, so the tile unit and the vector
// units overlap (StreamedPass). A tile row is one token and its sums run over k in the same
// order whatever else is in the tile and whichever pass runs it, so a token's result does not
// depend on its batch or on where it falls in it (batch invariance), nor on the thread count.
//
// A BF16 weight (WeightFormat::kBf16: a BF16 checkpoint, or F16/F32 ones the CPU forward pass
// packs so for this mode) is stored as these B tiles already: its row blocks are the panel, the
// tiles load straight from it, and nothing is converted (PanelPass with Pass::native).
//
// Dequantization bounds it where the weights are not reused: single-stream decode of the
// default model ran at ~0.5x the f32 path's tokens/s (~0.35x before the prefetch and the
// overlap), batches of 16 and more faster than f32 (bench/results/activations_cpu*.json).

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/amx_tile_config.h"
#include "kernels/cpu/bf16_pairs_avx512.h"
#include "kernels/cpu/matmul_decoders_avx512.h"
#include "kernels/cpu/matmul_internal.h"

namespace loom::kernels::cpu::internal {
namespace {

constexpr int64_t kTileK = 32;       // BF16 columns per product (64 bytes of an A row)
constexpr int64_t kTileTokens = 16;  // A rows
constexpr int kPanelBlocks = 2;      // row blocks per panel (B tiles per product step)
constexpr int kTokenTiles = 2;       // A tiles per product step

// Columns [c0, c1) (even; multiples of 32 for the integer formats) of row block `block` as
// B-tile rows: pair c / 2 at out + c / 2 * 32 (BF16), columns past k zero. Asks for the same
// columns' bytes of row block `ahead` on the way (none when it is negative): the weights
// stream from memory, and the streams of two blocks, their scales and mins are more than
// the hardware prefetcher keeps ahead of (single-stream decode ran ~20% slower without).
using ColumnPairsFn = void (*)(const MatmulArgs& a, int64_t block, int64_t c0, int64_t c1,
                               int64_t ahead, uint16_t* out);

// INT4/INT5/INT8 (the decoders' floats).
template <typename Decoder>
void ColumnPairsInteger(const MatmulArgs& a, int64_t block, int64_t c0, int64_t c1, int64_t ahead,
                        uint16_t* out) {
  constexpr int kCols = Decoder::kColsPerLine;
  const PackedWeight& w = *a.weight;
  const int64_t k = w.cols, group = w.group_size, end = std::min(c1, k);
  const uint8_t* data = KernelBlockData(a, block);
  const uint8_t* prefetch = ahead >= 0 ? KernelBlockData(a, ahead) : nullptr;
  const GroupArrays arrays(w);
  const Decoder decoder(w);
  for (int64_t c = c0; c < end;) {
    const int64_t g = c / group;
    const int64_t group_end = std::min(end, (g + 1) * group);
    const auto scales = Decoder::LoadGroup(w, block, g);
    if (prefetch != nullptr) {
      const int64_t offset = GroupOffset(w, ahead, g) * arrays.element_bytes;
      _mm_prefetch(arrays.scales + offset, _MM_HINT_T1);
      if (arrays.mins != nullptr) _mm_prefetch(arrays.mins + offset, _MM_HINT_T1);
    }
    for (int64_t line = c / kCols; line < group_end / kCols; ++line) {
      if (prefetch != nullptr) decoder.Prefetch(prefetch, line);
      const auto bytes = decoder.LoadLine(data, line);
      __m512 column[kCols];
      Unrolled(
          [&](auto col_constant) {
            constexpr int kCol = decltype(col_constant)::value;
            column[kCol] = decoder.template Column<kCol>(bytes, scales);
          },
          std::make_integer_sequence<int, kCols>{});
      for (int p = 0; p < kCols / 2; ++p) {
        _mm512_storeu_si512(out + (line * kCols / 2 + p) * 32,
                            PairUp(column[2 * p], column[2 * p + 1]));
      }
    }
    c = group_end;
  }
  for (int64_t c = std::max(c0, k); c < c1; c += 2) {
    _mm512_storeu_si512(out + c / 2 * 32, _mm512_setzero_si512());
  }
}

// F32 / F16 weights ([cols][16] per block); an odd k's last pair is (w, 0).
template <bool kHalf>
void ColumnPairsFloat(const MatmulArgs& a, int64_t block, int64_t c0, int64_t c1, int64_t ahead,
                      uint16_t* out) {
  const int64_t k = a.weight->cols;
  const uint8_t* data = KernelBlockData(a, block);
  if (ahead >= 0) {  // the columns' 64-byte lines (F16: two columns per line)
    const char* next = reinterpret_cast<const char*>(KernelBlockData(a, ahead));
    const int64_t bytes = kHalf ? 2 * kRowBlock : 4 * kRowBlock;
    for (int64_t c = c0; c < std::min(c1, k); c += 64 / bytes) {
      _mm_prefetch(next + c * bytes, _MM_HINT_T1);
    }
  }
  auto column = [&](int64_t c) {
    if (c >= k) return _mm512_setzero_ps();
    if constexpr (kHalf) return LoadHalf16(reinterpret_cast<const uint16_t*>(data) + c * kRowBlock);
    return _mm512_loadu_ps(reinterpret_cast<const float*>(data) + c * kRowBlock);
  };
  for (int64_t c = c0; c < c1; c += 2) {
    _mm512_storeu_si512(out + c / 2 * 32, PairUp(column(c), column(c + 1)));
  }
}

ColumnPairsFn ColumnPairsFor(const MatmulArgs& a) {
  switch (KernelFormat(a)) {
    case WeightFormat::kF32:
      return ColumnPairsFloat<false>;
    case WeightFormat::kF16:
      return ColumnPairsFloat<true>;
    case WeightFormat::kBf16:  // read as it is (Pass::native)
      return nullptr;
    case WeightFormat::kInt5:
      return ColumnPairsInteger<Int5Decoder>;
    case WeightFormat::kInt4:
      return a.weight->f32_scaled() ? ColumnPairsInteger<Int4F32Decoder>
                                    : ColumnPairsInteger<Int4Decoder>;
    default:  // INT8, and NL4 widened to it
      return a.weight->f32_scaled() ? ColumnPairsInteger<Int8F32Decoder>
                                    : ColumnPairsInteger<Int8Decoder>;
  }
}

// The C tiles: C[i][j] (tmm 2 i + j) sums A tile i (tmm 4 + i: 16 tokens) times B tile j
// (tmm 6 + j: row block j of the panel), for kMt token tiles and kNb blocks. GCC pastes tile
// numbers into the assembly: literals only.
template <int kMt, int kNb>
struct Tiles {
  static void Zero() {
    _tile_zero(0);
    if constexpr (kNb == 2) _tile_zero(1);
    if constexpr (kMt == 2) _tile_zero(2);
    if constexpr (kMt == 2 && kNb == 2) _tile_zero(3);
  }
  // One product step of kTileK columns: A rows from `x` (`x_stride` bytes apart), B tile j
  // from b[j] (16 rows of 64 bytes).
  static void Step(const uint16_t* x, int64_t x_stride, const uint16_t* b0, const uint16_t* b1) {
    _tile_loadd(4, x, x_stride);
    _tile_loadd(6, b0, 64);
    if constexpr (kNb == 2) _tile_loadd(7, b1, 64);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (kNb == 2) _tile_dpbf16ps(1, 4, 7);
    if constexpr (kMt == 2) {
      _tile_loadd(5, x + x_stride / 2 * kTileTokens, x_stride);
      _tile_dpbf16ps(2, 5, 6);
      if constexpr (kNb == 2) _tile_dpbf16ps(3, 5, 7);
    }
  }
  // Into `out`, 32 x 32 F32: tile (i, j) at row 16 i, column 16 j.
  static void Store(float* out) {
    constexpr int kOutStride = 32 * sizeof(float);
    _tile_stored(0, out, kOutStride);
    if constexpr (kNb == 2) _tile_stored(1, out + 16, kOutStride);
    if constexpr (kMt == 2) _tile_stored(2, out + 16 * 32, kOutStride);
    if constexpr (kMt == 2 && kNb == 2) _tile_stored(3, out + 16 * 32 + 16, kOutStride);
  }
};

// What one panel pass needs.
struct Pass {
  const MatmulArgs* args;
  ColumnPairsFn column_pairs;
  int64_t block0;     // the panel's first row block
  int64_t ahead;      // the next panel's first row block, whose bytes to prefetch, or -1
  const uint16_t* x;  // the pass's first token row of x_bf16
  int64_t k_pad;
  uint16_t* panel;  // the panel's scratch
  float* out;       // 32 x 32 F32
  // A BF16 weight's own row blocks (already B tiles: nothing to convert), or null.
  const uint16_t* native;
};

// The whole panel dequantized first, then this pass's tokens over it (Matmul's larger
// batches: every pass after the first reuses the panel).
// A BF16 weight's panel is its own row blocks, read as they are.
template <int kMt, int kNb>
void PanelPass(const Pass& p, bool dequantize) {
  const int64_t stride = p.k_pad / 2 * 32;  // a row block's BF16 values
  if (dequantize && p.native == nullptr) {
    for (int j = 0; j < kNb; ++j) {
      p.column_pairs(*p.args, p.block0 + j, 0, p.k_pad, p.ahead < 0 ? -1 : p.ahead + j,
                     p.panel + j * stride);
    }
  }
  const uint16_t* panel = p.native != nullptr ? p.native : p.panel;
  Tiles<kMt, kNb>::Zero();
  for (int64_t c = 0; c < p.k_pad; c += kTileK) {
    Tiles<kMt, kNb>::Step(p.x + c, p.k_pad * 2, panel + c / 2 * 32, panel + stride + c / 2 * 32);
  }
  Tiles<kMt, kNb>::Store(p.out);
}

// Up to 32 tokens (decode, small batches: one pass per panel): the panel dequantized a chunk
// of kChunkSteps product steps at a time into a ring of two chunks, one chunk ahead of the
// products, so the tile unit's work on chunk c overlaps the vector units' on chunk c + 1,
// and a tile load reads stores made a chunk earlier. The same products in the same order as
// PanelPass.
constexpr int64_t kChunkSteps = 4;
template <int kMt, int kNb>
void StreamedPass(const Pass& p) {
  constexpr int64_t kStep = kTileK / 2 * 32;  // BF16 values of one block's product step
  constexpr int64_t kChunk = kChunkSteps * kStep;
  const int64_t steps = p.k_pad / kTileK;
  const int64_t chunks = (steps + kChunkSteps - 1) / kChunkSteps;
  // Chunk c of block j at ring slot (c % 2, j); pair row r of the panel at r * 32 from its
  // chunk's origin, hence the offset by c * kChunk.
  auto slot = [&](int64_t c, int j) { return p.panel + ((c % 2) * kPanelBlocks + j) * kChunk; };
  Tiles<kMt, kNb>::Zero();
  for (int64_t c = 0; c <= chunks; ++c) {
    if (c < chunks) {
      const int64_t c0 = c * kChunkSteps * kTileK,
                    c1 = std::min(p.k_pad, c0 + kChunkSteps * kTileK);
      for (int j = 0; j < kNb; ++j) {
        p.column_pairs(*p.args, p.block0 + j, c0, c1, p.ahead < 0 ? -1 : p.ahead + j,
                       slot(c, j) - c * kChunk);
      }
    }
    if (c > 0) {
      for (int64_t s = (c - 1) * kChunkSteps; s < std::min(steps, c * kChunkSteps); ++s) {
        const int64_t offset = (s % kChunkSteps) * kStep;
        Tiles<kMt, kNb>::Step(p.x + s * kTileK, p.k_pad * 2, slot(c - 1, 0) + offset,
                              slot(c - 1, 1) + offset);
      }
    }
  }
  Tiles<kMt, kNb>::Store(p.out);
}

using PanelPassFn = void (*)(const Pass&, bool);
using StreamedPassFn = void (*)(const Pass&);
constexpr PanelPassFn kPanelPass[2][2] = {{PanelPass<1, 1>, PanelPass<1, 2>},
                                          {PanelPass<2, 1>, PanelPass<2, 2>}};
constexpr StreamedPassFn kStreamedPass[2][2] = {{StreamedPass<1, 1>, StreamedPass<1, 2>},
                                                {StreamedPass<2, 1>, StreamedPass<2, 2>}};

}  // namespace

void PrepareBf16Activations(MatmulArgs& a) {
  thread_local std::vector<uint16_t> storage;
  const int64_t k = a.weight->cols;
  const int64_t k_pad = (k + kTileK - 1) / kTileK * kTileK;
  const int64_t m_pad = (a.m + kTileTokens - 1) / kTileTokens * kTileTokens;
  storage.resize(static_cast<size_t>(m_pad * k_pad));
  // Only the padding is zeroed: the rows past m, and each row's columns past k (below).
  std::memset(storage.data() + a.m * k_pad, 0, static_cast<size_t>((m_pad - a.m) * k_pad * 2));
  for (int64_t t = 0; t < a.m; ++t) {
    const float* src = a.x + t * k;
    uint16_t* dst = storage.data() + t * k_pad;
    int64_t c = 0;
    for (; c + 16 <= k; c += 16) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + c),
                          reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_loadu_ps(src + c))));
    }
    if (c < k) {
      const __mmask16 mask = static_cast<__mmask16>((1u << (k - c)) - 1);
      _mm256_mask_storeu_epi16(
          dst + c, mask,
          reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mask, src + c))));
    }
    std::memset(dst + k, 0, static_cast<size_t>((k_pad - k) * 2));
  }
  a.x_bf16 = storage.data();
  a.bf16_k = k_pad;
}

void MatmulBf16ActBlocksAmx(const MatmulArgs& a, int64_t block_begin, int64_t block_end) {
  const PackedWeight& w = *a.weight;
  const int64_t n = w.rows, k_pad = a.bf16_k;
  const int64_t m_pad = (a.m + kTileTokens - 1) / kTileTokens * kTileTokens;
  const bool native = w.format == WeightFormat::kBf16;
  const bool streamed = m_pad <= kTileTokens * kTokenTiles && !native;
  // The panel (or the ring) and the C tiles' output (32 x 32 F32) in the thread's scratch.
  const int64_t panel_values =
      native ? 0 : kPanelBlocks * (streamed ? 2 * kChunkSteps * kTileK / 2 * 32 : k_pad / 2 * 32);
  float* const scratch = ThreadScratch(32 * 32 + panel_values / 2);
  Pass pass{&a,
            ColumnPairsFor(a),
            0,
            -1,
            nullptr,
            k_pad,
            reinterpret_cast<uint16_t*>(scratch + 32 * 32),
            scratch,
            nullptr};
  LoadTileConfig(FullTileConfig());
  for (int64_t b = block_begin; b < block_end; b += kPanelBlocks) {
    const int nb = static_cast<int>(std::min<int64_t>(kPanelBlocks, block_end - b));
    pass.block0 = b;
    if (native) pass.native = reinterpret_cast<const uint16_t*>(KernelBlockData(a, b));
    // The next panel, if it is as wide as this one (else the last, odd block goes unasked).
    pass.ahead = b + 2 * nb <= block_end ? b + nb : -1;
    const int64_t row0 = b * kRowBlock;
    const int64_t cols = std::min<int64_t>(nb * kRowBlock, n - row0);
    for (int64_t t = 0; t < m_pad; t += kTileTokens * kTokenTiles) {
      const int mt = static_cast<int>(std::min<int64_t>(kTokenTiles, (m_pad - t) / kTileTokens));
      pass.x = a.x_bf16 + t * k_pad;
      if (streamed) {
        kStreamedPass[mt - 1][nb - 1](pass);
      } else {
        kPanelPass[mt - 1][nb - 1](pass, t == 0);
      }
      const int64_t tokens = std::min<int64_t>(mt * kTileTokens, a.m - t);
      for (int64_t r = 0; r < tokens; ++r) {
        StoreBlockOutput(pass.out + r * 32, a.bias != nullptr ? a.bias + row0 : nullptr, cols,
                         a.y + (t + r) * n + row0);
      }
    }
  }
  _tile_release();
}

}  // namespace loom::kernels::cpu::internal
