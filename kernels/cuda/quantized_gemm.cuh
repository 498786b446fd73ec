#pragma once

// Internal to kernels/cuda (quantized_gemm.cu and quantized_gemm_f32_scales.cu): the W4A16 /
// W8A16 kernel family and its launch.
//
// Orientation. The weights are the mma A operand (16 output features x 16 input features)
// and the activations the B operand (16 input features x 8 tokens), so one token wastes
// 7/8 of an mma, not 15/16: Y^T = W · X^T. The accumulator C[16 x 8] is (output feature,
// token).
//
// mma.sync.aligned.m16n8k16 fragments for .f16/.bf16 inputs and .f32 accumulators (PTX
// ISA, "Matrix Fragments for mma.m16n8k16 with floating point type", section 9.7.14.5.8 in
// PTX ISA 8.x). With g = lane / 4 and t = lane % 4, each .b32 register holds two elements,
// the lower-indexed one in the low 16 bits:
//   A (row-major 16 x 16):  a0 = (row g,     cols 2t,     2t + 1)
//                           a1 = (row g + 8, cols 2t,     2t + 1)
//                           a2 = (row g,     cols 2t + 8, 2t + 9)
//                           a3 = (row g + 8, cols 2t + 8, 2t + 9)
//   B (16 x 8, "col"):      b0 = (rows 2t,     2t + 1, col g)
//                           b1 = (rows 2t + 8, 2t + 9, col g)
//   C/D (16 x 8, f32):      c0, c1 = (row g,     cols 2t, 2t + 1)
//                           c2, c3 = (row g + 8, cols 2t, 2t + 1)
//
// K permutation. An mma sums over its 16 k indices in any order, so any permutation of the
// input features applied to both operands gives the same product. Within each 32-column
// half of a 64-column chunk (two k16 steps j = 0, 1) we map the mma k index 2t + e
// (e = 0, 1) of step j to input feature 8t + 4j + e and the index 2t + 8 + e to
// 8t + 4j + 2 + e. Lane t's B registers of both steps are then the 8 consecutive input
// features 8t .. 8t + 7 of its token: one 16-byte shared-memory load (b0, b1 of step 0,
// b0, b1 of step 1), straight from X's natural layout. The weights are packed at load time
// with the same permutation (PackInt4ForGpu / PackInt8ForGpu).
//
// Device weight layout (16 output features = one row tile):
//   INT4: [n / 16][k / 64][32 lanes][16 bytes]. Lane (g, t)'s 16 bytes are four 32-bit
//     words; word 2 * half + j holds the 8 values of its A fragment for k16 step j of the
//     32-column half `half`: nibble i of the word (bits 4i .. 4i + 3) is, for i = 0..3,
//     the low element of a_i and, for i = 4..7, the high element of a_(i-4). So
//     ((word >> 4i) & 0x000f000f) holds both elements of a_i, one per 16-bit half.
//   INT8: [n / 16][k / 32][32 lanes][16 bytes]. Word 2j: bytes (a0.lo, a0.hi, a1.lo,
//     a1.hi); word 2j + 1: (a2.lo, a2.hi, a3.lo, a3.hi), for k16 step j of the 32 columns.
//   INT4 scale/min: F16 [n / 16][k / group][8][4] = (scale of row g, scale of row g + 8,
//     min of row g, min of row g + 8) for the lanes of group g (64 bytes per tile and group).
//     Group-wise INT8 takes the same layout with zero mins (QuantScaleType::kF16), or F32
//     (scale of row g, scale of row g + 8) pairs (kF32, 64 bytes), or F32 quadruples with mins
//     (kF32WithMin, 128 bytes): the K-quants' scales, d * an integer, exact in F32 only.
// Every warp-wide weight load is 512 contiguous bytes; shared-memory reads of the weights
// are 16 bytes per lane at consecutive addresses (conflict-free).
//
// Dequantization in registers. INT4: OR-ing a nibble into the mantissa of the F16 1024.0
// (0x6400) or the BF16 128.0 (0x4300) gives 1024 + q (128 + q) exactly; subtracting the
// magic is exact; one fused q * scale + min (hfma2) rounds once to the activation type.
// In F16 the odd nibbles stay where they are (bits 4-7 of each half: 1024 + 16q, and one
// hfma2 by 1/16 minus 64 is q exactly), so a word takes one shift, not three; each mask-and-
// OR is one lop3 (AndOr). Instructions, not bytes, bound these kernels at small m (their
// W4A16 ran no faster than W8A16 on the H200), so the index arithmetic is done once per thread
// (Block::Loader's advancing sources, Block::Operands' stage offsets) and the conversions take
// the fewest instructions that stay exact.
// INT8: in F16, two biased bytes go into the low mantissa bytes of (1024.0, 1024.0) (one
// byte_perm), minus 1152 is q exactly; in BF16 the biased byte goes into the mantissa of the
// F32 2^23 (exact), minus 2^23 + 128 is q exactly, converted exactly (|q| <= 128); a
// per-channel row scale
// multiplies the F32 sum in the epilogue, group-wise scales (GGUF Q8_0) multiply the A
// fragments before the MMA (ScaleRows: one rounding to the activation type); F32 scales and
// mins (K-quants) make the value q * scale + min in F32 (one fma, as the CPU dequantizes it),
// then round it once to the activation type, as a dense copy of the weight holds it.
//
// Groups of 16. Lane t's values of a 32-column half are input features 8t .. 8t + 7 (the K
// permutation), so they lie in one group of 16: group (half * 32 + 8t) / 16 of the chunk.
// Each lane reads its own group's scales; with groups of 32 or more every lane of a half
// reads the same one.
//
// Pipeline. Each block step covers kStepK = 64 * warps_k input features: the weights (row
// tiles x 64-column chunks, copied verbatim), the activations [block_m, kStepK] (16-byte
// units, XOR-swizzled by row parity so that a quarter warp's 16-byte loads of rows g and
// g + 1 fall in different banks) and the group-wise scale/min of the step's groups go into
// shared memory with cp.async, kStages deep (4, or 3 where 4 would pass sm_86's 99 KiB;
// one __syncthreads per step). Rows past m and
// row tiles past n are zero-filled (cp.async with src-size 0) and their results dropped.
// With warps_k > 1 the warps' partial sums meet in shared memory at the end; with split-K
// (gridDim.z > 1) every split writes F32 partial sums [split, m, n] (zeros for a split
// with no steps) and SplitKReduceKernel sums them, adds the bias and rounds.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "kernels/cuda/launch_internal.cuh"
#include "kernels/cuda/quantized_gemm.h"
#include "kernels/cuda/quantized_gemm_internal.h"

namespace loom::kernels::cuda::internal::qgemm {

template <typename To, typename From>
__device__ __forceinline__ To BitCast(From from) {
  static_assert(sizeof(To) == sizeof(From));
  To to;
  memcpy(&to, &from, sizeof(To));
  return to;
}

template <typename T>
struct PairOf;
template <>
struct PairOf<__half> {
  using Type = __half2;
  static constexpr uint32_t kInt4Magic = 0x64006400u;  // (1024.0, 1024.0)
};
template <>
struct PairOf<__nv_bfloat16> {
  using Type = __nv_bfloat162;
  static constexpr uint32_t kInt4Magic = 0x43004300u;  // (128.0, 128.0)
};

/// (a & kB) | kC in one instruction. Written in C++ the compiler emits an AND and an OR (LOP3 takes
/// one immediate); as one lop3 ptxas keeps the other constant in a register, set once.
template <uint32_t kB, uint32_t kC>
__device__ __forceinline__ uint32_t AndOr(uint32_t a) {
  uint32_t out;
  asm("lop3.b32 %0, %1, %2, %3, 0xea;\n" : "=r"(out) : "r"(a), "n"(kB), "n"(kC));
  return out;
}

/// The A fragment (a0..a3) of one k16 step from its INT4 word. `scales` = (scale of row g, scale of
/// row g + 8) and `mins` likewise, as F16 bits in the low and high halves.
template <typename T>
__device__ __forceinline__ void DequantInt4(uint32_t word, uint32_t scales, uint32_t mins,
                                            uint32_t (&a)[4]) {
  using T2 = typename PairOf<T>::Type;
  constexpr uint32_t kMagic = PairOf<T>::kInt4Magic;
  const T2 magic = BitCast<T2>(kMagic);
  // F16 -> T is exact for the weights' F16 scale/min only when T is F16; for BF16 the scale and min
  // are rounded to BF16 first (the fused multiply-add then rounds once more).
  T2 scale_lo, scale_hi, min_lo, min_hi;
  if constexpr (std::is_same_v<T, __half>) {
    scale_lo = BitCast<T2>(__byte_perm(scales, 0, 0x1010));
    scale_hi = BitCast<T2>(__byte_perm(scales, 0, 0x3232));
    min_lo = BitCast<T2>(__byte_perm(mins, 0, 0x1010));
    min_hi = BitCast<T2>(__byte_perm(mins, 0, 0x3232));
  } else {
    const float2 s = __half22float2(BitCast<__half2>(scales));
    const float2 m = __half22float2(BitCast<__half2>(mins));
    scale_lo = __float2bfloat162_rn(s.x);
    scale_hi = __float2bfloat162_rn(s.y);
    min_lo = __float2bfloat162_rn(m.x);
    min_hi = __float2bfloat162_rn(m.y);
  }
  T2 q[4];
  if constexpr (std::is_same_v<T, __half>) {
    // The odd nibbles where they are: OR-ed into 1024.0's mantissa bits 4-7 they make 1024 + 16q,
    // and (1024 + 16q) / 16 - 64 = q exactly (one hfma2 instead of a shift and a subtraction).
    const __half2 sixteenth = __float2half2_rn(1.0f / 16.0f), minus64 = __float2half2_rn(-64.0f);
    const uint32_t high = word >> 8;
    q[0] = __hsub2(BitCast<T2>(AndOr<0x000f000fu, kMagic>(word)), magic);
    q[1] = __hfma2(BitCast<T2>(AndOr<0x00f000f0u, kMagic>(word)), sixteenth, minus64);
    q[2] = __hsub2(BitCast<T2>(AndOr<0x000f000fu, kMagic>(high)), magic);
    q[3] = __hfma2(BitCast<T2>(AndOr<0x00f000f0u, kMagic>(high)), sixteenth, minus64);
  } else {
    // BF16's 7-bit mantissa has no room for bits 4-7: every nibble shifted down.
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      q[i] = __hsub2(BitCast<T2>(AndOr<0x000f000fu, kMagic>(word >> (4 * i))), magic);
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    a[i] = BitCast<uint32_t>(
        __hfma2(q[i], i % 2 == 0 ? scale_lo : scale_hi, i % 2 == 0 ? min_lo : min_hi));
  }
}

/// An INT8 A fragment's values times their rows' group scales: `scales` = (scale of row g,
/// scale of row g + 8) as F16 bits; a0, a2 hold row g, a1, a3 row g + 8. One rounding to T
/// (for F16 the dequantized weight's exact value rounded once, as a dense F16 copy holds it;
/// BF16 rounds the scale to BF16 first, as the INT4 path does).
template <typename T>
__device__ __forceinline__ void ScaleRows(uint32_t scales, uint32_t (&a)[4]) {
  using T2 = typename PairOf<T>::Type;
  T2 scale_lo, scale_hi;
  if constexpr (std::is_same_v<T, __half>) {
    scale_lo = BitCast<T2>(__byte_perm(scales, 0, 0x1010));
    scale_hi = BitCast<T2>(__byte_perm(scales, 0, 0x3232));
  } else {
    const float2 s = __half22float2(BitCast<__half2>(scales));
    scale_lo = __float2bfloat162_rn(s.x);
    scale_hi = __float2bfloat162_rn(s.y);
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    a[i] = BitCast<uint32_t>(__hmul2(BitCast<T2>(a[i]), i % 2 == 0 ? scale_lo : scale_hi));
  }
}

template <typename T>
__device__ __forceinline__ uint32_t PackPair(float lo, float hi) {
  if constexpr (std::is_same_v<T, __half>) {
    return BitCast<uint32_t>(__floats2half2_rn(lo, hi));
  } else {
    return BitCast<uint32_t>(__floats2bfloat162_rn(lo, hi));
  }
}

/// Byte kByte of a word whose bytes are int8 values XOR 0x80 (= value + 128), as a float.
template <int kByte>
__device__ __forceinline__ float Int8FromBiased(uint32_t biased) {
  // 0x4B0000bb = 2^23 + bb exactly; minus 2^23 + 128 leaves the int8 value.
  return __uint_as_float(__byte_perm(biased, 0x4B000000u, 0x7540 | kByte)) - 8388736.0f;
}

/// The A fragment of one k16 step from its two INT8 words (values exact in T).
template <typename T>
__device__ __forceinline__ void ConvertInt8(uint32_t word0, uint32_t word1, uint32_t (&a)[4]) {
  const uint32_t w0 = word0 ^ 0x80808080u, w1 = word1 ^ 0x80808080u;
  if constexpr (std::is_same_v<T, __half>) {
    // Two biased bytes into the low mantissa bytes of the F16 pair (1024.0, 1024.0): 1024 + b
    // exactly (b < 256 fits 10 mantissa bits), minus 1152 leaves the int8 value, exactly.
    const __half2 bias = __float2half2_rn(1152.0f);
    a[0] = BitCast<uint32_t>(__hsub2(BitCast<__half2>(__byte_perm(w0, 0x64646464u, 0x4140)), bias));
    a[1] = BitCast<uint32_t>(__hsub2(BitCast<__half2>(__byte_perm(w0, 0x64646464u, 0x4342)), bias));
    a[2] = BitCast<uint32_t>(__hsub2(BitCast<__half2>(__byte_perm(w1, 0x64646464u, 0x4140)), bias));
    a[3] = BitCast<uint32_t>(__hsub2(BitCast<__half2>(__byte_perm(w1, 0x64646464u, 0x4342)), bias));
    return;
  }
  a[0] = PackPair<T>(Int8FromBiased<0>(w0), Int8FromBiased<1>(w0));
  a[1] = PackPair<T>(Int8FromBiased<2>(w0), Int8FromBiased<3>(w0));
  a[2] = PackPair<T>(Int8FromBiased<0>(w1), Int8FromBiased<1>(w1));
  a[3] = PackPair<T>(Int8FromBiased<2>(w1), Int8FromBiased<3>(w1));
}

/// ConvertInt8 with F32 scales and mins: `sm` = (scale of row g, scale of row g + 8, min of
/// row g, min of row g + 8); a0, a2 hold row g, a1, a3 row g + 8. Each value is one F32 fma
/// q * scale + min (as the CPU dequantizes), rounded once to T.
template <typename T>
__device__ __forceinline__ void ConvertInt8Scaled(uint32_t word0, uint32_t word1,
                                                  const float4& sm, uint32_t (&a)[4]) {
  const uint32_t w0 = word0 ^ 0x80808080u, w1 = word1 ^ 0x80808080u;
  a[0] = PackPair<T>(fmaf(Int8FromBiased<0>(w0), sm.x, sm.z),
                     fmaf(Int8FromBiased<1>(w0), sm.x, sm.z));
  a[1] = PackPair<T>(fmaf(Int8FromBiased<2>(w0), sm.y, sm.w),
                     fmaf(Int8FromBiased<3>(w0), sm.y, sm.w));
  a[2] = PackPair<T>(fmaf(Int8FromBiased<0>(w1), sm.x, sm.z),
                     fmaf(Int8FromBiased<1>(w1), sm.x, sm.z));
  a[3] = PackPair<T>(fmaf(Int8FromBiased<2>(w1), sm.y, sm.w),
                     fmaf(Int8FromBiased<3>(w1), sm.y, sm.w));
}

/// c += A · B for one m16n8k16 tile, F32 accumulators.
template <typename T>
__device__ __forceinline__ void Mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  if constexpr (std::is_same_v<T, __half>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

/// 16 bytes global -> shared, asynchronous; zero-fills (reads nothing) when !valid.
__device__ __forceinline__ void CpAsync16(void* shared, const void* global, bool valid) {
  CopyAsync16(shared, global, valid ? 16 : 0);
}

/// 16 bytes global -> registers, read once: not kept in L1 (the weights stream past it).
/// Volatile: never executed where the caller's condition says the address is not valid (an
/// asm without side effects may be speculated out of a branch).
__device__ __forceinline__ uint4 LoadStreaming16(const void* global) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(global));
  return v;
}

/// What a lane reads of one group's scales: (scale of row g, scale of row g + 8, min of row g,
/// min of row g + 8) as F16 bits in .x, .y (kF16), F32 (scale g, scale g + 8) in .x, .y (kF32),
/// or those and F32 mins in .z, .w (kF32WithMin).
template <QuantScaleType kScales>
using ScaleWords = std::conditional_t<kScales == QuantScaleType::kF32WithMin, uint4, uint2>;

/// The two A fragments (k16 steps j = 0, 1) of the 32-column half `half` of a lane's chunk words
/// (4 for INT4, 8 for INT8), dequantized with its group's scale words `sw` (unused per channel).
template <typename T, bool kInt4, int kGroup, QuantScaleType kScales, int kWords>
__device__ __forceinline__ void DequantHalf(const uint32_t (&words)[kWords], int half,
                                            ScaleWords<kScales> sw, uint32_t (&a)[2][4]) {
  if constexpr (kInt4) {
#pragma unroll
    for (int j = 0; j < 2; ++j) DequantInt4<T>(words[2 * half + j], sw.x, sw.y, a[j]);
  } else if constexpr (kScales != QuantScaleType::kF16) {
    // F32 scales (and mins): q * scale + min in F32, rounded once.
    float4 sm;
    if constexpr (kScales == QuantScaleType::kF32WithMin) {
      sm = BitCast<float4>(sw);
    } else {
      sm = make_float4(__uint_as_float(sw.x), __uint_as_float(sw.y), -0.0f,
                       -0.0f);  // q * scale + -0 is q * scale exactly
    }
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      ConvertInt8Scaled<T>(words[4 * half + 2 * j], words[4 * half + 2 * j + 1], sm, a[j]);
    }
  } else {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      ConvertInt8<T>(words[4 * half + 2 * j], words[4 * half + 2 * j + 1], a[j]);
    }
    if constexpr (kGroup > 0) {
      // F16 group scales multiply the values before the MMA.
#pragma unroll
      for (int j = 0; j < 2; ++j) ScaleRows<T>(sw.x, a[j]);
    }
  }
}

/// Compile-time sizes of one kernel instantiation.
template <bool kInt4, int kGroup, QuantScaleType kScales, int kConfig>
struct Shape {
  static constexpr QuantGemmConfig kC = QuantGemmConfigAt(kConfig);
  static constexpr int kTilesM = kC.tiles_m;
  static constexpr int kWarpsM = kC.warps_m;
  static constexpr int kWarpsN = kC.warps_n;
  static constexpr int kFragsN = kC.frags_n;
  static constexpr int kWarpsK = kC.warps_k;
  static constexpr int kThreads = kC.threads();
  static constexpr int kBlockM = kC.block_m();
  static constexpr int kRowTiles = kC.row_tiles();
  static constexpr int kStepK = kC.step_k();
  // Bytes of one row tile x one 64-column chunk (a warp's share of a step).
  static constexpr int kChunkBytes = kInt4 ? 512 : 1024;
  // Group-wise scales (INT4; INT8 with kGroup > 0) are staged per step; per-channel INT8
  // scales multiply the sums in the epilogue.
  static constexpr bool kGrouped = kInt4 || kGroup > 0;
  static constexpr int kScaleGroups = kGrouped ? (kStepK >= kGroup ? kStepK / kGroup : 1) : 0;
  // Bytes of one row tile's scales (and mins) for one group.
  static constexpr int kScaleGroupBytes = kScales == QuantScaleType::kF32WithMin ? 128 : 64;
  static constexpr int kUnitsPerRow = kStepK / 8;  // 16-byte units of an activation row
  static constexpr int kWeightBytes = kRowTiles * kWarpsK * kChunkBytes;
  static constexpr int kActBytes = kBlockM * kStepK * 2;
  static constexpr int kScaleBytes = kRowTiles * kScaleGroups * kScaleGroupBytes;
  static constexpr int kStageBytes = kWeightBytes + kActBytes + kScaleBytes;
  // The config's depth, else kQuantGemmStages deep, one stage fewer where that would not fit
  // the 99 KiB a block may have on sm_86 / sm_89 (the sm_80 code runs there): the gemv configs
  // with F32 scales and mins in groups of 16 (104 and 112 KiB at four stages).
  static constexpr int kMaxSmemBytes = 99 * 1024;
  static constexpr int kStages = kC.stages > 0 ? kC.stages
                                 : kQuantGemmStages * kStageBytes <= kMaxSmemBytes
                                     ? kQuantGemmStages
                                     : kQuantGemmStages - 1;
  static constexpr int kAccPerWarp = kFragsN * kTilesM * 4;  // accumulators per lane
  static constexpr int kReduceBytes = (kWarpsK - 1) * kWarpsM * kWarpsN * kAccPerWarp * 32 * 4;
  // A direct member's shared memory is the warps_k reduction's alone.
  static constexpr bool kDirect = kC.direct;
  static constexpr int kSmemBytes = kDirect                               ? kReduceBytes
                                    : kStages * kStageBytes > kReduceBytes ? kStages * kStageBytes
                                                                           : kReduceBytes;

  static_assert(kGroup == 0 || kGroup == 16 || kGroup == 32 || kGroup == 64 || kGroup == 128);
  static_assert(!kInt4 || kGroup > 0);
  static_assert(kScales == QuantScaleType::kF16 || (!kInt4 && kGroup > 0),
                "F32 scales: group-wise INT8 only");
  static_assert(kUnitsPerRow % 8 == 0, "the XOR swizzle needs rows of >= 8 16-byte units");
  static_assert(kStageBytes % 16 == 0);
  // Whether the member fits (RunQuantGemm asserts it; the sweep skips one that does not).
  static constexpr bool kFits =
      kSmemBytes <= kMaxSmemBytes && (kDirect ? kStages >= 1 : kStages >= 3);
  static_assert(!kDirect || (kWarpsM == 1 && kWarpsN == 1), "a direct member's warps split K only");
  // A step holds whole groups, or lies inside one.
  static_assert(!kGrouped || kStepK % (kGrouped ? kGroup : 1) == 0 ||
                (kGrouped ? kGroup : 1) % kStepK == 0);
};

/// Byte offset of activation 16-byte unit `unit` of row `row` inside a stage's block.
template <int kUnitsPerRow>
__device__ __forceinline__ int ActOffset(int row, int unit) {
  return (row * kUnitsPerRow + (unit ^ ((row & 1) << 2))) * 16;
}

struct Args {
  const void* x;          // [m, k] of T
  void* y;                // [m, n] of T
  const void* bias;       // [n] of T (float with bias_f32) or null
  bool bias_f32;
  const uint8_t* weight;  // device layout
  const void* scales;     // grouped: the scale/min layout (QuantScaleType); else F16 [n]
  float* partial;         // [gridDim.z, m, n] when gridDim.z > 1
  uint32_t* counters;     // [gridDim.y * gridDim.x] zeroed words: the last split reduces
  bool y_f32;             // y holds floats instead of T
  int m, n, k;
  int num_steps;        // ceil(k / kStepK)
  int steps_per_split;  // steps of block step each split covers (the last may
                        // have fewer)
};

/// bias[i] as a float: of T, or (f32) the float itself. 0 without a bias.
template <typename T>
__device__ __forceinline__ float BiasAt(const void* bias, bool f32, int i) {
  if (bias == nullptr) return 0.0f;
  return f32 ? static_cast<const float*>(bias)[i] : ToFloat(static_cast<const T*>(bias)[i]);
}

/// y[at] = value, as T or (y_f32) as the float itself.
template <typename T>
__device__ __forceinline__ void StoreY(void* y, bool y_f32, int64_t at, float value) {
  if (y_f32) {
    static_cast<float*>(y)[at] = value;
  } else {
    static_cast<T*>(y)[at] = FromFloat<T>(value);
  }
}

template <typename T, bool kInt4, int kGroup, QuantScaleType kScales, int kConfig>
struct Block {
  using S = Shape<kInt4, kGroup, kScales, kConfig>;
  using Acc = float[S::kFragsN][S::kTilesM][4];

  // Calls body(j, i) for each of the kCount 16-byte units this thread copies (i = threadIdx.x +
  // j kThreads), j unrolled.
  template <int kCount, typename Body>
  static __device__ __forceinline__ void ForEachUnit(Body&& body) {
#pragma unroll
    for (int j = 0; j < (kCount + S::kThreads - 1) / S::kThreads; ++j) {
      const int i = static_cast<int>(threadIdx.x) + j * S::kThreads;
      if (kCount % S::kThreads == 0 || i < kCount) body(j, i);
    }
  }

  // A stage's 16-byte units: the weights (per row tile, kWarpsK consecutive 64-column chunks,
  // contiguous in global), the activations [kBlockM, kStepK] (swizzled) and, grouped, the
  // scale/min words of the step's groups (per row tile, contiguous from the step's first).
  static constexpr int kUnitsPerChunk = S::kChunkBytes / 16;
  static constexpr int kUnitsPerRowTile = S::kWarpsK * kUnitsPerChunk;
  static constexpr int kWeightUnits = S::kRowTiles * kUnitsPerRowTile;
  static constexpr int kActUnits = S::kBlockM * S::kUnitsPerRow;
  static constexpr int kUnitsPerGroup = S::kScaleGroupBytes / 16;
  static constexpr int kScaleUnitsPerTile = S::kScaleGroups * kUnitsPerGroup;
  static constexpr int kScaleUnits = S::kGrouped ? S::kRowTiles * kScaleUnitsPerTile : 0;
  template <int kCount>
  static constexpr int kPerThread = (kCount + S::kThreads - 1) / S::kThreads;

  // This thread's cp.async sources, worked out once per block: each unit's source at the next
  // step to load (advanced one block step per LoadStage, so a step adds a constant to each
  // pointer instead of redoing the index arithmetic: instructions, not bytes, bound these
  // kernels at small m) and the step coordinate (chunk, column, group) from which it is
  // zero-filled (rows past m, row tiles past n, the end of K).
  struct Loader {
    const uint8_t* weight[kPerThread<kWeightUnits>];
    int weight_end[kPerThread<kWeightUnits>];  // first chunk0 the unit is past k (or its tile n)
    const uint8_t* act[kPerThread<kActUnits>];
    int act_end[kPerThread<kActUnits>];  // first step column the unit is past k (or its row m)
    const uint8_t* scale[kPerThread<kScaleUnits> > 0 ? kPerThread<kScaleUnits> : 1];
    int scale_end[kPerThread<kScaleUnits> > 0 ? kPerThread<kScaleUnits> : 1];
  };

  static __device__ __forceinline__ Loader MakeLoader(const Args& args, int step, int row_tile0,
                                                      int m0) {
    Loader l;
    const int num_row_tiles = args.n / 16;
    const int k_chunks = args.k / 64;
    const int64_t chunk0 = static_cast<int64_t>(step) * S::kWarpsK;
    ForEachUnit<kWeightUnits>([&](int j, int i) {
      const int tile = i / kUnitsPerRowTile, within = i % kUnitsPerRowTile;
      l.weight[j] = args.weight +
                    (static_cast<int64_t>(row_tile0 + tile) * k_chunks + chunk0) * S::kChunkBytes +
                    within * 16;
      l.weight_end[j] = row_tile0 + tile < num_row_tiles ? k_chunks - within / kUnitsPerChunk : 0;
    });
    const T* x = static_cast<const T*>(args.x);
    ForEachUnit<kActUnits>([&](int j, int i) {
      const int row = i / S::kUnitsPerRow, unit = i % S::kUnitsPerRow;
      const int m = m0 + row;
      l.act[j] = reinterpret_cast<const uint8_t*>(
          x + static_cast<int64_t>(m) * args.k + static_cast<int64_t>(step) * S::kStepK + unit * 8);
      l.act_end[j] = m < args.m ? args.k - unit * 8 : 0;
    });
    if constexpr (S::kGrouped) {
      const int num_groups = args.k / kGroup;
      const int64_t group0 = static_cast<int64_t>(step) * S::kStepK / kGroup;
      ForEachUnit<kScaleUnits>([&](int j, int i) {
        const int tile = i / kScaleUnitsPerTile, within = i % kScaleUnitsPerTile;
        l.scale[j] =
            static_cast<const uint8_t*>(args.scales) +
            (static_cast<int64_t>(row_tile0 + tile) * num_groups + group0) * S::kScaleGroupBytes +
            within * 16;
        l.scale_end[j] =
            row_tile0 + tile < num_row_tiles ? num_groups - within / kUnitsPerGroup : 0;
      });
    }
    return l;
  }

  // Issues the cp.async copies of block step `step` into stage `stage` from `l`, which holds
  // that step's sources, then moves `l` to step + 1.
  static __device__ __forceinline__ void LoadStage(const Args& args, Loader& l, uint8_t* stage,
                                                   int step) {
    const int chunk0 = step * S::kWarpsK;
    ForEachUnit<kWeightUnits>([&](int j, int i) {
      const bool valid = chunk0 < l.weight_end[j];
      CpAsync16(stage + i * 16, valid ? l.weight[j] : args.weight, valid);
      l.weight[j] += S::kWarpsK * S::kChunkBytes;
    });
    const int column0 = step * S::kStepK;
    uint8_t* act = stage + S::kWeightBytes;
    ForEachUnit<kActUnits>([&](int j, int i) {
      const bool valid = column0 < l.act_end[j];
      CpAsync16(act + ActOffset<S::kUnitsPerRow>(i / S::kUnitsPerRow, i % S::kUnitsPerRow),
                valid ? l.act[j] : static_cast<const uint8_t*>(args.x), valid);
      l.act[j] += S::kStepK * 2;
    });
    if constexpr (S::kGrouped) {
      // A step holds whole groups (kScaleGroups of them) or lies inside one: the next step's
      // first group is kStepK / kGroup further, or the same until the group ends.
      const int group0 = column0 / kGroup;
      const int next_group0 = (column0 + S::kStepK) / kGroup;
      uint8_t* scale_stage = stage + S::kWeightBytes + S::kActBytes;
      ForEachUnit<kScaleUnits>([&](int j, int i) {
        const bool valid = group0 < l.scale_end[j];
        CpAsync16(scale_stage + i * 16,
                  valid ? l.scale[j] : static_cast<const uint8_t*>(args.scales), valid);
        l.scale[j] += (next_group0 - group0) * S::kScaleGroupBytes;
      });
    }
  }

  // Split-K inside the kernel: once this block's partials are stored, the tile's counter
  // counts it; the last split of the tile to arrive sums every split's partials of the tile
  // in split order (the order SplitKReduceKernel adds in: the same bits whichever split is
  // last), adds the bias, writes y and sets the counter back to 0 for the next launch.
  // No shared variable carries the verdict: two configs use exactly the 48 KiB a kernel
  // gets without opting in, so even one static byte would fail their launches.
  static __device__ __forceinline__ void ReduceSplits(const Args& args, int row_tile0, int m0) {
    __threadfence();  // this thread's partials are visible device-wide before the count
    __syncthreads();
    int last = 0;
    if (threadIdx.x == 0) {
      uint32_t* counter = args.counters + blockIdx.y * gridDim.x + blockIdx.x;
      last = atomicAdd(counter, 1u) == gridDim.z - 1;
      if (last) *counter = 0;  // every split of the tile has counted
    }
    if (!__syncthreads_or(last)) return;
    __threadfence();  // the other splits' partials, seen after their counts
    const int64_t count = static_cast<int64_t>(args.m) * args.n;
    const int n0 = row_tile0 * 16;
    const int width = min(S::kRowTiles * 16, args.n - n0);
    const int rows = min(S::kBlockM, args.m - m0);
    for (int i = threadIdx.x; i < rows * width; i += S::kThreads) {
      const int64_t at = static_cast<int64_t>(m0 + i / width) * args.n + n0 + i % width;
      float sum = 0.0f;
      for (int s = 0; s < static_cast<int>(gridDim.z); ++s) {
        sum += __ldcg(args.partial + s * count + at);
      }
      sum += BiasAt<T>(args.bias, args.bias_f32, n0 + i % width);
      StoreY<T>(args.y, args.y_f32, at, sum);
    }
  }

  // Where this lane's operands lie in a stage (byte offsets, the same every step, worked out
  // once per thread): fragment f's weight words at weights + f kWarpsK kChunkBytes (+ part 512),
  // M-tile tm's activations of half h at act[h] + tm 8 kUnitsPerRow 16, and fragment f's scale
  // words for the group of half r at scales[r] + f kScaleGroups kScaleGroupBytes.
  struct Operands {
    int weights;
    int act[2];
    int scales[2];
  };

  static __device__ __forceinline__ Operands OperandsOf(int wn, int wm, int wk) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    Operands o;
    o.weights = (wn * S::kFragsN * S::kWarpsK + wk) * S::kChunkBytes + lane * 16;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      // Rows (wm kTilesM + tm) 8 + g: the swizzle's row parity is g's.
      o.act[h] =
          S::kWeightBytes + ActOffset<S::kUnitsPerRow>(wm * S::kTilesM * 8 + g, 8 * wk + 4 * h + t);
      // The group of this lane's 8 input features of half h, counted from the step's first: a
      // step holds whole groups, or lies inside one (then 0).
      const int local_group = S::kStepK >= kGroup && S::kGrouped
                                  ? (64 * wk + 32 * h + 8 * t) / (kGroup > 0 ? kGroup : 1)
                                  : 0;
      o.scales[h] = S::kWeightBytes + S::kActBytes +
                    (wn * S::kFragsN * S::kScaleGroups + local_group) * S::kScaleGroupBytes +
                    g * (S::kScaleGroupBytes / 8);
    }
    return o;
  }

  // This warp's mma work on stage `stage` (block step `step`).
  static __device__ __forceinline__ void ComputeStage(const Args& args, const uint8_t* stage,
                                                      int step, int wk, const Operands& operands,
                                                      const bool (&frag_valid)[S::kFragsN],
                                                      Acc& acc) {
    const int k_sub = step * S::kStepK + 64 * wk;         // this warp's 64 input features
    if (k_sub >= args.k) return;                          // the last step may be partial
    constexpr int kWordsPerChunk = S::kChunkBytes / 128;  // 32-bit words per lane
    uint32_t words[S::kFragsN][kWordsPerChunk];
#pragma unroll
    for (int f = 0; f < S::kFragsN; ++f) {
      const uint8_t* base = stage + operands.weights + f * S::kWarpsK * S::kChunkBytes;
#pragma unroll
      for (int part = 0; part < kWordsPerChunk / 4; ++part) {
        const uint4 raw = *reinterpret_cast<const uint4*>(base + part * 512);
        words[f][4 * part + 0] = raw.x;
        words[f][4 * part + 1] = raw.y;
        words[f][4 * part + 2] = raw.z;
        words[f][4 * part + 3] = raw.w;
      }
    }
    // This lane's rows' scales (and mins) of the group its 8 input features of half `r` lie in.
    auto scales_of = [&](int f, int r) {
      ScaleWords<kScales> sw{};
      if constexpr (S::kGrouped) {
        sw = *reinterpret_cast<const ScaleWords<kScales>*>(
            stage + operands.scales[r] + f * S::kScaleGroups * S::kScaleGroupBytes);
      }
      return sw;
    };
    // From groups of 64 up both halves of the (aligned, 64-column) chunk share one group: read
    // once per step (with smaller groups the reads stay in the half loop, where the compiler
    // schedules them better; with four fragments a warp, held across the halves they spill).
    constexpr bool kOneGroup = !S::kGrouped || (kGroup >= 64 && S::kFragsN <= 2);
    ScaleWords<kScales> chunk_scales[S::kFragsN];
#pragma unroll
    for (int f = 0; f < S::kFragsN; ++f) {
      chunk_scales[f] = kOneGroup ? scales_of(f, 0) : ScaleWords<kScales>{};
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      uint32_t a[S::kFragsN][2][4];
#pragma unroll
      for (int f = 0; f < S::kFragsN; ++f) {
        DequantHalf<T, kInt4, kGroup, kScales>(
            words[f], half, kOneGroup ? chunk_scales[f] : scales_of(f, half), a[f]);
      }
#pragma unroll
      for (int tm = 0; tm < S::kTilesM; ++tm) {
        const uint4 b = *reinterpret_cast<const uint4*>(stage + operands.act[half] +
                                                        tm * 8 * S::kUnitsPerRow * 16);
#pragma unroll
        for (int f = 0; f < S::kFragsN; ++f) {
          if (!frag_valid[f]) continue;
          Mma16816<T>(acc[f][tm], a[f][0], b.x, b.y);
          Mma16816<T>(acc[f][tm], a[f][1], b.z, b.w);
        }
      }
    }
  }

  // A direct member's main loop: this warp's chunks of steps [step_begin, step_begin + num_steps)
  // (chunk step * kWarpsK + wk of each; the block's warps read consecutive chunks of a tile),
  // kStages at a time: their weights and scale words are all loaded first, straight into
  // registers in fragment order, then used; each chunk's activations come through L1 (every block
  // of the same K range reads them).
  static __device__ __forceinline__ void DirectSteps(const Args& args, int step_begin,
                                                     int num_steps, int row_tile0, int m0, int wk,
                                                     const bool (&frag_valid)[S::kFragsN],
                                                     Acc& acc) {
    constexpr int kDepth = S::kStages;
    constexpr int kLoads = S::kChunkBytes / 512;  // 16-byte weight loads per lane and chunk
    constexpr int kWords = 4 * kLoads;
    // Scale words per chunk: one group covers both halves from groups of 64 up.
    constexpr int kScaleReads = kGroup >= 64 ? 1 : 2;
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int k_chunks = args.k / 64;
    // This lane's sources at the warp's first chunk, advanced kDepth steps per round (a chunk
    // of the round adds a constant): the weights of each fragment, the rows of the scale words
    // (a chunk's group is added per chunk: with groups of 128 it is not linear in the chunk),
    // the activation rows.
    constexpr int kChunkStride = S::kWarpsK;  // chunks from one step to the next
    const int first_chunk = step_begin * S::kWarpsK + wk;
    const uint8_t* weight[S::kFragsN];
    const uint8_t* scale_rows[S::kFragsN];
#pragma unroll
    for (int f = 0; f < S::kFragsN; ++f) {
      const int64_t tile = row_tile0 + f;
      weight[f] = args.weight + (tile * k_chunks + first_chunk) * S::kChunkBytes + lane * 16;
      scale_rows[f] = nullptr;
      if constexpr (S::kGrouped) {
        scale_rows[f] = static_cast<const uint8_t*>(args.scales) +
                        tile * (args.k / kGroup) * S::kScaleGroupBytes +
                        g * (S::kScaleGroupBytes / 8);
      }
    }
    const T* x_rows[S::kTilesM];
    bool row_valid[S::kTilesM];
#pragma unroll
    for (int tm = 0; tm < S::kTilesM; ++tm) {
      const int row = m0 + tm * 8 + g;
      row_valid[tm] = row < args.m;
      x_rows[tm] = static_cast<const T*>(args.x) + static_cast<int64_t>(row) * args.k +
                   first_chunk * 64 + 8 * t;
    }
    for (int s0 = 0; s0 < num_steps; s0 += kDepth) {
      uint32_t words[kDepth][S::kFragsN][kWords];
      ScaleWords<kScales> sw[kDepth][S::kFragsN][kScaleReads];
#pragma unroll
      for (int d = 0; d < kDepth; ++d) {
        const int chunk = first_chunk + (s0 + d) * kChunkStride;
        const bool live = s0 + d < num_steps && chunk < k_chunks;
#pragma unroll
        for (int f = 0; f < S::kFragsN; ++f) {
          const bool valid = live && frag_valid[f];
          const uint8_t* base = weight[f] + d * kChunkStride * S::kChunkBytes;
#pragma unroll
          for (int part = 0; part < kLoads; ++part) {
            const uint4 raw = valid ? LoadStreaming16(base + part * 512) : make_uint4(0, 0, 0, 0);
            words[d][f][4 * part + 0] = raw.x;
            words[d][f][4 * part + 1] = raw.y;
            words[d][f][4 * part + 2] = raw.z;
            words[d][f][4 * part + 3] = raw.w;
          }
#pragma unroll
          for (int r = 0; r < kScaleReads; ++r) {
            sw[d][f][r] = {};
            if constexpr (S::kGrouped) {
              const int group = (chunk * 64 + 32 * r + 8 * t) / kGroup;
              const uint8_t* at = scale_rows[f] + group * S::kScaleGroupBytes;
              if (valid) sw[d][f][r] = __ldg(reinterpret_cast<const ScaleWords<kScales>*>(at));
            }
          }
        }
      }
#pragma unroll
      for (int d = 0; d < kDepth; ++d) {
        const int chunk = first_chunk + (s0 + d) * kChunkStride;
        if (s0 + d >= num_steps || chunk >= k_chunks) continue;  // the same for the whole warp
        uint4 b[2][S::kTilesM];
#pragma unroll
        for (int half = 0; half < 2; ++half) {
#pragma unroll
          for (int tm = 0; tm < S::kTilesM; ++tm) {
            b[half][tm] = row_valid[tm] ? __ldg(reinterpret_cast<const uint4*>(
                                              x_rows[tm] + d * kChunkStride * 64 + 32 * half))
                                        : make_uint4(0, 0, 0, 0);
          }
        }
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          uint32_t a[S::kFragsN][2][4];
#pragma unroll
          for (int f = 0; f < S::kFragsN; ++f) {
            DequantHalf<T, kInt4, kGroup, kScales>(words[d][f], half,
                                                   sw[d][f][kScaleReads == 1 ? 0 : half], a[f]);
          }
#pragma unroll
          for (int tm = 0; tm < S::kTilesM; ++tm) {
#pragma unroll
            for (int f = 0; f < S::kFragsN; ++f) {
              if (!frag_valid[f]) continue;
              Mma16816<T>(acc[f][tm], a[f][0], b[half][tm].x, b[half][tm].y);
              Mma16816<T>(acc[f][tm], a[f][1], b[half][tm].z, b[half][tm].w);
            }
          }
        }
      }
#pragma unroll
      for (int f = 0; f < S::kFragsN; ++f) weight[f] += kDepth * kChunkStride * S::kChunkBytes;
#pragma unroll
      for (int tm = 0; tm < S::kTilesM; ++tm) x_rows[tm] += kDepth * kChunkStride * 64;
    }
  }
};

template <typename T, bool kInt4, int kGroup, QuantScaleType kScales, int kConfig>
__global__ void __launch_bounds__(Shape<kInt4, kGroup, kScales, kConfig>::kThreads)
    QuantGemmKernel(const Args args) {
  using S = Shape<kInt4, kGroup, kScales, kConfig>;
  using B = Block<T, kInt4, kGroup, kScales, kConfig>;
  extern __shared__ __align__(16) uint8_t smem[];

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, t = lane % 4;
  const int wn = warp % S::kWarpsN;
  const int wm = (warp / S::kWarpsN) % S::kWarpsM;
  const int wk = warp / (S::kWarpsN * S::kWarpsM);
  const int row_tile0 = blockIdx.x * S::kRowTiles;
  const int m0 = blockIdx.y * S::kBlockM;
  const int step_begin = blockIdx.z * args.steps_per_split;
  const int num_steps = max(0, min(args.steps_per_split, args.num_steps - step_begin));

  bool frag_valid[S::kFragsN];
#pragma unroll
  for (int f = 0; f < S::kFragsN; ++f) {
    frag_valid[f] = row_tile0 + wn * S::kFragsN + f < args.n / 16;
  }
  float acc[S::kFragsN][S::kTilesM][4];
#pragma unroll
  for (int f = 0; f < S::kFragsN; ++f) {
#pragma unroll
    for (int tm = 0; tm < S::kTilesM; ++tm) {
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[f][tm][r] = 0.0f;
    }
  }

  if constexpr (S::kDirect) {
    B::DirectSteps(args, step_begin, num_steps, row_tile0, m0, wk, frag_valid, acc);
  } else {
    // Prologue: the first kStages - 1 steps in flight (one commit group per step, empty groups past
    // the end so that wait_group counts stay uniform).
    typename B::Loader loader = B::MakeLoader(args, step_begin, row_tile0, m0);
    const typename B::Operands operands = B::OperandsOf(wn, wm, wk);
#pragma unroll
    for (int s = 0; s < S::kStages - 1; ++s) {
      if (s < num_steps) B::LoadStage(args, loader, smem + s * S::kStageBytes, step_begin + s);
      CopyAsyncCommit();
    }
    for (int s = 0; s < num_steps; ++s) {
      // Groups committed so far: kStages - 1 + s; step s is group s: done once at most kStages - 2
      // remain. The barrier publishes every thread's copies and guarantees all warps finished
      // computing step s - 1, whose slot the next load reuses.
      CopyAsyncWait<S::kStages - 2>();
      __syncthreads();
      const int next = s + S::kStages - 1;
      if (next < num_steps) {
        B::LoadStage(args, loader, smem + (next % S::kStages) * S::kStageBytes, step_begin + next);
      }
      CopyAsyncCommit();
      B::ComputeStage(args, smem + (s % S::kStages) * S::kStageBytes, step_begin + s, wk, operands,
                      frag_valid, acc);
    }
    CopyAsyncWait<0>();
    __syncthreads();  // the stages are free: the reduction below reuses shared
                      // memory
  }

  if constexpr (S::kWarpsK > 1) {
    float* reduce = reinterpret_cast<float*>(smem);
    const int warp_mn = warp % (S::kWarpsN * S::kWarpsM);
    if (wk > 0) {
      float* mine = reduce + ((wk - 1) * S::kWarpsM * S::kWarpsN + warp_mn) * S::kAccPerWarp * 32;
#pragma unroll
      for (int f = 0; f < S::kFragsN; ++f) {
#pragma unroll
        for (int tm = 0; tm < S::kTilesM; ++tm) {
#pragma unroll
          for (int r = 0; r < 4; ++r)
            mine[((f * S::kTilesM + tm) * 4 + r) * 32 + lane] = acc[f][tm][r];
        }
      }
    }
    __syncthreads();
#pragma unroll
    for (int other = 1; other < S::kWarpsK && wk == 0; ++other) {
      const float* theirs =
          reduce + ((other - 1) * S::kWarpsM * S::kWarpsN + warp_mn) * S::kAccPerWarp * 32;
#pragma unroll
      for (int f = 0; f < S::kFragsN; ++f) {
#pragma unroll
        for (int tm = 0; tm < S::kTilesM; ++tm) {
#pragma unroll
          for (int r = 0; r < 4; ++r)
            acc[f][tm][r] += theirs[((f * S::kTilesM + tm) * 4 + r) * 32 + lane];
        }
      }
    }
  }

  // Epilogue: c0, c1 = (feature row g, tokens 2t, 2t + 1), c2, c3 = (row g + 8, same). The
  // warps of wk > 0 added theirs into wk = 0's above; they stay for the split reduction.
  const bool split = gridDim.z > 1;
#pragma unroll
  for (int f = 0; f < S::kFragsN; ++f) {
    if (!frag_valid[f] || wk > 0) continue;
    const int n_lo = (row_tile0 + wn * S::kFragsN + f) * 16 + g, n_hi = n_lo + 8;
    float scale_lo = 1.0f, scale_hi = 1.0f;
    if constexpr (!S::kGrouped) {
      const __half* scales = static_cast<const __half*>(args.scales);
      scale_lo = __half2float(scales[n_lo]);
      scale_hi = __half2float(scales[n_hi]);
    }
    float bias_lo = 0.0f, bias_hi = 0.0f;
    if (!split) {
      bias_lo = BiasAt<T>(args.bias, args.bias_f32, n_lo);
      bias_hi = BiasAt<T>(args.bias, args.bias_f32, n_hi);
    }
#pragma unroll
    for (int tm = 0; tm < S::kTilesM; ++tm) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int m = m0 + (wm * S::kTilesM + tm) * 8 + 2 * t + e;
        if (m >= args.m) continue;
        const float lo = acc[f][tm][e] * scale_lo, hi = acc[f][tm][2 + e] * scale_hi;
        const int64_t row = static_cast<int64_t>(m) * args.n;
        if (split) {
          float* partial = args.partial + static_cast<int64_t>(blockIdx.z) * args.m * args.n;
          partial[row + n_lo] = lo;
          partial[row + n_hi] = hi;
        } else {
          StoreY<T>(args.y, args.y_f32, row + n_lo, lo + bias_lo);
          StoreY<T>(args.y, args.y_f32, row + n_hi, hi + bias_hi);
        }
      }
    }
  }
  if (split && args.counters != nullptr) B::ReduceSplits(args, row_tile0, m0);
}

/// y[i] = T(sum over splits of partial[split, i] + bias[i % n]) (the float itself with y_f32;
/// a bias of floats with bias_f32).
template <typename T>
__global__ void SplitKReduceKernel(const float* __restrict__ partial, const void* bias,
                                   bool bias_f32, void* __restrict__ y, bool y_f32, int splits,
                                   int64_t count, int n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    float sum = 0.0f;
    for (int s = 0; s < splits; ++s) sum += partial[s * count + i];
    sum += BiasAt<T>(bias, bias_f32, static_cast<int>(i % n));
    StoreY<T>(y, y_f32, i, sum);
  }
}

template <typename T, bool kInt4, int kGroup, QuantScaleType kScales, int kConfig>
absl::Status RunQuantGemm(const QuantGemmParams& p, int splits, cudaStream_t stream) {
  using S = Shape<kInt4, kGroup, kScales, kConfig>;
  static_assert(S::kSmemBytes <= S::kMaxSmemBytes, "over the shared memory of sm_86 / sm_89");
  static_assert(S::kDirect || S::kStages >= 3, "the pipeline keeps two steps in flight");
  constexpr auto kernel = QuantGemmKernel<T, kInt4, kGroup, kScales, kConfig>;
  if constexpr (S::kSmemBytes > 48 * 1024) {
    LOOM_RETURN_IF_ERROR(OptInSharedMemory<kernel>(
        S::kSmemBytes, absl::StrFormat("QuantGemm (%s)", S::kC.name).c_str()));
  }
  Args args{};
  args.x = p.x;
  args.y = p.y;
  args.bias = p.bias;
  args.bias_f32 = p.bias_f32;
  args.weight = static_cast<const uint8_t*>(p.weight);
  args.scales = p.scales;
  args.partial = splits > 1 ? static_cast<float*>(p.workspace) : nullptr;
  args.counters = splits > 1 ? p.counters : nullptr;
  args.y_f32 = p.f32_out;
  args.m = static_cast<int>(p.m);
  args.n = static_cast<int>(p.n);
  args.k = static_cast<int>(p.k);
  args.num_steps = static_cast<int>((p.k + S::kStepK - 1) / S::kStepK);
  args.steps_per_split = (args.num_steps + splits - 1) / splits;
  const int row_tiles = args.n / 16;
  const dim3 grid((row_tiles + S::kRowTiles - 1) / S::kRowTiles,
                  (args.m + S::kBlockM - 1) / S::kBlockM, splits);
  kernel<<<grid, S::kThreads, S::kSmemBytes, stream>>>(args);
  LOOM_RETURN_IF_ERROR(CheckLaunch("QuantGemm"));
  if (splits > 1 && args.counters == nullptr) {
    const int64_t count = p.m * p.n;
    SplitKReduceKernel<T><<<GridFor(count, 256), 256, 0, stream>>>(
        args.partial, p.bias, p.bias_f32, p.y, p.f32_out, splits, count, args.n);
    LOOM_RETURN_IF_ERROR(CheckLaunch("QuantGemm split-K reduce"));
  }
  return absl::OkStatus();
}

// The config half of the runtime -> compile-time dispatch (quantized_gemm.cu picks dtype,
// format, group size and scale type; the lists are the ones CheckQuantGemmParams enforces).
template <typename T, bool kInt4, int kGroup, QuantScaleType kScales>
absl::Status DispatchConfig(const QuantGemmParams& p, int config, int splits, cudaStream_t stream) {
  static_assert(kNumQuantGemmConfigs == 6);
  switch (config) {
    case 0:
      return RunQuantGemm<T, kInt4, kGroup, kScales, 0>(p, splits, stream);
    case 1:
      return RunQuantGemm<T, kInt4, kGroup, kScales, 1>(p, splits, stream);
    case 2:
      return RunQuantGemm<T, kInt4, kGroup, kScales, 2>(p, splits, stream);
    case 3:
      return RunQuantGemm<T, kInt4, kGroup, kScales, 3>(p, splits, stream);
    case kQuantGemmInt4OnlyConfig:
      if constexpr (kInt4) {
        return RunQuantGemm<T, kInt4, kGroup, kScales, kQuantGemmInt4OnlyConfig>(p, splits,
                                                                                stream);
      } else {
        return absl::InternalError("QuantGemm: an INT8 weight took an INT4-only config");
      }
    default:
      return RunQuantGemm<T, kInt4, kGroup, kScales, 4>(p, splits, stream);
  }
}

/// The members with F32 group scales (K-quants as Loom holds them: INT8 in groups of 16 or
/// 32, with or without mins), compiled in quantized_gemm_f32_scales.cu beside the rest.
template <typename T>
absl::Status DispatchF32Scales(const QuantGemmParams& p, int config, int splits,
                               cudaStream_t stream);

}  // namespace loom::kernels::cuda::internal::qgemm
