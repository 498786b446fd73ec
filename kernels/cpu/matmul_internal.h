#pragma once

// Internal to kernels/cpu: the packed weight layout shared by weights.cc and the matmul
// kernels, activation quantization, and the per-ISA kernel entry points. Nothing outside
// kernels/cpu (and its tests and benchmark) includes this header.

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "kernels/cpu/weights.h"

namespace loom::kernels::cpu::internal {

/// Weight rows are interleaved in blocks of kRowBlock (rows padded with zeros to a
/// multiple of it). Within a block of 16 rows:
///   F32 / F16: [cols][16]                 value (r, c) at c * 16 + r
///   BF16:      [cols32 / 2][16][2] uint16 value (r, c) at (c / 2) * 32 + r * 2 + c % 2,
///              cols32 = cols rounded up to 32, the columns past cols zero: AMX-BF16's
///              B-tile layout (a 64-byte line is 16 rows x one column pair, and 16 lines,
///              32 columns, are one tile); as 16 dwords a line holds column c in the low
///              halves and c + 1 in the high ones (one shift or mask each to F32)
///   INT8:      [cols / 4][16][4] uint8    byte  (r, c) at (c / 4) * 64 + r * 4 + c % 4,
///              holding q + 128 (offset binary, so VNNI's unsigned operand is the weight)
///   INT4:      [cols / 8][16][4] uint8    byte  (r, c) at (c / 8) * 64 + r * 4 + c % 4,
///              low nibble for c % 8 < 4, high nibble for c % 8 >= 4
///   NL4:       INT4's layout for the codes
///   INT5:      INT4's layout for the low 4 bits of q, then the fifth bits at byte
///              cols * 8 of the block: [cols / 32][16] uint32, one dword per row and 32
///              columns; column 32 G + 8 L + 4 s + j (line L of the group, nibble s,
///              byte j) is bit 8 j + 2 L + s of dword (G, r). Shifted right by 2 L and
///              masked per byte, a line's fifth bits sit under its two nibble halves.
///   scales / mins (F16): [cols / group_size][16] per block.
/// One 64-byte line thus feeds one VNNI dot product of 16 rows x 4 columns.
inline constexpr int64_t kRowBlock = 16;
/// Activations are quantized to int8 in groups of this many columns (INT8/INT4 weights).
inline constexpr int64_t kActGroup = 32;

inline int64_t NumRowBlocks(int64_t rows) { return (rows + kRowBlock - 1) / kRowBlock; }

/// This thread's scratch of at least `count` floats, 64-byte aligned, kept between calls
/// (grown, never shrunk). On the heap, not a thread_local array: static TLS is reserved in
/// every thread of the process, including civetweb's small-stack threads behind the
/// metrics endpoint, which crash once the TLS block outgrows their stacks (a TP worker's
/// /metrics segfaulted with both GEMMs' 36 KiB panels in static TLS).
inline float* ThreadScratch(size_t count) {
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  thread_local std::unique_ptr<float, Free> buffer;
  thread_local size_t capacity = 0;
  if (capacity < count) {
    const size_t bytes = (count * sizeof(float) + 63) / 64 * 64;
    buffer.reset(static_cast<float*>(std::aligned_alloc(64, bytes)));
    capacity = buffer != nullptr ? count : 0;
  }
  return buffer.get();
}

/// A BF16 weight's columns as stored: rounded up to a whole AMX tile (32).
inline int64_t Bf16PaddedCols(int64_t cols) { return (cols + 31) / 32 * 32; }
/// Index of BF16 element (r, c) inside its row block's uint16 values (r < 16).
inline int64_t Bf16Index(int64_t r, int64_t c) { return (c / 2) * 32 + r * 2 + c % 2; }

/// Bytes of `data` per row block.
inline int64_t BlockDataBytes(WeightFormat format, int64_t cols) {
  switch (format) {
    case WeightFormat::kF32:
      return cols * kRowBlock * 4;
    case WeightFormat::kF16:
      return cols * kRowBlock * 2;
    case WeightFormat::kBf16:
      return Bf16PaddedCols(cols) * kRowBlock * 2;
    case WeightFormat::kInt8:
      return cols * kRowBlock;
    case WeightFormat::kInt4:
    case WeightFormat::kNl4:
      return cols * kRowBlock / 2;
    case WeightFormat::kInt5:
      return cols * kRowBlock / 2 + cols * kRowBlock / 8;
  }
  return 0;
}

/// Byte offset of the INT5 high-bit dword of (row r of a block, 32-column group G).
inline int64_t Int5HighOffset(int64_t cols, int64_t r, int64_t group32) {
  return cols * kRowBlock / 2 + (group32 * kRowBlock + r) * 4;
}
/// Bit of column c inside its INT5 high-bit dword.
inline int Int5HighBit(int64_t c) {
  const int64_t j = c % 4, s = (c / 4) % 2, line = (c / 8) % 4;
  return static_cast<int>(8 * j + 2 * line + s);
}

/// Byte offset of element (r, c) inside its row block (r < 16) for the integer formats
/// (INT5: of its low 4 bits).
inline int64_t IntByteOffset(WeightFormat format, int64_t r, int64_t c) {
  return format == WeightFormat::kInt8 ? (c / 4) * 64 + r * 4 + c % 4
                                       : (c / 8) * 64 + r * 4 + c % 4;
}

/// IEEE binary16 -> binary32 (exact), portable.
inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {  // subnormal: normalize
    exponent = 113;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    bits = sign | (exponent << 23) | ((mantissa & 0x3ffu) << 13);
  }
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

/// Activations quantized per kActGroup columns: x ≈ scale[g] * q[c] with q in [-127, 127]
/// (round to nearest even of x * 127 / max|x| over the group).
struct QuantizedActivations {
  const int8_t* q = nullptr;      // [m, k]
  const float* scale = nullptr;   // [m, k / kActGroup]
  const int32_t* qsum = nullptr;  // [m, k / kActGroup]: sum of q over the group
};

/// Quantizes rows of x [num_rows, k] (k % kActGroup == 0). Deterministic and identical
/// on every ISA (the tests rebuild the kernels' input with it).
void QuantizeActivationRows(const float* x, int64_t num_rows, int64_t k, int8_t* q,
                            float* scale, int32_t* qsum);
/// The same with `group` columns per scale (k % group == 0): the K-quant int8 path.
void QuantizeActivationRowsInGroups(const float* x, int64_t num_rows, int64_t k, int64_t group,
                                    int8_t* q, float* scale, int32_t* qsum);
void QuantizeActivationRowsAvx512(const float* x, int64_t num_rows, int64_t k, int8_t* q,
                                  float* scale, int32_t* qsum);

/// What a kernel computes: y[r, n] for rows r < m and weight row blocks [block_begin,
/// block_end). Float formats and the float-activation integer kernels read x; the int8
/// activation kernels read xq.
struct MatmulArgs {
  const PackedWeight* weight = nullptr;
  const float* x = nullptr;   // [m, k]
  QuantizedActivations xq;    // int8-activation kernels only
  // INT4 float-activation kernels only: sum of x over each weight group (applies the
  // group's min once per group), [m, k / group_size].
  const float* x_group_sum = nullptr;
  // F32-scaled weights with int8 activations: columns per activation scale (xq.scale is
  // [m, k / xq_group]; 256 as llama.cpp's Q8_K where k allows) and the sums of xq over each
  // 16 columns, [m, k / 16].
  int64_t xq_group = kActGroup;
  const int32_t* xq_sum16 = nullptr;
  const float* bias = nullptr;  // [n] or nullptr
  float* y = nullptr;         // [m, n]
  int64_t m = 0;
  // NL4 weights: row blocks from `expanded_begin` on, widened to INT8 into this thread's
  // scratch (Matmul widens a few blocks at a time and runs the INT8 kernels over them);
  // null for every other format.
  const uint8_t* expanded = nullptr;
  int64_t expanded_begin = 0;
  // The AMX GEMMs only (PrepareAmxActivations): each token's activation scale, sum term and
  // (K-quant INT8) offset per product group, per 16-token tile and group as 16 consecutive
  // values; the tokens of whole tiles, [m / 16 * 16, groups].
  const float* amx_scales = nullptr;
  const int32_t* amx_terms = nullptr;
  const int32_t* amx_offsets = nullptr;
  // BF16 activations (PrepareBf16Activations): x rounded to BF16, [m rounded up to 16,
  // bf16_k], bf16_k = k rounded up to 32, zero-padded.
  const uint16_t* x_bf16 = nullptr;
  int64_t bf16_k = 0;
};

/// The format the kernels read: INT8 for an NL4 weight (widened as they go), else the
/// weight's own.
inline WeightFormat KernelFormat(const MatmulArgs& a) {
  return a.expanded != nullptr ? WeightFormat::kInt8 : a.weight->format;
}
/// Row block `block`'s bytes in KernelFormat's layout.
inline const uint8_t* KernelBlockData(const MatmulArgs& a, int64_t block) {
  const int64_t bytes = BlockDataBytes(KernelFormat(a), a.weight->cols);
  return a.expanded != nullptr ? a.expanded + (block - a.expanded_begin) * bytes
                               : a.weight->data.data() + block * bytes;
}

/// Widens NL4 row blocks [block_begin, block_end) into INT8's layout at `out` (each code's
/// level + 128): the scalar loop and the AVX2 one (a byte shuffle per 32 codes).
void ExpandNl4BlocksScalar(const PackedWeight& w, int64_t block_begin, int64_t block_end,
                           uint8_t* out);
void ExpandNl4BlocksAvx2(const PackedWeight& w, int64_t block_begin, int64_t block_end,
                         uint8_t* out);

using MatmulBlocksFn = void (*)(const MatmulArgs& args, int64_t block_begin, int64_t block_end);

void MatmulBlocksScalar(const MatmulArgs& args, int64_t block_begin, int64_t block_end);
void MatmulBlocksAvx2(const MatmulArgs& args, int64_t block_begin, int64_t block_end);
void MatmulBlocksAvx512(const MatmulArgs& args, int64_t block_begin, int64_t block_end);

/// q of (row r < 16, column c) in a row block's `data` of an integer format, `cols` wide:
/// INT8 signed, INT4 0..15, INT5 0..31. The scalar kernels read weights through it.
inline int BlockQ(const uint8_t* data, WeightFormat format, int64_t cols, int64_t r, int64_t c) {
  const uint8_t byte = data[IntByteOffset(format, r, c)];
  if (format == WeightFormat::kInt8) return static_cast<int>(byte) - 128;
  int q = c % 8 < 4 ? (byte & 0x0f) : (byte >> 4);
  if (format == WeightFormat::kInt5) {
    uint32_t high;
    std::memcpy(&high, data + Int5HighOffset(cols, r, c / 32), sizeof(high));
    q |= static_cast<int>((high >> Int5HighBit(c)) & 1u) << 4;
  }
  return q;
}

/// The scalar kernels' exact integer dot products of a row block's 16 rows (`data` in the
/// packed layout of `format`, `cols` wide) with int8 activations `xq` over columns
/// [c0, c1), added to dot[r].
inline void AddScalarIntegerDots(const uint8_t* data, WeightFormat format, int64_t cols,
                                 const int8_t* xq, int64_t c0, int64_t c1, int32_t* dot) {
  for (int64_t c = c0; c < c1; ++c) {
    for (int r = 0; r < kRowBlock; ++r) dot[r] += BlockQ(data, format, cols, r, c) * xq[c];
  }
}

/// Token t's integer activation sum over columns [c0, c0 + count) (multiples of 16).
inline int32_t GroupActivationSum(const MatmulArgs& a, int64_t t, int64_t c0, int64_t count) {
  const int64_t per_token = a.weight->cols / 16;
  int32_t sum = 0;
  for (int64_t j = c0 / 16; j < (c0 + count) / 16; ++j) sum += a.xq_sum16[t * per_token + j];
  return sum;
}

/// F32-scaled INT8/INT4 weights (K-quants) against int8 activations
/// (matmul_kquant_int8act.cc): exact integer dot products per weight group, the same bits
/// on every ISA.
void MatmulKQuantInt8ActBlocksScalar(const MatmulArgs& args, int64_t block_begin,
                                     int64_t block_end);
void MatmulKQuantInt8ActBlocksAvx2(const MatmulArgs& args, int64_t block_begin,
                                   int64_t block_end);
void MatmulKQuantInt8ActBlocksAvx512(const MatmulArgs& args, int64_t block_begin,
                                     int64_t block_end);
/// The AVX-512 one over tokens [t_begin, t_end) only.
void MatmulKQuantInt8ActTokensAvx512(const MatmulArgs& args, int64_t block_begin, int64_t block_end,
                                     int64_t t_begin, int64_t t_end);

/// INT8/INT4 weights against float activations: each group of a weight row contributes
///   INT8: scale * sum_c q_c x_c
///   INT4: scale * sum_c (q_c - 8) x_c + (min + 8 * scale) * x_group_sum
/// (centring the nibble keeps the partial sums small), accumulated in float.
void MatmulF32ActBlocksScalar(const MatmulArgs& args, int64_t block_begin, int64_t block_end);
void MatmulF32ActBlocksAvx2(const MatmulArgs& args, int64_t block_begin, int64_t block_end);
void MatmulF32ActBlocksAvx512(const MatmulArgs& args, int64_t block_begin, int64_t block_end);

/// INT8/INT4 weights against float activations for batches of tokens: each panel of 32
/// weight rows is dequantized once per call, chunk by chunk of columns, into a
/// per-thread float scratch (the floats DequantizeRows gives), and a register-blocked
/// float microkernel runs every token over it. Matmul takes it for
/// m >= F32ActGemmMinTokens() where the CPU has AVX-512.
void MatmulF32ActGemmBlocksAvx512(const MatmulArgs& args, int64_t block_begin,
                                  int64_t block_end);
/// The same on AVX2 (one 16-row panel, 6 x 16 microkernel), bit-identical to the AVX-512
/// kernel (one FMA chain over k per output): Matmul takes it on AVX2 as above.
void MatmulF32ActGemmBlocksAvx2(const MatmulArgs& args, int64_t block_begin,
                                int64_t block_end);

/// Fewest tokens for which Matmul uses the GEMM kernel above. 1: every m, so a token's
/// result is the same bits whatever else is in its batch (the two kernels round
/// differently, and seeded sampling must not depend on batch composition). It costs
/// 0-7% at m = 1 and 10-15% at m = 2..4 against the tile kernel (bench/cpu_kernels_bench
/// --section sweep). On AVX2 (matmul_f32act_gemm_avx2) m = 1 costs more: with the
/// weights in cache the GEMM ran 28 against the tile kernel's 46 GFLOP per CPU-second on
/// Zen 4 (one FMA chain per output waits on the FMA latency, and exact dequantization
/// costs one more FMA per weight). Running 3-4 row blocks in lockstep at m = 1 (the same
/// bits) lifted that to 35 (INT4) / 41 (INT8) against the tile kernel's 46 / 48, and
/// single-stream AVX2 decode of the default model (engine_bench --only-batch 1, 9
/// alternating runs each, medians, on a 2-core machine shared with other jobs) ran 34.1
/// tok/s (1 thread; 2 threads 20.8) against 32.8 (21.0) before and 29.2 (20.2) with the
/// tile kernel at m = 1: no measurable cost, so the rule stays: one kernel for every m,
/// batch invariance kept. Decode, which streams
/// the weights from memory, hides part of it. The tile kernels stay the bench baseline
/// (and run when the threshold is moved).
inline constexpr int64_t kF32ActGemmMinTokens = 1;
int64_t F32ActGemmMinTokens();
/// Test/bench hook: moves that threshold (<= 0 restores kF32ActGemmMinTokens).
/// Not thread-safe against concurrent Matmul calls.
void SetF32ActGemmMinTokensForTesting(int64_t min_tokens);

/// INT8/INT4 weights against int8 activations for batches of tokens: token panels sized
/// from the L2 cache (read at start-up) pass under each row block of weights, tiles of a
/// few tokens x 16 (AVX2) or 32 (AVX-512) rows reuse every unpacked weight vector from
/// registers.
/// AVX2: vpmaddubsw + vpmaddwd (INT4 sums a 32-column group in int16 first, exactly);
/// AVX-512: VNNI. Each group's exact integer dot product is applied with the tile
/// kernels' float operations in their order, so the result is the same bits as
/// MatmulBlocksAvx2/Avx512's, on both ISAs, for every m and thread count.
void MatmulInt8ActGemmBlocksAvx2(const MatmulArgs& args, int64_t block_begin,
                                 int64_t block_end);
void MatmulInt8ActGemmBlocksAvx512(const MatmulArgs& args, int64_t block_begin,
                                   int64_t block_end);
/// The AVX-512 one over tokens [t0, t1) only.
void MatmulInt8ActGemmTokensAvx512(const MatmulArgs& args, int64_t block_begin, int64_t block_end,
                                   int64_t t0, int64_t t1);

/// The int8-activation GEMM on AMX (CpuIsa::kAmx; matmul_int8act_gemm_amx.cc): each
/// 32-column group of 16 tokens x 16 weight rows is one TDPBSUD (the activations signed,
/// the weights' offset-binary or widened nibble bytes unsigned, read in their packed
/// layout, which is AMX's VNNI B layout), stored and applied with the AVX-512 kernels'
/// float operations in their order: the same bits as MatmulInt8ActGemmBlocksAvx512. The
/// last m % 16 tokens run on that kernel.
void MatmulInt8ActGemmBlocksAmx(const MatmulArgs& args, int64_t block_begin, int64_t block_end);
/// The K-quant kernel on AMX (matmul_int8act_gemm_amx.cc): one TDPBSUD per weight group
/// (16, 32 or 64 columns: KQuantAmxSupports) of 16 tokens x 16 rows, applied with
/// MatmulKQuantInt8ActBlocksAvx512's float operations in its order (the same bits); the
/// last m % 16 tokens run on that kernel.
bool KQuantAmxSupports(const PackedWeight& w);
void MatmulKQuantInt8ActBlocksAmx(const MatmulArgs& args, int64_t block_begin, int64_t block_end);
/// Lays out the quantized activations' per-group values the AMX GEMMs read (MatmulArgs::
/// amx_*), once per Matmul call before its threads start, into the calling thread's
/// buffers (kept until its next call).
void PrepareAmxActivations(MatmulArgs& args);
/// Fewest tokens for which Matmul takes the AMX GEMMs over the AVX-512 kernels (one full
/// tile of tokens; the same bits either way).
inline constexpr int64_t kAmxMinTokens = 16;
/// Whether Matmul's int8-activation GEMM uses AMX now: ActiveCpuIsa() is kAmx, the matmul
/// ISA is AVX-512 and SetAmxAllowedForTesting has not turned it off.
bool AmxInUse();
/// Test/bench hook: false keeps the int8-activation GEMM on AVX-512 VNNI on an AMX CPU
/// (true, the default, restores AMX). Not thread-safe against concurrent Matmul calls.
void SetAmxAllowedForTesting(bool allowed);

/// BF16 activations on AMX-BF16 tiles (matmul_bf16act_amx.cc), every weight format and every
/// m: each panel of 32 weight rows dequantized once per call to BF16 in AMX's B layout (a BF16
/// weight's row blocks are that layout already and are read as they are), then
/// every 16-token tile of x_bf16 run over it (TDPBF16PS, F32 sums in column order, a token's
/// result independent of its batch).
void MatmulBf16ActBlocksAmx(const MatmulArgs& args, int64_t block_begin, int64_t block_end);
/// Rounds x to BF16 into MatmulArgs::x_bf16 (the calling thread's buffer, kept until its next
/// call), once per Matmul call before its threads start.
void PrepareBf16Activations(MatmulArgs& args);

/// Fewest tokens for which Matmul takes the int8-activation GEMM above on AVX2/AVX-512
/// (the tile kernels below it). Both give the same bits, so this is a speed choice only
/// and batch invariance holds either way (tests/kernels/matmul_test.cc checks both). 2:
/// at m = 1 the tile kernels ran as fast (AVX-512 runs the same GEMV tile). INT8 weights
/// on AVX2 stay on the tile kernel for every m (the GEMM ran 3-13% slower there, 1 thread,
/// CPU time: bench/results/cpu_kernels_avx2_a8gemm.json); INT4 on AVX2 gains 4-7%.
inline constexpr int64_t kInt8ActGemmMinTokens = 2;
int64_t Int8ActGemmMinTokens();
/// Test/bench hook: moves that threshold, for every format and ISA, AVX2 INT8 included
/// (<= 0 restores kInt8ActGemmMinTokens and the AVX2 INT8 exception).
/// Not thread-safe against concurrent Matmul calls.
void SetInt8ActGemmMinTokensForTesting(int64_t min_tokens);

/// Instruction sets Matmul can run; kAuto picks the best the CPU supports.
enum class MatmulIsaChoice { kAuto, kScalar, kAvx2, kAvx512 };

/// True when the kernels may run `isa`: this CPU has it and LOOM_CPU_ISA (ActiveCpuIsa(),
/// kernels/cpu/cpu_isa.h) does not cap it below. Every dispatch point asks this.
bool IsaSupported(MatmulIsaChoice isa);

/// The ISA of the kernel the latest Matmul call ran (kAuto before the first); for tests.
MatmulIsaChoice LastMatmulIsa();

/// Test/bench hook: forces Matmul onto `isa` (kAuto restores the automatic choice).
/// Not thread-safe against concurrent Matmul calls.
void SetMatmulIsaForTesting(MatmulIsaChoice isa);

/// A weight's scale and min arrays as bytes, whichever precision it stores (for prefetching).
struct GroupArrays {
  const char* scales;
  const char* mins;  // nullptr for an F16-scaled INT8 weight
  int64_t element_bytes;
  explicit GroupArrays(const PackedWeight& w)
      : scales(w.f32_scaled() ? reinterpret_cast<const char*>(w.scales_f32.data())
                              : reinterpret_cast<const char*>(w.scales.data())),
        mins(w.f32_scaled()    ? reinterpret_cast<const char*>(w.mins_f32.data())
             : !w.mins.empty() ? reinterpret_cast<const char*>(w.mins.data())
                               : nullptr),
        element_bytes(w.f32_scaled() ? 4 : 2) {}
};

/// Stores the 16 lanes of one output block, only the `valid` first ones, adding bias.
inline void StoreBlockOutput(const float* lanes, const float* bias, int64_t valid, float* y) {
  if (bias != nullptr) {
    for (int64_t i = 0; i < valid; ++i) y[i] = lanes[i] + bias[i];
  } else {
    for (int64_t i = 0; i < valid; ++i) y[i] = lanes[i];
  }
}

}  // namespace loom::kernels::cpu::internal
