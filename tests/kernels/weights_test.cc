#include "kernels/cpu/weights.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <tuple>
#include <vector>

#include "kernels/cpu/half.h"
#include "kernels/cpu/matmul_internal.h"
#include "kernels/cpu/weights_internal.h"

namespace loom::kernels::cpu {
namespace {

using common::GgmlType;

// Random GGUF blocks of 32 (Q4_0, Q4_1, Q8_0, Q5_0, Q5_1, IQ4_NL): F16 scales (and mins) of
// both signs, random payload bytes; MXFP4: E8M0 exponents 2^-18 .. 2^12 (F16 scales).
std::vector<uint8_t> RandomGgufBlocks(GgmlType type, int64_t num_elements, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> scale(-0.5f, 0.5f);
  std::uniform_int_distribution<int> byte(0, 255);
  const absl::StatusOr<common::GgmlTypeTraits> traits =
      common::GetGgmlTypeTraits(static_cast<uint32_t>(type));
  const int64_t block_bytes = traits->type_size;
  const int header = type == GgmlType::kQ4_1 || type == GgmlType::kQ5_1 ? 4
                     : type == GgmlType::kMXFP4                         ? 1
                                                                        : 2;
  std::vector<uint8_t> out((num_elements / 32) * block_bytes);
  for (size_t b = 0; b < out.size(); b += block_bytes) {
    if (type == GgmlType::kMXFP4) out[b] = static_cast<uint8_t>(110 + byte(rng) % 31);
    for (int h = 0; h < header - 1; h += 2) {
      const uint16_t half = FloatToHalf(scale(rng));
      std::memcpy(&out[b + h], &half, 2);
    }
    for (int64_t i = header; i < block_bytes; ++i) out[b + i] = static_cast<uint8_t>(byte(rng));
  }
  return out;
}

std::vector<float> RandomValues(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

std::vector<float> Unpack(const PackedWeight& w) {
  std::vector<float> out(w.rows * w.cols, std::nanf(""));
  DequantizeRows(w, 0, w.rows, out.data());
  return out;
}

class LosslessPackTest : public testing::TestWithParam<GgmlType> {};

TEST_P(LosslessPackTest, DequantizedPackIsBitIdenticalToGguf) {
  const GgmlType type = GetParam();
  uint32_t seed = 11;
  for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{1, 32}, {37, 96}, {64, 576}}) {
    const std::vector<uint8_t> blocks = RandomGgufBlocks(type, rows * cols, ++seed);
    std::vector<float> expected(rows * cols);
    ASSERT_TRUE(common::DequantizeToF32(type, blocks.data(), rows * cols, expected.data()).ok());
    absl::StatusOr<PackedWeight> packed = PackWeight(type, blocks.data(), rows, cols);
    ASSERT_TRUE(packed.ok()) << packed.status();
    const WeightFormat format =
        type == GgmlType::kQ4_0 || type == GgmlType::kQ4_1      ? WeightFormat::kInt4
        : type == GgmlType::kQ5_0 || type == GgmlType::kQ5_1    ? WeightFormat::kInt5
        : type == GgmlType::kIQ4_NL || type == GgmlType::kMXFP4 ? WeightFormat::kNl4
                                                                : WeightFormat::kInt8;
    EXPECT_EQ(packed->format, format);
    EXPECT_EQ(packed->group_size, 32);
    EXPECT_NE(packed->source.find("lossless"), std::string::npos) << packed->source;
    const std::vector<float> got = Unpack(*packed);
    EXPECT_EQ(std::memcmp(got.data(), expected.data(), got.size() * sizeof(float)), 0)
        << "rows " << rows << " cols " << cols;
    // A single row read alone matches too (the embedding lookup path).
    std::vector<float> row(cols);
    DequantizeRows(*packed, rows - 1, rows, row.data());
    EXPECT_EQ(std::memcmp(row.data(), expected.data() + (rows - 1) * cols, cols * 4), 0);
    if (format == WeightFormat::kNl4) {  // and in their INT8 form, the same values
      absl::StatusOr<PackedWeight> int8 =
          PackWeight(type, blocks.data(), rows, cols, {.table_4bit_as_int8 = true});
      ASSERT_TRUE(int8.ok()) << int8.status();
      EXPECT_EQ(int8->format, WeightFormat::kInt8);
      const std::vector<float> wide = Unpack(*int8);
      EXPECT_EQ(std::memcmp(wide.data(), expected.data(), wide.size() * sizeof(float)), 0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Gguf, LosslessPackTest,
                         testing::Values(GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ8_0,
                                         GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kIQ4_NL,
                                         GgmlType::kMXFP4));

// Columns cut out of NL4 (MXFP4), INT8 (Q8_0), INT4 (Q4_1) and INT5 (Q5_0) weights: the same
// values, whole groups kept as they were (the format too), groups cut in half split with F32
// scales (NL4 and INT5 then as INT8).
TEST(WeightsTest, SliceColumnsKeepsEveryValueWholeOrThroughGroups) {
  const int64_t rows = 19, cols = 128;
  for (GgmlType type : {GgmlType::kMXFP4, GgmlType::kQ8_0, GgmlType::kQ4_1, GgmlType::kQ5_0}) {
    const std::vector<uint8_t> blocks = RandomGgufBlocks(type, rows * cols, 7);
    absl::StatusOr<PackedWeight> packed = PackWeight(type, blocks.data(), rows, cols);
    ASSERT_TRUE(packed.ok()) << packed.status();
    const std::vector<float> all = Unpack(*packed);
    for (auto [begin, count, group] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
             {0, 64, 32}, {32, 96, 32}, {16, 48, 16}, {48, 80, 16}, {0, 16, 16}}) {
      SCOPED_TRACE(testing::Message() << common::RawGgmlTypeName(static_cast<uint32_t>(type))
                                      << " [" << begin << ", " << begin + count << ")");
      absl::StatusOr<PackedWeight> slice = SliceColumns(*packed, begin, count);
      ASSERT_TRUE(slice.ok()) << slice.status();
      EXPECT_EQ(slice->group_size, group);
      EXPECT_EQ(slice->f32_scaled(), group != 32 || packed->f32_scaled());
      EXPECT_EQ(slice->format, group == 32 || packed->format == WeightFormat::kInt4
                                   ? packed->format
                                   : WeightFormat::kInt8);
      const std::vector<float> got = Unpack(*slice);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < count; ++c) {
          ASSERT_EQ(got[r * count + c], all[r * cols + begin + c]) << r << ", " << c;
        }
      }
    }
    EXPECT_FALSE(SliceColumns(*packed, 8, 64).ok());    // pieces of 8 columns
    EXPECT_FALSE(SliceColumns(*packed, 64, 128).ok());  // past the end
  }
}

// MXFP4 exponents outside F16's powers of two (2^-24 .. 2^15) keep the INT8 scales in F32:
// still bit for bit what gguf dequantizes, subnormal F32 scales included.
TEST(WeightsTest, Mxfp4WithExtremeExponentsKeepsF32Scales) {
  for (const uint8_t extreme : {uint8_t{0}, uint8_t{1}, uint8_t{103}, uint8_t{144}, uint8_t{254}}) {
    const int64_t rows = 9, cols = 64;
    std::vector<uint8_t> blocks = RandomGgufBlocks(GgmlType::kMXFP4, rows * cols, extreme);
    blocks[17 * 5] = extreme;
    std::vector<float> expected(rows * cols);
    ASSERT_TRUE(
        common::DequantizeToF32(GgmlType::kMXFP4, blocks.data(), rows * cols, expected.data())
            .ok());
    absl::StatusOr<PackedWeight> packed = PackWeight(GgmlType::kMXFP4, blocks.data(), rows, cols);
    ASSERT_TRUE(packed.ok()) << packed.status();
    EXPECT_TRUE(packed->f32_scaled()) << int{extreme};
    const std::vector<float> got = Unpack(*packed);
    EXPECT_EQ(std::memcmp(got.data(), expected.data(), got.size() * sizeof(float)), 0)
        << int{extreme};
  }
  // Within range: F16 scales.
  const std::vector<uint8_t> blocks = RandomGgufBlocks(GgmlType::kMXFP4, 64, 1);
  EXPECT_FALSE(PackWeight(GgmlType::kMXFP4, blocks.data(), 1, 64)->f32_scaled());
}

// The legacy 5-bit formats keep their 5 bits: a Q5_0/Q5_1 weight reads 0.75 bytes per weight
// (nibbles, fifth bits, F16 scale and min per 32), not INT8's 1.06; every q survives.
TEST(WeightsTest, Int5KeepsEveryQAndReadsThreeQuartersOfAByte) {
  const int64_t rows = 37, cols = 96;
  const std::vector<uint8_t> blocks = RandomGgufBlocks(GgmlType::kQ5_0, rows * cols, 3);
  absl::StatusOr<PackedWeight> packed = PackWeight(GgmlType::kQ5_0, blocks.data(), rows, cols);
  ASSERT_TRUE(packed.ok()) << packed.status();
  const int64_t padded_rows = internal::NumRowBlocks(rows) * internal::kRowBlock;
  EXPECT_EQ(packed->bytes(), padded_rows * cols * 3 / 4);
  for (int64_t row = 0; row < rows; ++row) {
    for (int64_t g = 0; g < cols / 32; ++g) {
      int q[32];
      const uint8_t* block = blocks.data() + (row * (cols / 32) + g) * 22;
      common::Unpack5Bit(block + 2, block + 6, q);
      for (int j = 0; j < 32; ++j) ASSERT_EQ(internal::GetQ(*packed, row, g * 32 + j), q[j]);
    }
  }
  // The same values as INT8 q - 16 when asked (the CPU forward pass under float
  // activations), bit for bit what gguf dequantizes.
  absl::StatusOr<PackedWeight> as_int8 =
      PackWeight(GgmlType::kQ5_0, blocks.data(), rows, cols, {.q5_0_as_int8 = true});
  ASSERT_TRUE(as_int8.ok()) << as_int8.status();
  EXPECT_EQ(as_int8->format, WeightFormat::kInt8);
  std::vector<float> expected(rows * cols);
  ASSERT_TRUE(
      common::DequantizeToF32(GgmlType::kQ5_0, blocks.data(), rows * cols, expected.data()).ok());
  const std::vector<float> got = Unpack(*as_int8);
  EXPECT_EQ(std::memcmp(got.data(), expected.data(), got.size() * sizeof(float)), 0);
}

// Fused matrices with INT5 parts widen without loss: INT4 beside INT5 -> INT5; symmetric
// INT5 (Q5_0) beside INT8 (Q8_0, as a Q4_K_M file's Q/K beside its V) -> INT8 q - 16 under
// the same F16 scales, one byte per weight; asymmetric INT5 (Q5_1) beside INT8 -> INT8
// with F32 scales and mins.
TEST(WeightsTest, ConcatRowsWidensInt5PartsWithoutLoss) {
  const int64_t cols = 64;
  const std::vector<uint8_t> q5_0 = RandomGgufBlocks(GgmlType::kQ5_0, 24 * cols, 4);
  const std::vector<uint8_t> q5_1 = RandomGgufBlocks(GgmlType::kQ5_1, 8 * cols, 5);
  const std::vector<uint8_t> q8_0 = RandomGgufBlocks(GgmlType::kQ8_0, 8 * cols, 6);
  const std::vector<uint8_t> q4_1 = RandomGgufBlocks(GgmlType::kQ4_1, 8 * cols, 7);
  const PackedWeight a = *PackWeight(GgmlType::kQ5_0, q5_0.data(), 24, cols);
  const PackedWeight b = *PackWeight(GgmlType::kQ5_1, q5_1.data(), 8, cols);
  const PackedWeight c = *PackWeight(GgmlType::kQ8_0, q8_0.data(), 8, cols);
  const PackedWeight d = *PackWeight(GgmlType::kQ4_1, q4_1.data(), 8, cols);
  auto stacked = [](std::vector<const PackedWeight*> parts) {
    std::vector<float> values;
    for (const PackedWeight* part : parts) {
      const std::vector<float> more = Unpack(*part);
      values.insert(values.end(), more.begin(), more.end());
    }
    return values;
  };
  auto same_bits = [](const std::vector<float>& x, const std::vector<float>& y) {
    return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * 4) == 0;
  };
  absl::StatusOr<PackedWeight> q5_q4 = ConcatRows({&a, &d});
  ASSERT_TRUE(q5_q4.ok()) << q5_q4.status();
  EXPECT_EQ(q5_q4->format, WeightFormat::kInt5);
  EXPECT_TRUE(same_bits(Unpack(*q5_q4), stacked({&a, &d})));

  absl::StatusOr<PackedWeight> symmetric = ConcatRows({&a, &c});
  ASSERT_TRUE(symmetric.ok()) << symmetric.status();
  EXPECT_EQ(symmetric->format, WeightFormat::kInt8);
  EXPECT_FALSE(symmetric->f32_scaled());
  // Values equal; Q5_0's d * (q - 16) and INT8's q' * d agree up to the sign of a zero.
  EXPECT_EQ(Unpack(*symmetric), stacked({&a, &c}));

  absl::StatusOr<PackedWeight> asymmetric = ConcatRows({&a, &b, &c});
  ASSERT_TRUE(asymmetric.ok()) << asymmetric.status();
  EXPECT_EQ(asymmetric->format, WeightFormat::kInt8);
  EXPECT_TRUE(asymmetric->f32_scaled());
  EXPECT_EQ(Unpack(*asymmetric), stacked({&a, &b, &c}));
}

// A Q4_0 scale whose min (-8 * scale) overflows F16 refuses the tensor, naming the lowest
// such row even when row runs are packed on several threads at once.
TEST(WeightsTest, AnOverflowingQ4_0ScaleNamesItsLowestRow) {
  constexpr int64_t rows = 1 << 17, cols = 32;  // enough row blocks for several threads
  std::vector<uint8_t> blocks = RandomGgufBlocks(GgmlType::kQ4_0, rows * cols, 11);
  for (const int64_t row : {int64_t{100}, rows - 5}) {
    const uint16_t largest_half = 0x7bff;  // 65504: -8 x it is no half
    std::memcpy(blocks.data() + row * 18, &largest_half, 2);
  }
  for (int attempt = 0; attempt < 3; ++attempt) {
    absl::StatusOr<PackedWeight> packed = PackWeight(GgmlType::kQ4_0, blocks.data(), rows, cols);
    ASSERT_FALSE(packed.ok());
    EXPECT_EQ(packed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(packed.status().message().find("at row 100 "), absl::string_view::npos)
        << packed.status();
  }
}

TEST(WeightsTest, F16AndF32PackWithoutLoss) {
  const int64_t rows = 19, cols = 40;
  const std::vector<float> values = RandomValues(rows * cols, 5);
  absl::StatusOr<PackedWeight> f32 = PackWeight(GgmlType::kF32, values.data(), rows, cols);
  ASSERT_TRUE(f32.ok()) << f32.status();
  EXPECT_EQ(Unpack(*f32), values);

  std::vector<uint16_t> halves(rows * cols);
  std::vector<float> rounded(rows * cols);
  for (size_t i = 0; i < halves.size(); ++i) {
    halves[i] = FloatToHalf(values[i]);
    rounded[i] = internal::HalfToFloat(halves[i]);
  }
  absl::StatusOr<PackedWeight> f16 = PackWeight(GgmlType::kF16, halves.data(), rows, cols);
  ASSERT_TRUE(f16.ok()) << f16.status();
  EXPECT_EQ(f16->format, WeightFormat::kF16);
  EXPECT_EQ(Unpack(*f16), rounded);
}

// A BF16 checkpoint's bits stay as they are (subnormals and NaN payloads too), laid out as
// AMX-BF16 B tiles with the columns past cols, up to a multiple of 32, zero.
TEST(WeightsTest, Bf16PacksItsBitsWithoutLossAsAmxTiles) {
  const int64_t rows = 19, cols = 41;
  std::mt19937 rng(8);
  std::uniform_int_distribution<int> bits(0, 0xffff);
  std::vector<uint16_t> raw(rows * cols);
  for (uint16_t& b : raw) b = static_cast<uint16_t>(bits(rng));
  raw[0] = 0x0001;  // the smallest subnormal
  raw[1] = 0x7fc1;  // a NaN with a payload
  absl::StatusOr<PackedWeight> packed = PackWeight(GgmlType::kBF16, raw.data(), rows, cols);
  ASSERT_TRUE(packed.ok()) << packed.status();
  EXPECT_EQ(packed->format, WeightFormat::kBf16);
  EXPECT_EQ(packed->source, "BF16 -> BF16 (lossless)");
  EXPECT_EQ(packed->data.size(), 2u * 16 * 64 * 2);  // two row blocks of 64 columns
  EXPECT_EQ(packed->bytes(), static_cast<int64_t>(packed->data.size()));
  const std::vector<float> values = Unpack(*packed);
  const uint16_t* data = reinterpret_cast<const uint16_t*>(packed->data.data());
  for (int64_t row = 0; row < 32; ++row) {
    const uint16_t* block = data + (row / 16) * 64 * 16;
    for (int64_t c = 0; c < 64; ++c) {
      const uint16_t stored = block[(c / 2) * 32 + (row % 16) * 2 + c % 2];
      if (row >= rows || c >= cols) {
        ASSERT_EQ(stored, 0) << "padding (" << row << ", " << c << ")";
        continue;
      }
      ASSERT_EQ(stored, raw[row * cols + c]) << "(" << row << ", " << c << ")";
      uint32_t unpacked;
      std::memcpy(&unpacked, &values[row * cols + c], 4);
      ASSERT_EQ(unpacked, static_cast<uint32_t>(raw[row * cols + c]) << 16);
    }
  }
}

// F16 and F32 matrices packed for --activations bf16 hold each value rounded to nearest even
// (what the kernel would round them to); without the option they stay as they are.
TEST(WeightsTest, FloatsAsBf16RoundsF16AndF32ToNearestEven) {
  const int64_t rows = 21, cols = 40;
  const std::vector<float> values = RandomValues(rows * cols, 6);
  std::vector<uint16_t> halves(values.size());
  for (size_t i = 0; i < values.size(); ++i) halves[i] = FloatToHalf(values[i]);
  const PackOptions as_bf16{.floats_as_bf16 = true};
  absl::StatusOr<PackedWeight> f32 = PackWeight(GgmlType::kF32, values.data(), rows, cols, as_bf16);
  absl::StatusOr<PackedWeight> f16 = PackWeight(GgmlType::kF16, halves.data(), rows, cols, as_bf16);
  ASSERT_TRUE(f32.ok() && f16.ok());
  EXPECT_EQ(f32->format, WeightFormat::kBf16);
  EXPECT_EQ(f16->format, WeightFormat::kBf16);
  const std::vector<float> from_f32 = Unpack(*f32), from_f16 = Unpack(*f16);
  int changed = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    ASSERT_EQ(from_f32[i], RoundToBf16(values[i])) << i;
    ASSERT_EQ(from_f16[i], RoundToBf16(internal::HalfToFloat(halves[i]))) << i;
    changed += from_f32[i] != values[i];
  }
  EXPECT_GT(changed, static_cast<int>(values.size()) / 2);  // it really rounds
  EXPECT_EQ(PackWeight(GgmlType::kF16, halves.data(), rows, cols)->format, WeightFormat::kF16);
  EXPECT_EQ(PackWeight(GgmlType::kF32, values.data(), rows, cols)->format, WeightFormat::kF32);
  // Quantized types are what they are.
  EXPECT_NE(PackWeight(GgmlType::kQ8_0, RandomGgufBlocks(GgmlType::kQ8_0, rows * 64, 3).data(),
                       rows, 64, as_bf16)
                ->format,
            WeightFormat::kBf16);
}

TEST(WeightsTest, HalfToFloatInvertsFloatToHalfForEveryFiniteHalf) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00) continue;  // Inf / NaN
    const float f = internal::HalfToFloat(static_cast<uint16_t>(h));
    ASSERT_EQ(FloatToHalf(f), h) << std::hex << h;
  }
}

TEST(WeightsTest, RoundToNearestQuantizationStaysWithinHalfAStep) {
  const int64_t rows = 21, cols = 128;
  const std::vector<float> values = RandomValues(rows * cols, 9);
  for (auto [format, group] : std::vector<std::pair<WeightFormat, int64_t>>{
           {WeightFormat::kInt8, 32}, {WeightFormat::kInt8, 128}, {WeightFormat::kInt4, 32},
           {WeightFormat::kInt4, 64}}) {
    absl::StatusOr<PackedWeight> packed = PackFromF32(values.data(), rows, cols, format, group);
    ASSERT_TRUE(packed.ok()) << packed.status();
    const std::vector<float> got = Unpack(*packed);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t g = 0; g < cols / group; ++g) {
        float lo = 1e30f, hi = -1e30f, amax = 0.0f;
        for (int64_t j = 0; j < group; ++j) {
          const float v = values[r * cols + g * group + j];
          lo = std::min(lo, v);
          hi = std::max(hi, v);
          amax = std::max(amax, std::fabs(v));
        }
        // One step of the grid (F16-rounded scale: up to 0.1% coarser), plus the F16
        // rounding of the INT4 min.
        const float step = format == WeightFormat::kInt8 ? amax / 127 : (hi - lo) / 15;
        const float bound = 0.5f * step * 1.002f + (format == WeightFormat::kInt4 ? std::fabs(lo) * 1e-3f : 0.0f);
        for (int64_t j = 0; j < group; ++j) {
          const int64_t i = r * cols + g * group + j;
          ASSERT_LE(std::fabs(got[i] - values[i]), bound)
              << "format " << static_cast<int>(format) << " row " << r << " col " << g * group + j;
        }
      }
    }
  }
}

TEST(WeightsTest, ConcatRowsStacksPartsForAlignedAndUnalignedRowCounts) {
  for (auto [format, group] :
       std::vector<std::pair<WeightFormat, int64_t>>{{WeightFormat::kF32, 0},
                                                     {WeightFormat::kF16, 0},
                                                     {WeightFormat::kBf16, 0},
                                                     {WeightFormat::kInt8, 32},
                                                     {WeightFormat::kInt4, 32}}) {
    const int64_t cols = 64;
    std::vector<PackedWeight> parts;
    std::vector<float> expected;
    uint32_t seed = 40;
    for (int64_t rows : {32, 7, 16, 9}) {
      const std::vector<float> values = RandomValues(rows * cols, ++seed);
      absl::StatusOr<PackedWeight> part = PackFromF32(values.data(), rows, cols, format, group);
      ASSERT_TRUE(part.ok());
      const std::vector<float> unpacked = Unpack(*part);
      expected.insert(expected.end(), unpacked.begin(), unpacked.end());
      parts.push_back(*std::move(part));
    }
    absl::StatusOr<PackedWeight> fused = ConcatRows({&parts[0], &parts[1], &parts[2], &parts[3]});
    ASSERT_TRUE(fused.ok()) << fused.status();
    EXPECT_EQ(fused->rows, 64);
    EXPECT_EQ(Unpack(*fused), expected) << "format " << static_cast<int>(format);
  }
}

TEST(WeightsTest, ConcatRowsRejectsFloatBesideOtherFormats) {
  const std::vector<float> values = RandomValues(16 * 64, 3);
  absl::StatusOr<PackedWeight> a = PackFromF32(values.data(), 16, 64, WeightFormat::kInt4, 32);
  absl::StatusOr<PackedWeight> b = PackFromF32(values.data(), 16, 64, WeightFormat::kF16, 0);
  absl::StatusOr<PackedWeight> c = PackFromF32(values.data(), 16, 64, WeightFormat::kF32, 0);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(ConcatRows({&*a, &*b}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ConcatRows({&*b, &*c}).status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<PackedWeight> d = PackFromF32(values.data(), 16, 64, WeightFormat::kBf16, 0);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(ConcatRows({&*b, &*d}).status().code(), absl::StatusCode::kInvalidArgument);
}

// NL4 weights (IQ4_NL, MXFP4) keep their codes and table where they can: fused with parts of
// the same table they stay NL4, beside another table or another format they become INT8 (the
// levels), beside nothing they unpack to INT8's natural form; every value survives. Nothing
// rounds to NL4.
TEST(WeightsTest, Nl4PartsStayNl4WithTheirOwnTableAndWidenOtherwise) {
  const int64_t cols = 96;
  auto pack = [&](GgmlType type, int64_t rows, uint32_t seed) {
    const std::vector<uint8_t> blocks = RandomGgufBlocks(type, rows * cols, seed);
    absl::StatusOr<PackedWeight> packed = PackWeight(type, blocks.data(), rows, cols);
    EXPECT_TRUE(packed.ok()) << packed.status();
    return *std::move(packed);
  };
  const PackedWeight a = pack(GgmlType::kIQ4_NL, 19, 1), b = pack(GgmlType::kIQ4_NL, 16, 2);
  const PackedWeight c = pack(GgmlType::kMXFP4, 5, 3), d = pack(GgmlType::kQ8_0, 16, 4);
  ASSERT_EQ(a.format, WeightFormat::kNl4);
  ASSERT_EQ(c.format, WeightFormat::kNl4);
  for (auto [parts, format] :
       std::vector<std::pair<std::vector<const PackedWeight*>, WeightFormat>>{
           {{&a, &b}, WeightFormat::kNl4},
           {{&b, &a}, WeightFormat::kNl4},
           {{&a, &c}, WeightFormat::kInt8},
           {{&a, &d, &c}, WeightFormat::kInt8}}) {
    absl::StatusOr<PackedWeight> fused = ConcatRows(parts);
    ASSERT_TRUE(fused.ok()) << fused.status();
    EXPECT_EQ(fused->format, format) << fused->source;
    EXPECT_FALSE(fused->f32_scaled());
    std::vector<float> want;
    for (const PackedWeight* part : parts) {
      const std::vector<float> values = Unpack(*part);
      want.insert(want.end(), values.begin(), values.end());
    }
    const std::vector<float> got = Unpack(*fused);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << fused->source;
  }
  for (const PackedWeight* w : {&a, &c}) {
    absl::StatusOr<NaturalQuantizedWeight> natural = UnpackQuantized(*w);
    ASSERT_TRUE(natural.ok()) << natural.status();
    EXPECT_TRUE(natural->mins.empty() && natural->scales_f32.empty());
    const std::vector<float> values = Unpack(*w);
    for (int64_t i = 0; i < w->rows * cols; ++i) {
      const float scale = internal::HalfToFloat(natural->scales[i / 32]);
      ASSERT_EQ(natural->q[i] * scale, values[i]) << i;
      ASSERT_NE(std::find(w->levels.begin(), w->levels.end(), natural->q[i]), w->levels.end());
    }
  }
  const std::vector<float> ones(32, 1.0f);
  EXPECT_EQ(PackFromF32(ones.data(), 1, 32, WeightFormat::kNl4, 32).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// The natural row-major values of an INT8/INT4 weight dequantize to what DequantizeRows
// gives (rows not a multiple of the 16-row interleave included); float formats refuse.
TEST(WeightsTest, UnpackQuantizedGivesTheValuesDequantizeRowsReads) {
  std::mt19937 rng(21);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (WeightFormat format : {WeightFormat::kInt4, WeightFormat::kInt8}) {
    for (int64_t group : {32, 64}) {
      const int64_t rows = 37, cols = 128;
      std::vector<float> values(rows * cols);
      for (float& v : values) v = normal(rng);
      auto packed = PackFromF32(values.data(), rows, cols, format, group);
      ASSERT_TRUE(packed.ok()) << packed.status();
      auto natural = UnpackQuantized(*packed);
      ASSERT_TRUE(natural.ok()) << natural.status();
      ASSERT_EQ(natural->q.size(), static_cast<size_t>(rows * cols));
      ASSERT_EQ(natural->scales.size(), static_cast<size_t>(rows * cols / group));
      ASSERT_EQ(natural->mins.size(), format == WeightFormat::kInt4 ? natural->scales.size() : 0u);
      std::vector<float> want(rows * cols);
      DequantizeRows(*packed, 0, rows, want.data());
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          const int64_t g = r * (cols / group) + c / group;
          const float scale = internal::HalfToFloat(natural->scales[g]);
          const float min = format == WeightFormat::kInt4 ? internal::HalfToFloat(natural->mins[g]) : 0.0f;
          const int q = natural->q[r * cols + c];
          if (format == WeightFormat::kInt4) {
            ASSERT_TRUE(q >= 0 && q <= 15) << q;
          }
          ASSERT_FLOAT_EQ(q * scale + min, want[r * cols + c]) << r << ", " << c;
        }
      }
    }
  }
  auto dense = PackFromF32(std::vector<float>(32, 1.0f).data(), 1, 32, WeightFormat::kF16, 0);
  ASSERT_TRUE(dense.ok());
  EXPECT_FALSE(UnpackQuantized(*dense).ok());
}

// INT5 in INT8's natural form for the CUDA W8A16 GEMM, without loss: Q5_0 (symmetric) as
// q - 16 with its F16 scales (Q8_0's form), Q5_1 as q in 0..31 with F32 scales and mins;
// one F32 q * scale + min gives exactly what gguf dequantizes.
TEST(WeightsTest, UnpackQuantizedGivesInt5AsExactInt8) {
  const int64_t rows = 37, cols = 128;
  for (const GgmlType type : {GgmlType::kQ5_0, GgmlType::kQ5_1}) {
    SCOPED_TRACE(static_cast<int>(type));
    const std::vector<uint8_t> blocks = RandomGgufBlocks(type, rows * cols, 9);
    absl::StatusOr<PackedWeight> packed = PackWeight(type, blocks.data(), rows, cols);
    ASSERT_TRUE(packed.ok()) << packed.status();
    ASSERT_EQ(packed->format, WeightFormat::kInt5);
    absl::StatusOr<NaturalQuantizedWeight> natural = UnpackQuantized(*packed);
    ASSERT_TRUE(natural.ok()) << natural.status();
    const bool symmetric = type == GgmlType::kQ5_0;
    EXPECT_EQ(natural->scales.empty(), !symmetric);
    EXPECT_EQ(natural->scales_f32.empty(), symmetric);
    EXPECT_EQ(natural->mins_f32.empty(), symmetric);
    EXPECT_TRUE(natural->mins.empty());
    std::vector<float> expected(rows * cols);
    ASSERT_TRUE(common::DequantizeToF32(type, blocks.data(), rows * cols, expected.data()).ok());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t g = r * (cols / 32) + c / 32;
        const int q = natural->q[r * cols + c];
        ASSERT_TRUE(symmetric ? q >= -16 && q <= 15 : q >= 0 && q <= 31) << q;
        const float value =
            symmetric
                ? static_cast<float>(q) * internal::HalfToFloat(natural->scales[g])
                : std::fma(static_cast<float>(q), natural->scales_f32[g], natural->mins_f32[g]);
        ASSERT_EQ(value, expected[r * cols + c]) << r << ", " << c;
      }
    }
  }
}

TEST(WeightsTest, RejectsUnsupportedTypesAndShapes) {
  const std::vector<uint8_t> bytes(1024, 1);
  EXPECT_EQ(PackWeight(static_cast<GgmlType>(23), bytes.data(), 2, 256)  // IQ4_XS
                       .status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PackWeight(GgmlType::kQ4_0, bytes.data(), 2, 48).status().code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<float> values = RandomValues(64, 1);
  EXPECT_EQ(PackFromF32(values.data(), 2, 32, WeightFormat::kInt4, 48).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PackFromF32(values.data(), 0, 32, WeightFormat::kF32, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace loom::kernels::cpu
