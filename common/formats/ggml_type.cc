#include "common/formats/ggml_type.h"

#include "common/formats/kquant_block.h"

#include <array>
#include <cstring>
#include <limits>
#include <optional>

#include "absl/strings/str_cat.h"

// Each rounding step below must stay a separate float32 operation (GCC in ISO mode does
// not contract; clang would without this).
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

namespace loom::common {

float HalfToFloat(uint16_t half) {
  const uint32_t sign = static_cast<uint32_t>(half & 0x8000u) << 16;
  const uint32_t exponent = (half >> 10) & 0x1fu;
  uint32_t mantissa = half & 0x3ffu;
  uint32_t bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);  // Inf or NaN
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);  // 112 = 127 - 15
  } else if (mantissa == 0) {
    bits = sign;  // signed zero
  } else {
    // Subnormal half: normalise the mantissa.
    int shift = 0;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      ++shift;
    }
    mantissa &= 0x3ffu;
    bits = sign | (static_cast<uint32_t>(113 - shift) << 23) | (mantissa << 13);
  }
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

float Mxfp4Scale(uint8_t e) {
  // 2^(e - 128): the exponent field e - 1 for e >= 2, else the subnormal 2^(e - 128) =
  // 2^21 << e units of 2^-149.
  const uint32_t bits = e < 2 ? uint32_t{0x00200000} << e : static_cast<uint32_t>(e - 1) << 23;
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

void Unpack5Bit(const uint8_t* qh_bytes, const uint8_t* qs, int q[32]) {
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, sizeof(qh));
  for (int i = 0; i < 16; ++i) {
    q[i] = (qs[i] & 0x0f) | static_cast<int>(((qh >> i) & 1u) << 4);
    q[i + 16] = (qs[i] >> 4) | static_cast<int>(((qh >> (i + 16)) & 1u) << 4);
  }
}

namespace {

struct TypeEntry {
  uint32_t id;
  GgmlTypeTraits traits;
};

// Every type the `gguf` package (0.19) knows, with ggml's block layout.
constexpr std::array<TypeEntry, 34> kTypeTable = {{
    {0, {"F32", 1, 4}},
    {1, {"F16", 1, 2}},
    {2, {"Q4_0", 32, 18}},
    {3, {"Q4_1", 32, 20}},
    {6, {"Q5_0", 32, 22}},
    {7, {"Q5_1", 32, 24}},
    {8, {"Q8_0", 32, 34}},
    {9, {"Q8_1", 32, 40}},
    {10, {"Q2_K", 256, 84}},
    {11, {"Q3_K", 256, 110}},
    {12, {"Q4_K", 256, 144}},
    {13, {"Q5_K", 256, 176}},
    {14, {"Q6_K", 256, 210}},
    {15, {"Q8_K", 256, 292}},
    {16, {"IQ2_XXS", 256, 66}},
    {17, {"IQ2_XS", 256, 74}},
    {18, {"IQ3_XXS", 256, 98}},
    {19, {"IQ1_S", 256, 50}},
    {20, {"IQ4_NL", 32, 18}},
    {21, {"IQ3_S", 256, 110}},
    {22, {"IQ2_S", 256, 82}},
    {23, {"IQ4_XS", 256, 136}},
    {24, {"I8", 1, 1}},
    {25, {"I16", 1, 2}},
    {26, {"I32", 1, 4}},
    {27, {"I64", 1, 8}},
    {28, {"F64", 1, 8}},
    {29, {"IQ1_M", 256, 56}},
    {30, {"BF16", 1, 2}},
    {34, {"TQ1_0", 256, 54}},
    {35, {"TQ2_0", 256, 66}},
    {39, {"MXFP4", 32, 17}},
    {40, {"NVFP4", 64, 36}},
    {41, {"Q1_0", 128, 18}},
}};

absl::string_view AbslView(std::string_view s) { return absl::string_view(s.data(), s.size()); }

const GgmlTypeTraits* FindTraits(uint32_t type) {
  for (const TypeEntry& entry : kTypeTable) {
    if (entry.id == type) return &entry.traits;
  }
  return nullptr;
}

// The kernels below reproduce `gguf.quants.dequantize` bit for bit: every product and
// difference is rounded to float32 separately, in numpy's order (so no FMA contraction),
// and float16 scales are widened exactly.

float LoadHalf(const uint8_t* bytes) {
  uint16_t half;
  std::memcpy(&half, bytes, sizeof(half));
  return HalfToFloat(half);
}

void DequantizeF16(const uint8_t* src, uint64_t num_elements, float* dst) {
  for (uint64_t i = 0; i < num_elements; ++i) dst[i] = LoadHalf(src + 2 * i);
}

void DequantizeBF16(const uint8_t* src, uint64_t num_elements, float* dst) {
  for (uint64_t i = 0; i < num_elements; ++i) {
    uint16_t bf16;
    std::memcpy(&bf16, src + 2 * i, sizeof(bf16));
    const uint32_t bits = static_cast<uint32_t>(bf16) << 16;
    std::memcpy(&dst[i], &bits, sizeof(bits));
  }
}

// Q8_0 block (34 bytes): f16 d, int8 q[32]; x = q * d.
void DequantizeQ8_0(const uint8_t* src, uint64_t num_blocks, float* dst) {
  for (uint64_t b = 0; b < num_blocks; ++b, src += 34, dst += 32) {
    const float d = LoadHalf(src);
    for (int i = 0; i < 32; ++i) {
      dst[i] = static_cast<float>(static_cast<int8_t>(src[2 + i])) * d;
    }
  }
}

// Q4_0 block (18 bytes): f16 d, 16 bytes of nibbles (low nibbles are elements 0..15,
// high nibbles 16..31); x = d * (q - 8).
void DequantizeQ4_0(const uint8_t* src, uint64_t num_blocks, float* dst) {
  for (uint64_t b = 0; b < num_blocks; ++b, src += 18, dst += 32) {
    const float d = LoadHalf(src);
    const uint8_t* qs = src + 2;
    for (int i = 0; i < 16; ++i) {
      dst[i] = d * static_cast<float>(static_cast<int>(qs[i] & 0x0f) - 8);
      dst[i + 16] = d * static_cast<float>(static_cast<int>(qs[i] >> 4) - 8);
    }
  }
}

// Q4_1 block (20 bytes): f16 d, f16 m, 16 bytes of nibbles; x = (d * q) + m.
void DequantizeQ4_1(const uint8_t* src, uint64_t num_blocks, float* dst) {
  for (uint64_t b = 0; b < num_blocks; ++b, src += 20, dst += 32) {
    const float d = LoadHalf(src);
    const float m = LoadHalf(src + 2);
    const uint8_t* qs = src + 4;
    for (int i = 0; i < 16; ++i) {
      const float low = d * static_cast<float>(qs[i] & 0x0f);
      const float high = d * static_cast<float>(qs[i] >> 4);
      dst[i] = low + m;
      dst[i + 16] = high + m;
    }
  }
}

// Q5_0 block (22 bytes): f16 d, u32 qh, 16 bytes of nibbles; x = d * (q - 16).
void DequantizeQ5_0(const uint8_t* src, uint64_t num_blocks, float* dst) {
  int q[32];
  for (uint64_t b = 0; b < num_blocks; ++b, src += 22, dst += 32) {
    const float d = LoadHalf(src);
    Unpack5Bit(src + 2, src + 6, q);
    for (int i = 0; i < 32; ++i) dst[i] = d * static_cast<float>(q[i] - 16);
  }
}

// Q5_1 block (24 bytes): f16 d, f16 m, u32 qh, 16 bytes of nibbles; x = (d * q) + m.
void DequantizeQ5_1(const uint8_t* src, uint64_t num_blocks, float* dst) {
  int q[32];
  for (uint64_t b = 0; b < num_blocks; ++b, src += 24, dst += 32) {
    const float d = LoadHalf(src);
    const float m = LoadHalf(src + 2);
    Unpack5Bit(src + 4, src + 8, q);
    for (int i = 0; i < 32; ++i) dst[i] = d * static_cast<float>(q[i]) + m;
  }
}

// MXFP4 block (17 bytes): an E8M0 exponent e, 16 bytes of nibbles indexing the E2M1 levels
// (low nibbles are elements 0..15); x = Mxfp4Scale(e) * kMxfp4Values[q].
void DequantizeMXFP4(const uint8_t* src, uint64_t num_blocks, float* dst) {
  for (uint64_t b = 0; b < num_blocks; ++b, src += 17, dst += 32) {
    const float d = Mxfp4Scale(src[0]);
    for (int i = 0; i < 16; ++i) {
      dst[i] = d * static_cast<float>(kMxfp4Values[src[1 + i] & 0x0f]);
      dst[i + 16] = d * static_cast<float>(kMxfp4Values[src[1 + i] >> 4]);
    }
  }
}

// IQ4_NL block (18 bytes): f16 d, 16 bytes of nibbles indexing a non-linear table (low
// nibbles are elements 0..15); x = d * kIq4NlValues[q].
void DequantizeIQ4_NL(const uint8_t* src, uint64_t num_blocks, float* dst) {
  for (uint64_t b = 0; b < num_blocks; ++b, src += 18, dst += 32) {
    const float d = LoadHalf(src);
    for (int i = 0; i < 16; ++i) {
      dst[i] = d * static_cast<float>(kIq4NlValues[src[2 + i] & 0x0f]);
      dst[i + 16] = d * static_cast<float>(kIq4NlValues[src[2 + i] >> 4]);
    }
  }
}

// The K-quants through their shared block decoder (kquant_block.h): value = q * scale +
// min, which rounds as gguf does.
void DequantizeKQuant(GgmlType type, const uint8_t* src, uint64_t num_blocks, float* dst) {
  const uint64_t block_bytes = FindTraits(static_cast<uint32_t>(type))->type_size;
  KQuantBlock block;
  for (uint64_t b = 0; b < num_blocks; ++b, src += block_bytes, dst += kKQuantBlockSize) {
    DecodeKQuantBlock(type, src, block);
    for (int i = 0; i < kKQuantBlockSize; ++i) {
      const int s = i / block.sub_block;
      const float scaled = static_cast<float>(block.q[i]) * block.scale[s];
      dst[i] = scaled + block.min[s];
    }
  }
}

}  // namespace

absl::StatusOr<GgmlTypeTraits> GetGgmlTypeTraits(uint32_t type) {
  const GgmlTypeTraits* traits = FindTraits(type);
  if (traits == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("unknown ggml tensor type ", type));
  }
  return *traits;
}

std::string RawGgmlTypeName(uint32_t type) {
  const GgmlTypeTraits* traits = FindTraits(type);
  if (traits == nullptr) return absl::StrCat("unknown(", type, ")");
  return std::string(traits->name);
}

absl::StatusOr<uint64_t> GgmlRowBytes(GgmlType type, uint64_t num_elements) {
  const uint32_t raw = static_cast<uint32_t>(type);
  const GgmlTypeTraits* traits = FindTraits(raw);
  if (traits == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("unknown ggml tensor type ", raw));
  }
  const uint64_t block_size = static_cast<uint64_t>(traits->block_size);
  const uint64_t type_size = static_cast<uint64_t>(traits->type_size);
  if (num_elements % block_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(num_elements, " elements of type ", AbslView(traits->name),
                     " are not a multiple of its block size ", block_size));
  }
  const uint64_t num_blocks = num_elements / block_size;
  if (num_blocks > std::numeric_limits<uint64_t>::max() / type_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "byte size of ", num_elements, " elements of type ", AbslView(traits->name), " overflows"));
  }
  return num_blocks * type_size;
}

bool CanDequantize(GgmlType type) {
  switch (type) {
    case GgmlType::kF32:
    case GgmlType::kF16:
    case GgmlType::kBF16:
    case GgmlType::kQ8_0:
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_1:
    case GgmlType::kIQ4_NL:
    case GgmlType::kMXFP4:
    case GgmlType::kQ2_K:
    case GgmlType::kQ3_K:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K:
      return true;
    default:
      return false;
  }
}

absl::Status DequantizeToF32(GgmlType type, const void* src, uint64_t num_elements,
                             float* dst) {
  absl::StatusOr<uint64_t> row_bytes = GgmlRowBytes(type, num_elements);
  if (!row_bytes.ok()) return row_bytes.status();
  const auto* bytes = static_cast<const uint8_t*>(src);
  switch (type) {
    case GgmlType::kF32:
      if (num_elements != 0) std::memcpy(dst, bytes, *row_bytes);
      return absl::OkStatus();
    case GgmlType::kF16:
      DequantizeF16(bytes, num_elements, dst);
      return absl::OkStatus();
    case GgmlType::kBF16:
      DequantizeBF16(bytes, num_elements, dst);
      return absl::OkStatus();
    case GgmlType::kQ8_0:
      DequantizeQ8_0(bytes, num_elements / 32, dst);
      return absl::OkStatus();
    case GgmlType::kQ4_0:
      DequantizeQ4_0(bytes, num_elements / 32, dst);
      return absl::OkStatus();
    case GgmlType::kQ4_1:
      DequantizeQ4_1(bytes, num_elements / 32, dst);
      return absl::OkStatus();
    case GgmlType::kQ5_0:
      DequantizeQ5_0(bytes, num_elements / 32, dst);
      return absl::OkStatus();
    case GgmlType::kQ5_1:
      DequantizeQ5_1(bytes, num_elements / 32, dst);
      return absl::OkStatus();
    case GgmlType::kIQ4_NL:
      DequantizeIQ4_NL(bytes, num_elements / 32, dst);
      return absl::OkStatus();
    case GgmlType::kMXFP4:
      DequantizeMXFP4(bytes, num_elements / 32, dst);
      return absl::OkStatus();
    case GgmlType::kQ2_K:
    case GgmlType::kQ3_K:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K:
      DequantizeKQuant(type, bytes, num_elements / kKQuantBlockSize, dst);
      return absl::OkStatus();
    default:
      return absl::UnimplementedError(absl::StrCat(
          "dequantization of ggml type ", RawGgmlTypeName(static_cast<uint32_t>(type)),
          " is not implemented"));
  }
}

}  // namespace loom::common
