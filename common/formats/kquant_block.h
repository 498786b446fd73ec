#pragma once

// One super-block of a GGUF K-quant (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K: 256 weights) decoded
// into integers and per-sub-block float scales and mins, such that
//   value[i] = q[i] * scale[i / sub_block] + min[i / sub_block]
// rounds exactly as llama.cpp's and the `gguf` package's dequantization do: every
// q * scale is exact in float (an F16 super-block scale times a 4- to 8-bit integer sub-block
// scale, times a q of at most 6 bits), and min is the negated sub-block min (x - m is
// x + (-m) in IEEE arithmetic), or -0.0f where the format has none (adding -0 changes
// nothing, a zero's sign included). The dequantizer (ggml_type.cc) and the CPU backend's
// lossless packing (kernels/cpu/kquant_weights.cc) both read blocks through this.

#include <cstdint>

#include "common/formats/ggml_type.h"

namespace loom::common {

inline constexpr int kKQuantBlockSize = 256;

struct KQuantBlock {
  int sub_block = 0;             // 16 (Q2_K, Q3_K, Q6_K) or 32 (Q4_K, Q5_K)
  int8_t q[kKQuantBlockSize];    // Q2_K 0..3, Q3_K -4..3, Q4_K 0..15, Q5_K 0..31, Q6_K -32..31
  float scale[16];               // per sub-block, kKQuantBlockSize / sub_block of them
  float min[16];
};

/// True for the five K-quant types DecodeKQuantBlock reads.
bool IsKQuant(GgmlType type);

/// Decodes one block of `type` (GetGgmlTypeTraits(type).type_size bytes at `block`).
/// `type` must satisfy IsKQuant.
void DecodeKQuantBlock(GgmlType type, const uint8_t* block, KQuantBlock& out);

}  // namespace loom::common
