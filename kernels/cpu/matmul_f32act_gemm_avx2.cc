// AVX2 GEMM for INT8/INT4/INT5 weights against float activations, for every batch size (one
// kernel for every m keeps a token's result independent of its batch). Compiled with
// -mavx2 -mfma -mf16c (kernels/CMakeLists.txt) and only called after a run-time CPU
// check. The AVX-512 kernel (matmul_f32act_gemm_avx512.cc) explains the scheme; here with
// 16 ymm registers:
//   * a panel is one row block (16 weight rows = two 8-lane halves); for a chunk of
//     <= kChunkCols columns the first token tile (DecodeTile, <= kDecodeMr tokens)
//     dequantizes the weights in registers, multiplies them into its tokens and stores
//     them into a per-thread L1-resident float scratch panel[c][16];
//   * every further tile (PanelTile, <= kMaxMr = 6 tokens) runs the classic 6 x 16 AVX2
//     microkernel over the scratch: 12 accumulators, 2 weight vectors, 1 broadcast; per
//     column 2 loads + 6 broadcasts feed 12 FMAs, so it is FMA-bound;
//   * token panels are sized from the L2 cache read at start-up (half of it holds a
//     panel's activations while every weight panel of the thread's range passes).
// Numerics are those of the AVX-512 kernel, lane for lane: the scratch holds the floats
// DequantizeRows gives (scale * q + min by one FMA of exact operands; scale * q exact for
// INT8), and each output is one FMA chain over k in column order, whatever the tile. So
// the result is the same bits as the AVX-512 GEMM's, for every m.

#include <immintrin.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

#include "kernels/cpu/matmul_internal.h"

namespace loom::kernels::cpu::internal {
namespace {

constexpr int kMaxMr = 6;
constexpr int kDecodeMr = 4;
constexpr int64_t kChunkCols = 192;
// GemvTile's software prefetch distances, in 64-byte lines of each row block's weights and
// in scale groups. Without them the m = 1 kernel leaves memory idle while it dequantizes:
// engine_bench --only-batch 1 (LOOM_CPU_ISA=avx2, Zen 4, 2 threads, 24 runs each,
// interleaved) went 108 -> 121 tok/s (8 lines), 123 (16), 135 (16 lines + 8 groups of
// scales); 12 or 32 lines were no better.
constexpr int64_t kGemvPrefetchLines = 16;
constexpr int64_t kGemvPrefetchGroups = 8;

// Bytes of activations a token panel may hold: half the L2 (sysconf), 256 KiB when the
// C library does not know it.
int64_t TokenPanelBytes() {
  static const int64_t bytes = [] {
    const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return l2 > 0 ? static_cast<int64_t>(l2) / 2 : int64_t{256} << 10;
  }();
  return bytes;
}

template <typename F, int... kJ>
inline void Unrolled(F&& f, std::integer_sequence<int, kJ...>) {
  (f(std::integral_constant<int, kJ>{}), ...);
}

inline __m256 LoadHalf8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// Every decoder: LoadLine(block's data, line) gives a line's packed bits for both 8-row
// halves (Line), Column<kCol>(line, group, half) column kCol of one half as 8 floats.
// GemvTile walks kLinesPerStep lines at a time; with more than one (INT5) it calls
// LoadBits once per step, then LoadLineAt<kL> for each line (its compile-time position).
struct NoBits {};

// INT4: column j of a line sits at bits 8 * (j % 4) + 4 * (j / 4) of every row's dword;
// shifted down and masked it converts exactly, and one FMA gives scale * q + min.
struct Int4Decoder {
  static constexpr int kColsPerLine = 8;
  // Row blocks GemvTile runs in lockstep at m = 1 (2, 3 and 4 measured within 5%).
  static constexpr int kGemvBlocks = 3;
  static constexpr int kLinesPerStep = 1;
  explicit Int4Decoder(const PackedWeight& /*w*/) {}
  __m256i low_nibble = _mm256_set1_epi32(0x0f);
  struct Group {
    __m256 scale[2], min[2];
  };
  static Group LoadGroup(const PackedWeight& w, int64_t block, int64_t g) {
    const int64_t index = (block * (w.cols / w.group_size) + g) * kRowBlock;
    return {{LoadHalf8(w.scales.data() + index), LoadHalf8(w.scales.data() + index + 8)},
            {LoadHalf8(w.mins.data() + index), LoadHalf8(w.mins.data() + index + 8)}};
  }
  struct Line {
    __m256i half[2];
  };
  Line LoadLine(const uint8_t* block, int64_t line) const {
    const uint8_t* p = block + line * 64;
    return {{_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)),
             _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32))}};
  }
  using Bits = NoBits;  // one line per step: GemvTile calls LoadLine
  template <int kCol>
  __m256 Column(const Line& line, const Group& group, int h) const {
    const __m256i bytes = line.half[h];
    constexpr int kShift = 8 * (kCol % 4) + 4 * (kCol / 4);
    __m256i q;
    if constexpr (kShift == 28) {
      q = _mm256_srli_epi32(bytes, 28);
    } else if constexpr (kShift == 0) {
      q = _mm256_and_si256(bytes, low_nibble);
    } else {
      q = _mm256_and_si256(_mm256_srli_epi32(bytes, kShift), low_nibble);
    }
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), group.scale[h], group.min[h]);
  }
};

// INT8: a line holds 4 columns of 16 rows as q + 128, column j in byte j of each dword.
// XOR 0x80 gives q as int8; moved to bits 31:24 (zeros below) it converts exactly to
// q * 2^24, and the group scale carries the 2^-24.
struct Int8Decoder {
  static constexpr int kColsPerLine = 4;
  static constexpr int kGemvBlocks = 4;  // as in Int4Decoder
  static constexpr int kLinesPerStep = 1;
  explicit Int8Decoder(const PackedWeight& /*w*/) {}
  __m256i top_byte = _mm256_set1_epi32(static_cast<int>(0xff000000u));
  __m256i byte1_to_top = ByteToTop(1);
  __m256i byte2_to_top = ByteToTop(2);
  static __m256i ByteToTop(int j) {
    uint32_t control[8];
    for (int dword = 0; dword < 8; ++dword)
      control[dword] = (4u * (dword % 4) + j) << 24 | 0x808080u;
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(control));
  }
  struct Group {
    __m256 scale[2];
  };
  static Group LoadGroup(const PackedWeight& w, int64_t block, int64_t g) {
    const int64_t index = (block * (w.cols / w.group_size) + g) * kRowBlock;
    const __m256 unit = _mm256_set1_ps(1.0f / 16777216.0f);
    return {{_mm256_mul_ps(LoadHalf8(w.scales.data() + index), unit),
             _mm256_mul_ps(LoadHalf8(w.scales.data() + index + 8), unit)}};
  }
  struct Line {
    __m256i half[2];
  };
  Line LoadLine(const uint8_t* block, int64_t line) const {
    const uint8_t* p = block + line * 64;
    const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
    return {{_mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)), flip),
             _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32)), flip)}};
  }
  using Bits = NoBits;  // one line per step: GemvTile calls LoadLine
  // Column kCol as q * 2^24, exactly.
  template <int kCol>
  __m256 Shifted(__m256i bytes) const {
    __m256i field;
    if constexpr (kCol == 0) {
      field = _mm256_slli_epi32(bytes, 24);
    } else if constexpr (kCol == 1) {
      field = _mm256_shuffle_epi8(bytes, byte1_to_top);
    } else if constexpr (kCol == 2) {
      field = _mm256_shuffle_epi8(bytes, byte2_to_top);
    } else {
      field = _mm256_and_si256(bytes, top_byte);
    }
    return _mm256_cvtepi32_ps(field);
  }
  template <int kCol>
  __m256 Column(const Line& line, const Group& group, int h) const {
    return _mm256_mul_ps(Shifted<kCol>(line.half[h]), group.scale[h]);
  }
};

// INT5: each half of a line becomes two registers with one q (0..31) per byte, columns
// 0-3 and 4-7 (the nibbles with their fifth bits ORed in, matmul_internal.h); Int8Decoder's
// byte moves then give q * 2^24 exactly, and one FMA scale * q + min.
struct Int5Decoder : Int8Decoder {
  static constexpr int kColsPerLine = 8;
  static constexpr int kGemvBlocks = 3;  // as INT4's
  // The 4 lines of a 32-column group share their fifth-bit words: loaded once, shifted
  // by immediates.
  static constexpr int kLinesPerStep = 4;
  __m256i low_nibbles = _mm256_set1_epi8(0x0f);
  __m256i fifth_bit = _mm256_set1_epi8(0x10);
  int64_t high_offset;  // of the fifth bits in a block's data
  explicit Int5Decoder(const PackedWeight& w)
      : Int8Decoder(w), high_offset(Int5HighOffset(w.cols, 0, 0)) {}
  struct Group {
    __m256 scale[2], min[2];
  };
  static Group LoadGroup(const PackedWeight& w, int64_t block, int64_t g) {
    const int64_t index = (block * (w.cols / w.group_size) + g) * kRowBlock;
    const __m256 unit = _mm256_set1_ps(1.0f / 16777216.0f);
    return {{_mm256_mul_ps(LoadHalf8(w.scales.data() + index), unit),
             _mm256_mul_ps(LoadHalf8(w.scales.data() + index + 8), unit)},
            {LoadHalf8(w.mins.data() + index), LoadHalf8(w.mins.data() + index + 8)}};
  }
  struct Line {
    __m256i columns[2][2];  // [half][columns 0-3, 4-7]
  };
  // Any line, its position in the step at run time (DecodeTile).
  Line LoadLine(const uint8_t* block, int64_t line) const {
    const Bits bits = LoadBits(block, line);
    const __m128i shift = _mm_cvtsi32_si128(2 * static_cast<int>(line % 4));
    Line out;
    for (int h = 0; h < 2; ++h) {
      const __m256i high = _mm256_srl_epi32(bits.high[h], shift);
      Merge(block + line * 64, h, _mm256_slli_epi32(high, 4), _mm256_slli_epi32(high, 3), out);
    }
    return out;
  }
  struct Bits {
    __m256i high[2];  // per half: the fifth-bit words of the step's 4 lines
  };
  Bits LoadBits(const uint8_t* block, int64_t line) const {
    const uint8_t* words = block + high_offset + (line / 4) * 64;
    return {{_mm256_loadu_si256(reinterpret_cast<const __m256i*>(words)),
             _mm256_loadu_si256(reinterpret_cast<const __m256i*>(words + 32))}};
  }
  // Line kL of the step (line % 4 == kL): its fifth bits sit at bits 8 j + 2 kL (columns
  // 0-3) and 8 j + 2 kL + 1 (columns 4-7) of each word; moved to bit 4 of byte j.
  template <int kL>
  Line LoadLineAt(const uint8_t* block, int64_t line, const Bits& bits) const {
    Line out;
    for (int h = 0; h < 2; ++h) {
      Merge(block + line * 64, h, Shift<4 - 2 * kL>(bits.high[h]), Shift<3 - 2 * kL>(bits.high[h]),
            out);
    }
    return out;
  }
  // Half h of a line: its nibbles ORed with the fifth bits, which `low` / `high` hold at
  // bit 4 of each byte for columns 0-3 / 4-7 (other bits are masked off).
  void Merge(const uint8_t* p, int h, __m256i low, __m256i high, Line& out) const {
    const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + h * 32));
    out.columns[h][0] =
        _mm256_or_si256(_mm256_and_si256(bytes, low_nibbles), _mm256_and_si256(low, fifth_bit));
    out.columns[h][1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(bytes, 4), low_nibbles),
                                        _mm256_and_si256(high, fifth_bit));
  }
  template <int kLeft>
  static __m256i Shift(__m256i v) {
    if constexpr (kLeft > 0) return _mm256_slli_epi32(v, kLeft);
    if constexpr (kLeft < 0) return _mm256_srli_epi32(v, -kLeft);
    return v;
  }
  template <int kCol>
  __m256 Column(const Line& line, const Group& group, int h) const {
    return _mm256_fmadd_ps(Shifted<kCol % 4>(line.columns[h][kCol / 4]), group.scale[h],
                           group.min[h]);
  }
};

// F32-scaled weights (K-quants, weights.h): the same columns with F32 scales and mins, the
// weight one rounding of q * scale + min (INT8 too: Q5_K has mins, the others -0), lane
// for lane the AVX-512 kernel's.
inline int64_t GroupOffset(const PackedWeight& w, int64_t block, int64_t g) {
  return (block * (w.cols / w.group_size) + g) * kRowBlock;
}
struct Int4F32Decoder : Int4Decoder {
  using Int4Decoder::Int4Decoder;
  static Group LoadGroup(const PackedWeight& w, int64_t block, int64_t g) {
    const float* scales = w.scales_f32.data() + GroupOffset(w, block, g);
    const float* mins = w.mins_f32.data() + GroupOffset(w, block, g);
    return {{_mm256_loadu_ps(scales), _mm256_loadu_ps(scales + 8)},
            {_mm256_loadu_ps(mins), _mm256_loadu_ps(mins + 8)}};
  }
};
struct Int8F32Decoder : Int8Decoder {
  using Int8Decoder::Int8Decoder;
  struct Group {
    __m256 scale[2], min[2];
  };
  static Group LoadGroup(const PackedWeight& w, int64_t block, int64_t g) {
    const float* scales = w.scales_f32.data() + GroupOffset(w, block, g);
    const float* mins = w.mins_f32.data() + GroupOffset(w, block, g);
    const __m256 unit = _mm256_set1_ps(1.0f / 16777216.0f);
    return {{_mm256_mul_ps(_mm256_loadu_ps(scales), unit),
             _mm256_mul_ps(_mm256_loadu_ps(scales + 8), unit)},
            {_mm256_loadu_ps(mins), _mm256_loadu_ps(mins + 8)}};
  }
  template <int kCol>
  __m256 Column(const Line& line, const Group& group, int h) const {
    return _mm256_fmadd_ps(Shifted<kCol>(line.half[h]), group.scale[h], group.min[h]);
  }
};

// Columns [c0, c0 + cols) of row block `block` for Mr tokens from token0; sums continue
// through y between chunks (first chunk from zero, bias added by the last).
struct TileCall {
  int64_t block;
  int64_t token0;
  int64_t c0;
  int64_t cols;
  bool first_chunk;
  bool last_chunk;
};

template <int Mr>
struct Accumulators {
  __m256 acc[Mr][2];
  int64_t valid;
  float* y;

  Accumulators(const MatmulArgs& a, const TileCall& call) {
    const int64_t n = a.weight->rows;
    const int64_t row0 = call.block * kRowBlock;
    valid = std::min<int64_t>(kRowBlock, n - row0);
    y = a.y + call.token0 * n + row0;
    for (int r = 0; r < Mr; ++r) {
      if (call.first_chunk) {
        acc[r][0] = acc[r][1] = _mm256_setzero_ps();
      } else if (valid == kRowBlock) {
        acc[r][0] = _mm256_loadu_ps(y + r * n);
        acc[r][1] = _mm256_loadu_ps(y + r * n + 8);
      } else {
        alignas(32) float lanes[kRowBlock] = {};
        std::copy(y + r * n, y + r * n + valid, lanes);
        acc[r][0] = _mm256_load_ps(lanes);
        acc[r][1] = _mm256_load_ps(lanes + 8);
      }
    }
  }

  void Store(const MatmulArgs& a, const TileCall& call) const {
    const int64_t n = a.weight->rows;
    const float* bias =
        call.last_chunk && a.bias != nullptr ? a.bias + call.block * kRowBlock : nullptr;
    for (int r = 0; r < Mr; ++r) {
      if (valid == kRowBlock) {
        __m256 lo = acc[r][0], hi = acc[r][1];
        if (bias != nullptr) {
          lo = _mm256_add_ps(lo, _mm256_loadu_ps(bias));
          hi = _mm256_add_ps(hi, _mm256_loadu_ps(bias + 8));
        }
        _mm256_storeu_ps(y + r * n, lo);
        _mm256_storeu_ps(y + r * n + 8, hi);
      } else {
        alignas(32) float lanes[kRowBlock];
        _mm256_store_ps(lanes, acc[r][0]);
        _mm256_store_ps(lanes + 8, acc[r][1]);
        StoreBlockOutput(lanes, bias, valid, y + r * n);
      }
    }
  }
};

// Dequantizes the chunk in registers, multiplies it into Mr tokens and, when more tiles
// follow (kStore), stores it into panel[(c - c0) * 16 + r].
template <typename Decoder, int Mr, bool kStore>
void DecodeTile(const MatmulArgs& a, float* panel, const TileCall& call, const uint8_t* prefetch) {
  constexpr int kCols = Decoder::kColsPerLine;
  const PackedWeight& w = *a.weight;
  const int64_t k = w.cols, group = w.group_size;
  const uint8_t* data = KernelBlockData(a, call.block);
  const float* x = a.x + call.token0 * k;
  const Decoder decoder(w);
  Accumulators<Mr> out(a, call);
  __m256 acc[Mr][2];  // local copies, as in PanelTile
#pragma GCC unroll 8
  for (int r = 0; r < Mr; ++r) acc[r][0] = out.acc[r][0], acc[r][1] = out.acc[r][1];
  const int64_t c1 = call.c0 + call.cols;
  for (int64_t c = call.c0; c < c1;) {
    const int64_t g = c / group;
    const int64_t group_end = std::min(c1, (g + 1) * group);
    const typename Decoder::Group grp = Decoder::LoadGroup(w, call.block, g);
    for (int64_t line = c / kCols; line < group_end / kCols; ++line) {
      if (prefetch != nullptr) {
        _mm_prefetch(reinterpret_cast<const char*>(prefetch + line * 64), _MM_HINT_T1);
      }
      const typename Decoder::Line bytes = decoder.LoadLine(data, line);
      const int64_t col0 = line * kCols;
      float* dst = panel + (col0 - call.c0) * kRowBlock;
      Unrolled(
          [&](auto col_constant) {
            constexpr int kCol = decltype(col_constant)::value;
            const __m256 lo = decoder.template Column<kCol>(bytes, grp, 0);
            const __m256 hi = decoder.template Column<kCol>(bytes, grp, 1);
            if constexpr (kStore) {
              _mm256_store_ps(dst + kCol * kRowBlock, lo);
              _mm256_store_ps(dst + kCol * kRowBlock + 8, hi);
            }
#pragma GCC unroll 8
            for (int r = 0; r < Mr; ++r) {
              const __m256 xv = _mm256_broadcast_ss(x + r * k + col0 + kCol);
              acc[r][0] = _mm256_fmadd_ps(lo, xv, acc[r][0]);
              acc[r][1] = _mm256_fmadd_ps(hi, xv, acc[r][1]);
            }
          },
          std::make_integer_sequence<int, kCols>{});
    }
    c = group_end;
  }
#pragma GCC unroll 8
  for (int r = 0; r < Mr; ++r) out.acc[r][0] = acc[r][0], out.acc[r][1] = acc[r][1];
  out.Store(a, call);
}

// y (+)= panel chunk x activations for Mr tokens.
template <int Mr>
void PanelTile(const MatmulArgs& a, const float* panel, const TileCall& call) {
  const int64_t k = a.weight->cols;
  const float* x = a.x + call.token0 * k + call.c0;
  Accumulators<Mr> out(a, call);
  // Local copies, loops over r unrolled: otherwise GCC keeps the 12 sums in memory (their
  // struct's address escapes to Store) and stores them every column, halving the FMA rate.
  __m256 acc[Mr][2];
#pragma GCC unroll 8
  for (int r = 0; r < Mr; ++r) acc[r][0] = out.acc[r][0], acc[r][1] = out.acc[r][1];
  const int64_t cols = call.cols;
  for (int64_t c = 0; c < cols; ++c) {
    const __m256 lo = _mm256_load_ps(panel + c * kRowBlock);
    const __m256 hi = _mm256_load_ps(panel + c * kRowBlock + 8);
#pragma GCC unroll 8
    for (int r = 0; r < Mr; ++r) {
      const __m256 xv = _mm256_broadcast_ss(x + r * k + c);
      acc[r][0] = _mm256_fmadd_ps(lo, xv, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(hi, xv, acc[r][1]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < Mr; ++r) out.acc[r][0] = acc[r][0], out.acc[r][1] = acc[r][1];
  out.Store(a, call);
}

// The scales (and INT4 mins) of group g of a row block; past the last group this is the
// next block's, which the next GemvTile reads. Prefetching never faults.
inline void PrefetchGroup(const GroupArrays& arrays, const PackedWeight& w, int64_t block,
                          int64_t g) {
  const int64_t offset = (block * (w.cols / w.group_size) + g) * kRowBlock * arrays.element_bytes;
  _mm_prefetch(arrays.scales + offset, _MM_HINT_T0);
  if (arrays.mins != nullptr) _mm_prefetch(arrays.mins + offset, _MM_HINT_T0);
}

// m = 1: Nb row blocks in lockstep over all of k. Each output is still one FMA chain over k
// in column order from zero, bias added last (DecodeTile's bits), but with 2 * Nb
// independent chains instead of DecodeTile's 2, which wait on the FMA latency (4 cycles
// per column). Measured (Zen 4, 1 thread, CPU time, 1536x576 in cache): INT4 14.0 -> 17.7,
// INT8 14.0 -> 20.5 GMAC per CPU-second; the tile kernel runs 22.9 / 24.0 (it applies the
// scale once per group, where exact dequantization costs one more FMA per weight).
// flatten: every decoder call and Unrolled lambda inlined (with INT5's 4 lines x 3 blocks x
// 8 columns unrolled GCC otherwise left some out of line, each a call per line).
template <typename Decoder, int Nb>
__attribute__((flatten)) void GemvTile(const MatmulArgs& a, int64_t block0) {
  constexpr int kCols = Decoder::kColsPerLine;
  const PackedWeight& w = *a.weight;
  const int64_t k = w.cols, group = w.group_size, n = w.rows;
  const int64_t block_bytes = BlockDataBytes(KernelFormat(a), k);
  const uint8_t* data = KernelBlockData(a, block0);
  const Decoder decoder(w);
  const GroupArrays arrays(w);
  // Every index into acc and grp is a compile-time constant (Unrolled over the blocks
  // too): with a loop index GCC keeps the sums on the stack, a store-forwarding round
  // trip per FMA, slower than the one-block kernel.
  constexpr auto kBlocks = std::make_integer_sequence<int, Nb>{};
  __m256 acc[Nb][2];
  Unrolled([&](auto j) { acc[j][0] = acc[j][1] = _mm256_setzero_ps(); }, kBlocks);
  for (int64_t g = 0; g < k / group; ++g) {
    typename Decoder::Group grp[Nb];
    Unrolled([&](auto j) { grp[j] = Decoder::LoadGroup(w, block0 + j, g); }, kBlocks);
    Unrolled([&](auto j) { PrefetchGroup(arrays, w, block0 + j, g + kGemvPrefetchGroups); },
             kBlocks);
    constexpr int kStep = Decoder::kLinesPerStep;  // divides a group's lines (k % 32 == 0)
    for (int64_t step = g * group / kCols; step < (g + 1) * group / kCols; step += kStep) {
      typename Decoder::Bits bits[Nb];
      if constexpr (kStep > 1) {
        Unrolled([&](auto j) { bits[j] = decoder.LoadBits(data + j * block_bytes, step); },
                 kBlocks);
      }
      Unrolled(
          [&](auto line_constant) {
            constexpr int kL = decltype(line_constant)::value;
            const int64_t line = step + kL;
            const float* x = a.x + line * kCols;
            Unrolled(
                [&](auto j) {
                  const uint8_t* block = data + j * block_bytes;
                  _mm_prefetch(
                      reinterpret_cast<const char*>(block + (line + kGemvPrefetchLines) * 64),
                      _MM_HINT_T0);
                  typename Decoder::Line bytes;
                  if constexpr (kStep > 1) {
                    bytes = decoder.template LoadLineAt<kL>(block, line, bits[j]);
                  } else {
                    bytes = decoder.LoadLine(block, line);
                  }
                  Unrolled(
                      [&](auto col_constant) {
                        constexpr int kCol = decltype(col_constant)::value;
                        const __m256 xv = _mm256_broadcast_ss(x + kCol);
                        acc[j][0] = _mm256_fmadd_ps(decoder.template Column<kCol>(bytes, grp[j], 0),
                                                    xv, acc[j][0]);
                        acc[j][1] = _mm256_fmadd_ps(decoder.template Column<kCol>(bytes, grp[j], 1),
                                                    xv, acc[j][1]);
                      },
                      std::make_integer_sequence<int, kCols>{});
                },
                kBlocks);
          },
          std::make_integer_sequence<int, kStep>{});
    }
  }
  Unrolled(
      [&](auto j) {
        const int64_t row0 = (block0 + j) * kRowBlock;
        const int64_t valid = std::min<int64_t>(kRowBlock, n - row0);
        alignas(32) float lanes[kRowBlock];
        _mm256_store_ps(lanes, acc[j][0]);
        _mm256_store_ps(lanes + 8, acc[j][1]);
        StoreBlockOutput(lanes, a.bias != nullptr ? a.bias + row0 : nullptr, valid, a.y + row0);
      },
      kBlocks);
}

using DecodeTileFn = void (*)(const MatmulArgs&, float*, const TileCall&, const uint8_t*);
using PanelTileFn = void (*)(const MatmulArgs&, const float*, const TileCall&);

template <typename Decoder>
struct TileTable {
  DecodeTileFn decode[kDecodeMr + 1][2] = {};
  PanelTileFn panel[kMaxMr + 1] = {};
  constexpr TileTable() {
    FillDecode<1>();
    FillPanel<1>();
  }
  template <int Mr>
  constexpr void FillDecode() {
    if constexpr (Mr <= kDecodeMr) {
      decode[Mr][0] = &DecodeTile<Decoder, Mr, false>;
      decode[Mr][1] = &DecodeTile<Decoder, Mr, true>;
      FillDecode<Mr + 1>();
    }
  }
  template <int Mr>
  constexpr void FillPanel() {
    if constexpr (Mr <= kMaxMr) {
      panel[Mr] = &PanelTile<Mr>;
      FillPanel<Mr + 1>();
    }
  }
};

template <typename Decoder>
void RunGemm(const MatmulArgs& a, int64_t block_begin, int64_t block_end) {
  static constexpr TileTable<Decoder> table;
  const PackedWeight& w = *a.weight;
  const int64_t k = w.cols;
  const int64_t scale_groups = k / w.group_size;
  if (a.m == 1) {
    int64_t b = block_begin;
    constexpr int kGemvBlocks = Decoder::kGemvBlocks;
    for (; b + kGemvBlocks <= block_end; b += kGemvBlocks) GemvTile<Decoder, kGemvBlocks>(a, b);
    for (; b < block_end; ++b) GemvTile<Decoder, 1>(a, b);
    return;
  }
  float* const panel = ThreadScratch(kRowBlock * kChunkCols);

  // Balanced column chunks of at most kChunkCols, multiples of 32 (k is one).
  const int64_t num_chunks = (k + kChunkCols - 1) / kChunkCols;
  const int64_t chunk_cols = ((k + num_chunks - 1) / num_chunks + 31) / 32 * 32;
  const int64_t panel_tokens =
      std::max<int64_t>(kMaxMr, TokenPanelBytes() / (k * static_cast<int64_t>(sizeof(float))));
  const int64_t num_token_panels = (a.m + panel_tokens - 1) / panel_tokens;
  const GroupArrays arrays(w);
  for (int64_t p = 0; p < num_token_panels; ++p) {
    const int64_t t0 = a.m * p / num_token_panels, t1 = a.m * (p + 1) / num_token_panels;
    const int64_t decode_tokens = std::min<int64_t>(kDecodeMr, t1 - t0);
    const int64_t rest = t1 - t0 - decode_tokens;
    const int64_t num_tiles = (rest + kMaxMr - 1) / kMaxMr;
    for (int64_t b = block_begin; b < block_end; ++b) {
      const uint8_t* prefetch = nullptr;
      if (b + 1 < block_end) {
        prefetch = KernelBlockData(a, b + 1);
        const int64_t bytes = scale_groups * kRowBlock * arrays.element_bytes;
        const int64_t first = (b + 1) * bytes;
        for (int64_t offset = 0; offset < bytes; offset += 64) {
          _mm_prefetch(arrays.scales + first + offset, _MM_HINT_T1);
          if (arrays.mins != nullptr) _mm_prefetch(arrays.mins + first + offset, _MM_HINT_T1);
        }
      }
      for (int64_t c0 = 0; c0 < k; c0 += chunk_cols) {
        TileCall call{b, t0, c0, std::min(chunk_cols, k - c0), c0 == 0, c0 + chunk_cols >= k};
        table.decode[decode_tokens][num_tiles > 0](a, panel, call, prefetch);
        for (int64_t tile = 0, t = t0 + decode_tokens; tile < num_tiles; ++tile) {
          const int64_t t_end = t0 + decode_tokens + rest * (tile + 1) / num_tiles;
          call.token0 = t;
          table.panel[t_end - t](a, panel, call);
          t = t_end;
        }
      }
    }
  }
}

}  // namespace

void MatmulF32ActGemmBlocksAvx2(const MatmulArgs& a, int64_t block_begin, int64_t block_end) {
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
