#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace loom::common {

/// Tensor element types as numbered in GGUF files (ggml's `ggml_type`).
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ4_NL = 20,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kBF16 = 30,
  kMXFP4 = 39,
};

/// IEEE binary16 bits to float, exact; NaN payloads are kept (numpy's software path).
float HalfToFloat(uint16_t half);

/// The 5-bit values of a Q5_0/Q5_1 block: low nibbles of `qs` (elements 0..15, then the
/// high nibbles for 16..31) with bit i of the little-endian u32 at `qh_bytes` as element
/// i's fifth bit; q in [0, 31].
void Unpack5Bit(const uint8_t* qh_bytes, const uint8_t* qs, int q[32]);

/// IQ4_NL's 16 levels (the format's non-linear table): a nibble q stands for
/// d * kIq4NlValues[q].
inline constexpr int8_t kIq4NlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};

/// MXFP4's 16 levels (OCP microscaling FP4, E2M1, doubled as llama.cpp stores them): a
/// nibble q stands for kMxfp4Values[q] * Mxfp4Scale(e) with e the block's E8M0 byte.
inline constexpr int8_t kMxfp4Values[16] = {0, 1,  2,  3,  4,  6,  8,  12,
                                            0, -1, -2, -3, -4, -6, -8, -12};

/// Half of an E8M0 exponent byte's value, 2^(e - 128) (the doubled levels' scale), exact in
/// F32 for every e (e < 2 as a subnormal), as ggml's GGML_E8M0_TO_FP32_HALF.
float Mxfp4Scale(uint8_t e);

/// Storage layout of one type: `block_size` elements occupy `type_size` bytes.
struct GgmlTypeTraits {
  std::string_view name;  // e.g. "Q4_1"
  int64_t block_size;     // elements per block (1 for plain types)
  int64_t type_size;      // bytes per block
};

/// Layout of `type`, or InvalidArgument for a value no GGUF type uses. Thread-safe.
absl::StatusOr<GgmlTypeTraits> GetGgmlTypeTraits(uint32_t type);

/// Human-readable name ("F16", "Q4_K", ...), "unknown(N)" for unknown values.
std::string RawGgmlTypeName(uint32_t type);

/// Bytes that `num_elements` elements of `type` occupy; InvalidArgument when
/// num_elements is not a multiple of the block size or the size overflows.
absl::StatusOr<uint64_t> GgmlRowBytes(GgmlType type, uint64_t num_elements);

/// True when DequantizeToF32 supports `type`.
bool CanDequantize(GgmlType type);

/// Dequantizes `num_elements` elements of `type` from `src` (exactly
/// GgmlRowBytes(type, num_elements) bytes) into `dst` as F32. Bit-identical to the
/// PyPI `gguf` package's `gguf.quants.dequantize`. Supported: F32, F16, BF16, Q8_0,
/// Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K. Thread-safe.
absl::Status DequantizeToF32(GgmlType type, const void* src, uint64_t num_elements,
                             float* dst);

}  // namespace loom::common
