#include "common/formats/ggml_type.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

// Layout and known-value tests. Bit-identity with the `gguf` package on random blocks
// is checked by tests/common/ggml_type_test.py.

namespace loom::common {
namespace {

using ::testing::HasSubstr;

template <typename T>
void Put(std::vector<uint8_t>& bytes, size_t offset, T value) {
  std::memcpy(bytes.data() + offset, &value, sizeof(T));
}

std::vector<float> Dequantize(GgmlType type, const std::vector<uint8_t>& bytes,
                              uint64_t num_elements) {
  std::vector<float> values(num_elements, -12345.0f);
  absl::Status status = DequantizeToF32(type, bytes.data(), num_elements, values.data());
  EXPECT_TRUE(status.ok()) << status;
  return values;
}

TEST(GgmlTypeTest, TraitsMatchGgmlBlockLayouts) {
  struct Expected {
    GgmlType type;
    std::string name;
    int64_t block_size;
    int64_t type_size;
  };
  const std::vector<Expected> expected = {
      {GgmlType::kF32, "F32", 1, 4},       {GgmlType::kF16, "F16", 1, 2},
      {GgmlType::kBF16, "BF16", 1, 2},     {GgmlType::kQ4_0, "Q4_0", 32, 18},
      {GgmlType::kQ4_1, "Q4_1", 32, 20},   {GgmlType::kQ5_0, "Q5_0", 32, 22},
      {GgmlType::kQ5_1, "Q5_1", 32, 24},   {GgmlType::kQ8_0, "Q8_0", 32, 34},
      {GgmlType::kQ8_1, "Q8_1", 32, 40},   {GgmlType::kQ2_K, "Q2_K", 256, 84},
      {GgmlType::kQ3_K, "Q3_K", 256, 110}, {GgmlType::kQ4_K, "Q4_K", 256, 144},
      {GgmlType::kQ5_K, "Q5_K", 256, 176}, {GgmlType::kQ6_K, "Q6_K", 256, 210},
      {GgmlType::kQ8_K, "Q8_K", 256, 292}, {GgmlType::kI8, "I8", 1, 1},
      {GgmlType::kI16, "I16", 1, 2},       {GgmlType::kI32, "I32", 1, 4},
      {GgmlType::kI64, "I64", 1, 8},       {GgmlType::kF64, "F64", 1, 8},
  };
  for (const Expected& e : expected) {
    absl::StatusOr<GgmlTypeTraits> traits = GetGgmlTypeTraits(static_cast<uint32_t>(e.type));
    ASSERT_TRUE(traits.ok()) << e.name;
    EXPECT_EQ(traits->name, e.name);
    EXPECT_EQ(traits->block_size, e.block_size) << e.name;
    EXPECT_EQ(traits->type_size, e.type_size) << e.name;
    EXPECT_EQ(RawGgmlTypeName(static_cast<uint32_t>(e.type)), e.name);
  }
  // Types beyond the enum are known by number (IQ formats, TQ).
  EXPECT_EQ(RawGgmlTypeName(16), "IQ2_XXS");
  EXPECT_EQ(GetGgmlTypeTraits(static_cast<uint32_t>(GgmlType::kMXFP4))->type_size, 17);
}

// E8M0 exponents as halves of their value: every byte, normal and subnormal results.
TEST(GgmlTypeTest, Mxfp4ScaleIsHalfOfTheE8M0Value) {
  for (int e = 0; e < 256; ++e) {
    EXPECT_EQ(Mxfp4Scale(static_cast<uint8_t>(e)), std::ldexp(1.0f, e - 128)) << e;
  }
}

TEST(GgmlTypeTest, UnknownTypesAreRejectedByNumber) {
  for (uint32_t type : {4u, 5u, 31u, 99u, 0xffffffffu}) {
    absl::StatusOr<GgmlTypeTraits> traits = GetGgmlTypeTraits(type);
    EXPECT_EQ(traits.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(traits.status().message()), HasSubstr(std::to_string(type)));
    EXPECT_EQ(RawGgmlTypeName(type), "unknown(" + std::to_string(type) + ")");
  }
}

TEST(GgmlTypeTest, RowBytesCountsWholeBlocksAndRejectsPartialOrOverflowingSizes) {
  EXPECT_EQ(*GgmlRowBytes(GgmlType::kF32, 0), 0u);
  EXPECT_EQ(*GgmlRowBytes(GgmlType::kF16, 7), 14u);
  EXPECT_EQ(*GgmlRowBytes(GgmlType::kQ4_1, 64), 40u);
  EXPECT_EQ(*GgmlRowBytes(GgmlType::kQ4_K, 512), 288u);
  EXPECT_EQ(*GgmlRowBytes(GgmlType::kQ6_K, 256 * 3), 630u);

  absl::StatusOr<uint64_t> partial = GgmlRowBytes(GgmlType::kQ4_K, 100);
  EXPECT_EQ(partial.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(partial.status().message()), HasSubstr("block size 256"));
  EXPECT_THAT(std::string(partial.status().message()), HasSubstr("Q4_K"));

  absl::StatusOr<uint64_t> overflow = GgmlRowBytes(GgmlType::kF32, uint64_t{1} << 62);
  EXPECT_EQ(overflow.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(overflow.status().message()), HasSubstr("overflows"));
  EXPECT_FALSE(GgmlRowBytes(static_cast<GgmlType>(99), 1).ok());
}

TEST(GgmlTypeTest, CanDequantizeExactlyTheSupportedTypes) {
  const std::vector<GgmlType> supported = {
      GgmlType::kF32,  GgmlType::kF16,  GgmlType::kBF16, GgmlType::kQ8_0,   GgmlType::kQ4_0,
      GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kIQ4_NL, GgmlType::kMXFP4,
      GgmlType::kQ2_K, GgmlType::kQ3_K, GgmlType::kQ4_K, GgmlType::kQ5_K,   GgmlType::kQ6_K};
  for (uint32_t raw = 0; raw < 64; ++raw) {
    const auto type = static_cast<GgmlType>(raw);
    const bool expected =
        std::find(supported.begin(), supported.end(), type) != supported.end();
    EXPECT_EQ(CanDequantize(type), expected) << RawGgmlTypeName(raw);
  }
}

TEST(GgmlTypeTest, DequantizingAnUnsupportedTypeIsUnimplementedNamingIt) {
  std::vector<uint8_t> block(136, 0);
  std::vector<float> out(256);
  // IQ4_XS (23) and IQ2_XXS (16): i-quants Loom does not read.
  absl::Status status = DequantizeToF32(static_cast<GgmlType>(23), block.data(), 256, out.data());
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(status.message()), HasSubstr("IQ4_XS"));
  status = DequantizeToF32(static_cast<GgmlType>(16), block.data(), 256, out.data());
  EXPECT_THAT(std::string(status.message()), HasSubstr("IQ2_XXS"));
}

TEST(GgmlTypeTest, DequantizingAPartialBlockIsAnError) {
  std::vector<uint8_t> block(34, 0);
  std::vector<float> out(33);
  EXPECT_EQ(DequantizeToF32(GgmlType::kQ8_0, block.data(), 33, out.data()).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(GgmlTypeTest, F16WidensExactlyIncludingSubnormalsAndSpecials) {
  const std::vector<uint16_t> halves = {0x3c00, 0xc000, 0x0001, 0x03ff, 0x0400,
                                        0x7bff, 0x8000, 0x7c00, 0xfc00, 0x3555};
  std::vector<uint8_t> bytes(halves.size() * 2);
  std::memcpy(bytes.data(), halves.data(), bytes.size());
  std::vector<float> values = Dequantize(GgmlType::kF16, bytes, halves.size());
  EXPECT_EQ(values[0], 1.0f);
  EXPECT_EQ(values[1], -2.0f);
  EXPECT_EQ(values[2], std::ldexp(1.0f, -24));
  EXPECT_EQ(values[3], std::ldexp(1023.0f, -24));
  EXPECT_EQ(values[4], std::ldexp(1.0f, -14));
  EXPECT_EQ(values[5], 65504.0f);
  EXPECT_EQ(values[6], 0.0f);
  EXPECT_TRUE(std::signbit(values[6]));
  EXPECT_EQ(values[7], std::numeric_limits<float>::infinity());
  EXPECT_EQ(values[8], -std::numeric_limits<float>::infinity());
  EXPECT_EQ(values[9], (1.0f + 341.0f / 1024.0f) * 0.25f);  // 0x3555: 2^-2 * 1.0101010101b

  const uint16_t nan = 0x7e01;
  std::memcpy(bytes.data(), &nan, 2);
  EXPECT_TRUE(std::isnan(Dequantize(GgmlType::kF16, bytes, 1)[0]));
}

TEST(GgmlTypeTest, Bf16IsTheHighHalfOfF32) {
  const std::vector<uint16_t> values16 = {0x3f80, 0xc040, 0x0000, 0x7f80};
  std::vector<uint8_t> bytes(8);
  std::memcpy(bytes.data(), values16.data(), 8);
  EXPECT_EQ(Dequantize(GgmlType::kBF16, bytes, 4),
            (std::vector<float>{1.0f, -3.0f, 0.0f, std::numeric_limits<float>::infinity()}));
}

TEST(GgmlTypeTest, F32IsCopiedBitForBit) {
  const std::vector<float> source = {1.5f, -0.0f, 3e-42f, 1e30f};
  std::vector<uint8_t> bytes(16);
  std::memcpy(bytes.data(), source.data(), 16);
  std::vector<float> values = Dequantize(GgmlType::kF32, bytes, 4);
  EXPECT_EQ(std::memcmp(values.data(), source.data(), 16), 0);
}

TEST(GgmlTypeTest, Q8_0ScalesSignedBytes) {
  std::vector<uint8_t> bytes(68, 0);
  Put<uint16_t>(bytes, 0, 0x3800);   // d = 0.5
  Put<uint16_t>(bytes, 34, 0xc000);  // d = -2
  for (int i = 0; i < 32; ++i) {
    bytes[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(i - 16));
    bytes[36 + i] = static_cast<uint8_t>(static_cast<int8_t>(i == 0 ? -128 : 127));
  }
  std::vector<float> values = Dequantize(GgmlType::kQ8_0, bytes, 64);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(values[i], 0.5f * (i - 16)) << i;
  EXPECT_EQ(values[32], 256.0f);
  EXPECT_EQ(values[33], -254.0f);
}

TEST(GgmlTypeTest, Q4_0PutsLowNibblesFirstAndCentresOnEight) {
  std::vector<uint8_t> bytes(18, 0);
  Put<uint16_t>(bytes, 0, 0x4000);  // d = 2
  for (int i = 0; i < 16; ++i) bytes[2 + i] = static_cast<uint8_t>(i | ((15 - i) << 4));
  std::vector<float> values = Dequantize(GgmlType::kQ4_0, bytes, 32);
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(values[i], 2.0f * (i - 8)) << i;
    EXPECT_EQ(values[16 + i], 2.0f * (7 - i)) << i;
  }
}

TEST(GgmlTypeTest, Q4_1AddsTheMinimum) {
  std::vector<uint8_t> bytes(20, 0);
  Put<uint16_t>(bytes, 0, 0x3800);  // d = 0.5
  Put<uint16_t>(bytes, 2, 0xbc00);  // m = -1
  for (int i = 0; i < 16; ++i) bytes[4 + i] = static_cast<uint8_t>(i | (3 << 4));
  std::vector<float> values = Dequantize(GgmlType::kQ4_1, bytes, 32);
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(values[i], 0.5f * i - 1.0f) << i;
    EXPECT_EQ(values[16 + i], 0.5f) << i;
  }
}

// Q4_K/Q5_K scales: bytes 0-3 low 6 bits = scales 0-3, bytes 4-7 = mins 0-3, bytes 8-11
// low/high nibbles = low bits of scales/mins 4-7, whose top 2 bits are the top bits of
// bytes 0-3 / 4-7.
std::vector<uint8_t> KScales() {
  std::vector<uint8_t> scales(12, 0);
  scales[0] = 0x41;  // scale 0 = 1; top bits 01 -> scale 4 bit 4
  scales[1] = 3;     // scale 1 = 3
  scales[4] = 2;     // min 0 = 2
  scales[5] = 0;     // min 1 = 0
  scales[8] = 0x23;  // scale 4 = 0x10 | 3 = 19, min 4 = 2
  return scales;
}

TEST(GgmlTypeTest, Q4_KUnpacksSixBitScalesAndMins) {
  std::vector<uint8_t> bytes(144, 0);
  Put<uint16_t>(bytes, 0, 0x3c00);  // d = 1
  Put<uint16_t>(bytes, 2, 0x3800);  // dmin = 0.5
  const std::vector<uint8_t> scales = KScales();
  std::copy(scales.begin(), scales.end(), bytes.begin() + 4);
  for (int i = 0; i < 128; ++i) bytes[16 + i] = 0x75;
  std::vector<float> values = Dequantize(GgmlType::kQ4_K, bytes, 256);
  EXPECT_EQ(values[0], 1.0f * 5 - 0.5f * 2);    // sub-block 0: low nibbles of 0..31
  EXPECT_EQ(values[31], 4.0f);
  EXPECT_EQ(values[32], 3.0f * 7 - 0.0f);       // sub-block 1: high nibbles of 0..31
  EXPECT_EQ(values[128], 19.0f * 5 - 0.5f * 2);  // sub-block 4: low nibbles of 64..95
  EXPECT_EQ(values[64], 0.0f);                  // sub-block 2: scale 0, min 0
}

TEST(GgmlTypeTest, Q5_KTakesTheFifthBitFromQh) {
  std::vector<uint8_t> bytes(176, 0);
  Put<uint16_t>(bytes, 0, 0x3c00);  // d = 1
  Put<uint16_t>(bytes, 2, 0x3800);  // dmin = 0.5
  const std::vector<uint8_t> scales = KScales();
  std::copy(scales.begin(), scales.end(), bytes.begin() + 4);
  for (int i = 0; i < 32; ++i) bytes[16 + i] = (i % 2 == 0) ? 0x01 : 0x12;  // bits 0, 1, 4
  for (int i = 0; i < 128; ++i) bytes[48 + i] = 0x75;
  std::vector<float> values = Dequantize(GgmlType::kQ5_K, bytes, 256);
  EXPECT_EQ(values[0], 1.0f * (5 + 16) - 1.0f);  // sub-block 0, bit 0 set
  EXPECT_EQ(values[1], 1.0f * 5 - 1.0f);         // bit 0 clear
  EXPECT_EQ(values[32], 3.0f * 7);               // sub-block 1, bit 1 clear
  EXPECT_EQ(values[33], 3.0f * (7 + 16));        // bit 1 set
  EXPECT_EQ(values[129], 19.0f * (5 + 16) - 1.0f);  // sub-block 4, bit 4 set
  EXPECT_EQ(values[128], 19.0f * 5 - 1.0f);
}

TEST(GgmlTypeTest, Q6_KCombinesNibblesAndTwoBitHighsPerSixteenScale) {
  std::vector<uint8_t> bytes(210, 0);
  for (int i = 0; i < 128; ++i) bytes[i] = 0x21;        // low nibble 1, high nibble 2
  for (int i = 0; i < 64; ++i) bytes[128 + i] = 0xe4;   // 2-bit fields 0, 1, 2, 3
  for (int g = 0; g < 16; ++g) bytes[192 + g] = static_cast<uint8_t>(static_cast<int8_t>(g - 8));
  Put<uint16_t>(bytes, 208, 0x3c00);  // d = 1
  std::vector<float> values = Dequantize(GgmlType::kQ6_K, bytes, 256);
  for (int index = 0; index < 256; ++index) {
    const int r = index % 128;
    const int low = r < 64 ? 1 : 2;
    const int high = r / 32;
    const float expected = static_cast<float>(index / 16 - 8) * ((low | (high << 4)) - 32);
    ASSERT_EQ(values[index], expected) << index;
  }
}

}  // namespace
}  // namespace loom::common
