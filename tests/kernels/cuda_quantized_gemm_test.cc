#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_format.h"
#include "kernels/cuda/quantized_gemm.h"
#include "kernels/cuda/quantized_gemm_candidates.h"
#include "tests/kernels/cuda_test_util.h"

namespace loom::kernels::cuda {
namespace {

// ---------------------------------------------------------------- host helpers

/// `value` rounded to nearest even in `type` (F16 / BF16, subnormals included), in double: one
/// rounding of an exact value, as the GPU's fused multiply-add does.
double RoundToType(double value, DataType type) {
  if (value == 0.0 || !std::isfinite(value)) return value;
  const int precision = type == DataType::kF16 ? 11 : 8;
  const int min_exponent = type == DataType::kF16 ? -14 : -126;
  int exponent = 0;
  std::frexp(value, &exponent);  // |value| = f * 2^exponent, f in [0.5, 1)
  const int lead = std::max(exponent - 1, min_exponent);
  const double ulp = std::ldexp(1.0, lead - (precision - 1));
  return std::nearbyint(value / ulp) * ulp;
}

/// Unit roundoff of `type`: the relative error bound of one rounding.
double UnitRoundoff(DataType type) {
  return type == DataType::kF16 ? 0x1p-11 : type == DataType::kBF16 ? 0x1p-8 : 0x1p-24;
}

uint16_t ToF16Bits(float value) {
  uint16_t bits = 0;
  ConvertFromFloat(DataType::kF16, &value, 1, &bits);
  return bits;
}

float F16BitsToFloat(uint16_t bits) {
  float value = 0.0f;
  ConvertToFloat(DataType::kF16, &bits, 1, &value);
  return value;
}

/// Checks |actual - expected| <= tolerance elementwise and that nothing is NaN; reports the first
/// failure and the largest error relative to its tolerance.
::testing::AssertionResult WithinTolerance(const std::vector<float>& actual,
                                           const std::vector<double>& expected,
                                           const std::vector<double>& tolerance) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure() << "sizes " << actual.size() << " vs " << expected.size();
  }
  double worst = 0.0;
  for (size_t i = 0; i < actual.size(); ++i) {
    if (std::isnan(actual[i])) return ::testing::AssertionFailure() << "NaN at " << i;
    const double error = std::abs(actual[i] - expected[i]);
    worst = std::max(worst, error / tolerance[i]);
    if (!(error <= tolerance[i])) {
      return ::testing::AssertionFailure() << "at " << i << ": " << actual[i] << " vs expected "
                                           << expected[i] << " (tolerance " << tolerance[i] << ")";
    }
  }
  return ::testing::AssertionSuccess() << "largest error / tolerance " << worst;
}

/// Random quantized weights in the natural layouts, and the reference's view of them.
struct HostInt4 {
  std::vector<uint8_t> q;              // [n, k / 2], low nibble first
  std::vector<uint16_t> scales, mins;  // F16 [n, k / group]
};

HostInt4 RandomInt4(int64_t n, int64_t k, int64_t group, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.004f, 0.02f), min(-0.16f, 0.0f);
  HostInt4 w;
  w.q.resize(n * k / 2);
  for (uint8_t& b : w.q) b = static_cast<uint8_t>(byte(rng));
  w.scales.resize(n * k / group);
  w.mins.resize(n * k / group);
  for (uint16_t& s : w.scales) s = ToF16Bits(scale(rng));
  for (uint16_t& m : w.mins) m = ToF16Bits(min(rng));
  return w;
}

/// The weights the kernel multiplies: q * scale + min rounded once to `type`, with the F16 scale
/// and min first rounded to `type` (exact for F16). [n, k] row-major.
std::vector<double> DequantizedInt4(const HostInt4& w, int64_t n, int64_t k, int64_t group,
                                    DataType type) {
  std::vector<double> out(n * k);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < k; ++c) {
      const int64_t i = r * k + c, g = r * (k / group) + c / group;
      const int q = (w.q[i / 2] >> (4 * (i % 2))) & 0x0f;
      const double scale = RoundToType(F16BitsToFloat(w.scales[g]), type);
      const double min = RoundToType(F16BitsToFloat(w.mins[g]), type);
      out[i] = RoundToType(q * scale + min, type);
    }
  }
  return out;
}

struct Reference {
  std::vector<double> y;          // [m, n]
  std::vector<double> tolerance;  // [m, n]
};

/// y = x · w^T * row_scale + bias in double, and the stated tolerance per output: (2^-16 + u/16) *
/// sum_k |x||w| (F32 accumulation, with a margin for the dequantized weights) + u * |y| (the
/// output's rounding), u the unit roundoff of `type`.
Reference ReferenceGemm(const std::vector<float>& x, const std::vector<double>& w,
                        const std::vector<double>& row_scale, const std::vector<float>& bias,
                        int64_t m, int64_t n, int64_t k, DataType type) {
  const double u = UnitRoundoff(type);
  Reference ref;
  ref.y.resize(m * n);
  ref.tolerance.resize(m * n);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0.0, magnitude = 0.0;
      for (int64_t c = 0; c < k; ++c) {
        const double product = static_cast<double>(x[i * k + c]) * w[j * k + c];
        sum += product;
        magnitude += std::abs(product);
      }
      const double scale = row_scale.empty() ? 1.0 : row_scale[j];
      double value = sum * scale;
      magnitude *= scale;
      if (!bias.empty()) {
        value += bias[j];
        magnitude += std::abs(bias[j]);
      }
      ref.y[i * n + j] = value;
      ref.tolerance[i * n + j] = (0x1p-16 + u / 16) * magnitude + u * std::abs(value) + 1e-30;
    }
  }
  return ref;
}

// ---------------------------------------------------------------- packing (no GPU needed)

TEST(QuantGemmPackTest, Int4UnpackOfPackIsIdentity) {
  for (const auto& [n, k, group] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {16, 64, 32},
           {32, 128, 16},  // GGUF Q3_K / Q2_K groups
           {96, 256, 64},
           {48, 384, 128},
           {32, 128, 32},
           {1024, 4096, 128}}) {  // the last packed by several threads
    SCOPED_TRACE(testing::Message() << "n=" << n << " k=" << k << " group=" << group);
    const HostInt4 w = RandomInt4(n, k, group, static_cast<uint32_t>(n * 7 + k + group));
    absl::StatusOr<Int4GpuWeight> packed =
        PackInt4ForGpu(w.q.data(), w.scales.data(), w.mins.data(), n, k, group);
    ASSERT_TRUE(packed.ok()) << packed.status();
    EXPECT_EQ(packed->q.size(), static_cast<size_t>(n * k / 2));
    EXPECT_EQ(packed->scale_min.size(), static_cast<size_t>(2 * n * k / group));
    EXPECT_NE(packed->q, w.q);  // it is a different layout
    absl::StatusOr<Int4NaturalWeight> unpacked = UnpackInt4FromGpu(*packed, n, k, group);
    ASSERT_TRUE(unpacked.ok()) << unpacked.status();
    EXPECT_EQ(unpacked->q, w.q);
    EXPECT_EQ(unpacked->scales, w.scales);
    EXPECT_EQ(unpacked->mins, w.mins);
  }
}

// Single nibbles land where the mma A fragment (PTX ISA m16n8k16 .f16 layout) and the kernel's K
// permutation put them: lane (g, t) = (row % 8, (col % 32) / 8), word 2 * (col % 64 / 32) + (col %
// 8) / 4, nibble reg + 4 * (col % 2) with reg = row / 8 % 2 + 2 * ((col % 4) / 2).
TEST(QuantGemmPackTest, Int4NibblesLandInTheirFragmentSlots) {
  constexpr int64_t n = 32, k = 128, group = 32;
  struct Case {
    int64_t row, col;
    size_t byte;
    int shift;
  };
  const std::vector<Case> cases = {
      {0, 0, 0, 0},         // lane 0, word 0, nibble 0 (a0.lo)
      {0, 1, 2, 0},         // nibble 4 (a0.hi)
      {8, 0, 0, 4},         // nibble 1 (a1.lo: row g + 8)
      {0, 2, 1, 0},         // nibble 2 (a2.lo: columns +2 of the permutation)
      {8, 3, 3, 4},         // nibble 7 (a3.hi)
      {0, 4, 4, 0},         // word 1 (k16 step j = 1)
      {0, 8, 16, 0},        // lane 1 (t = 1)
      {1, 0, 64, 0},        // lane 4 (g = 1)
      {0, 32, 8, 0},        // word 2 (second 32-column half)
      {0, 64, 512, 0},      // the next 64-column chunk
      {16, 0, 2 * 512, 0},  // the next row tile: k / 64 = 2 chunks further
      {15, 63, 511, 4},     // lane 31, word 3, nibble 7
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::Message() << "row=" << c.row << " col=" << c.col);
    std::vector<uint8_t> q(n * k / 2, 0);
    const int64_t i = c.row * k + c.col;
    q[i / 2] = static_cast<uint8_t>(0x9 << (4 * (i % 2)));
    const std::vector<uint16_t> scales(n * k / group, 0x3c00), mins(n * k / group, 0);
    absl::StatusOr<Int4GpuWeight> packed =
        PackInt4ForGpu(q.data(), scales.data(), mins.data(), n, k, group);
    ASSERT_TRUE(packed.ok()) << packed.status();
    for (size_t b = 0; b < packed->q.size(); ++b) {
      const uint8_t expected = b == c.byte ? static_cast<uint8_t>(0x9 << c.shift) : 0;
      ASSERT_EQ(packed->q[b], expected) << "byte " << b;
    }
  }
  // Scale/min: (scale g, scale g + 8, min g, min g + 8) per lane group g, per (tile, group).
  std::vector<uint16_t> scales(n * k / group), mins(n * k / group);
  for (size_t i = 0; i < scales.size(); ++i) {
    scales[i] = static_cast<uint16_t>(2 * i);
    mins[i] = static_cast<uint16_t>(2 * i + 1);
  }
  const std::vector<uint8_t> q(n * k / 2, 0);
  absl::StatusOr<Int4GpuWeight> packed =
      PackInt4ForGpu(q.data(), scales.data(), mins.data(), n, k, group);
  ASSERT_TRUE(packed.ok());
  const int64_t groups = k / group;
  // Row 9 (tile 0, g = 1, upper half), group 2: entry ((0 * groups + 2) * 8 + 1) * 4 + {1, 3}.
  EXPECT_EQ(packed->scale_min[((0 * groups + 2) * 8 + 1) * 4 + 1], scales[9 * groups + 2]);
  EXPECT_EQ(packed->scale_min[((0 * groups + 2) * 8 + 1) * 4 + 3], mins[9 * groups + 2]);
  // Row 20 (tile 1, g = 4, lower half), group 0.
  EXPECT_EQ(packed->scale_min[((1 * groups + 0) * 8 + 4) * 4 + 0], scales[20 * groups + 0]);
  EXPECT_EQ(packed->scale_min[((1 * groups + 0) * 8 + 4) * 4 + 2], mins[20 * groups + 0]);
}

// `count` random INT8 values.
std::vector<int8_t> RandomInt8(int64_t count, std::mt19937& rng) {
  std::uniform_int_distribution<int> value(-128, 127);
  std::vector<int8_t> q(count);
  for (int8_t& v : q) v = static_cast<int8_t>(value(rng));
  return q;
}

// q [n, k] packed for the GPU, checked to unpack to q (empty when packing failed).
std::vector<uint8_t> PackInt8RoundTrip(const std::vector<int8_t>& q, int64_t n, int64_t k) {
  absl::StatusOr<std::vector<uint8_t>> packed = PackInt8ForGpu(q.data(), n, k);
  EXPECT_TRUE(packed.ok()) << packed.status();
  if (!packed.ok()) return {};
  absl::StatusOr<std::vector<int8_t>> unpacked = UnpackInt8FromGpu(*packed, n, k);
  EXPECT_TRUE(unpacked.ok()) << unpacked.status();
  if (unpacked.ok()) {
    EXPECT_EQ(*unpacked, q);
  }
  return *std::move(packed);
}

TEST(QuantGemmPackTest, Int8UnpackOfPackIsIdentityAndBytesLandInTheirSlots) {
  constexpr int64_t n = 48, k = 192;
  std::mt19937 rng(5);
  const std::vector<int8_t> q = RandomInt8(n * k, rng);
  const std::vector<uint8_t> bytes = PackInt8RoundTrip(q, n, k);
  ASSERT_EQ(bytes.size(), static_cast<size_t>(n * k));
  const std::vector<uint8_t>* packed = &bytes;
  // Lane (g, t), word 2j + h, byte 2 * (row / 8 % 2) + col % 2; 32-column chunks of 512 bytes.
  EXPECT_EQ(static_cast<int8_t>((*packed)[0]), q[0 * k + 0]);  // a0.lo
  EXPECT_EQ(static_cast<int8_t>((*packed)[1]), q[0 * k + 1]);  // a0.hi
  EXPECT_EQ(static_cast<int8_t>((*packed)[2]), q[8 * k + 0]);  // a1.lo
  EXPECT_EQ(static_cast<int8_t>((*packed)[4]), q[0 * k + 2]);  // word 1: a2.lo
  EXPECT_EQ(static_cast<int8_t>((*packed)[7]), q[8 * k + 3]);  // a3.hi
  EXPECT_EQ(static_cast<int8_t>((*packed)[8]),
            q[0 * k + 4]);                                      // word 2: step j = 1
  EXPECT_EQ(static_cast<int8_t>((*packed)[16]), q[0 * k + 8]);  // lane 1
  EXPECT_EQ(static_cast<int8_t>((*packed)[64]), q[1 * k + 0]);  // lane 4
  EXPECT_EQ(static_cast<int8_t>((*packed)[512]),
            q[0 * k + 32]);  // next 32 columns
  EXPECT_EQ(static_cast<int8_t>((*packed)[(k / 32) * 512]),
            q[16 * k]);  // next row tile
  // A layer large enough to be packed by several threads.
  constexpr int64_t big_n = 1024, big_k = 2048;
  PackInt8RoundTrip(RandomInt8(big_n * big_k, rng), big_n, big_k);
}

// Group-wise INT8 scales sit where INT4's scale/min put their scales, with zero mins.
TEST(QuantGemmPackTest, Int8GroupScalesFollowTheInt4ScaleLayout) {
  constexpr int64_t n = 32, k = 256;
  for (const int64_t group : {32, 64, 128}) {
    SCOPED_TRACE(group);
    const int64_t count = n * (k / group);
    std::vector<uint16_t> scales(count), zeros(count, 0);
    for (int64_t i = 0; i < count; ++i) scales[i] = static_cast<uint16_t>(0x3000 + i);
    const std::vector<uint8_t> q(n * k / 2, 0);
    absl::StatusOr<Int4GpuWeight> int4 =
        PackInt4ForGpu(q.data(), scales.data(), zeros.data(), n, k, group);
    ASSERT_TRUE(int4.ok()) << int4.status();
    absl::StatusOr<std::vector<uint16_t>> int8 =
        PackInt8GroupScalesForGpu(scales.data(), n, k, group);
    ASSERT_TRUE(int8.ok()) << int8.status();
    EXPECT_EQ(*int8, int4->scale_min);
  }
  const uint16_t one = 0x3c00;
  EXPECT_EQ(PackInt8GroupScalesForGpu(&one, 16, 64, 48).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PackInt8GroupScalesForGpu(&one, 10, 64, 32).status().code(),
            absl::StatusCode::kInvalidArgument);
  // One group per row is the per-channel form, whose scales the GEMM reads as they are.
  const std::vector<uint16_t> per_row(16, one);
  EXPECT_EQ(PackInt8GroupScalesForGpu(per_row.data(), 16, 64, 64).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// F32 group scales (K-quants): (scale g, scale g + 8) per lane group g, per (tile, group), or
// with mins (scale g, scale g + 8, min g, min g + 8): with mins, element for element where
// INT4's F16 scale/min layout (PackInt4ForGpu) puts the same values.
TEST(QuantGemmPackTest, Int8F32GroupScalesSitInTheirLaneSlots) {
  constexpr int64_t n = 32, k = 128;
  for (const int64_t group : {16, 32}) {
    SCOPED_TRACE(group);
    const int64_t groups = k / group, count = n * groups;
    std::vector<float> scales(count), mins(count);
    std::vector<uint16_t> scales16(count), mins16(count);
    for (int64_t i = 0; i < count; ++i) {
      scales[i] = 0.25f + static_cast<float>(i);  // exact in F16 too
      mins[i] = -1.0f - static_cast<float>(i);
      scales16[i] = ToF16Bits(scales[i]);
      mins16[i] = ToF16Bits(mins[i]);
    }
    const std::vector<uint8_t> q(n * k / 2, 0);
    absl::StatusOr<Int4GpuWeight> int4 =
        PackInt4ForGpu(q.data(), scales16.data(), mins16.data(), n, k, group);
    ASSERT_TRUE(int4.ok()) << int4.status();
    absl::StatusOr<std::vector<float>> plain =
        PackInt8GroupScalesF32ForGpu(scales.data(), nullptr, n, k, group);
    absl::StatusOr<std::vector<float>> with_mins =
        PackInt8GroupScalesF32ForGpu(scales.data(), mins.data(), n, k, group);
    ASSERT_TRUE(plain.ok()) << plain.status();
    ASSERT_TRUE(with_mins.ok()) << with_mins.status();
    ASSERT_EQ(plain->size(), static_cast<size_t>(count));
    ASSERT_EQ(with_mins->size(), static_cast<size_t>(2 * count));
    for (int64_t row = 0; row < n; ++row) {
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t lane_group = ((row / 16) * groups + g) * 8 + row % 8, hi = row % 16 / 8;
        EXPECT_EQ((*plain)[lane_group * 2 + hi], scales[row * groups + g]) << row << " " << g;
        EXPECT_EQ((*with_mins)[lane_group * 4 + hi], scales[row * groups + g]);
        EXPECT_EQ((*with_mins)[lane_group * 4 + 2 + hi], mins[row * groups + g]);
      }
    }
    ASSERT_EQ(with_mins->size(), int4->scale_min.size());
    for (size_t i = 0; i < with_mins->size(); ++i) {
      ASSERT_EQ((*with_mins)[i], F16BitsToFloat(int4->scale_min[i])) << i;
    }
  }
  const float one = 1.0f;
  EXPECT_NE(PackInt8GroupScalesF32ForGpu(&one, nullptr, 16, 128, 64)
                .status()
                .message()
                .find("group_size 64 unsupported (16, 32)"),
            std::string::npos);
  EXPECT_EQ(PackInt8GroupScalesF32ForGpu(nullptr, nullptr, 16, 64, 16).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PackInt8GroupScalesF32ForGpu(&one, nullptr, 10, 64, 16).status().code(),
            absl::StatusCode::kInvalidArgument);
  // F16 group scales have no groups of 16: K-quants are the only source of those.
  EXPECT_EQ(PackInt8GroupScalesForGpu(reinterpret_cast<const uint16_t*>(&one), 16, 64, 16)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(QuantGemmPackTest, PackRejectsUnsupportedShapes) {
  const std::vector<uint8_t> q(64 * 256);
  const std::vector<uint16_t> s(64 * 256);
  EXPECT_NE(
      PackInt4ForGpu(q.data(), s.data(), s.data(), 24, 256, 32).status().message().find("n 24"),
      std::string::npos);
  EXPECT_NE(
      PackInt4ForGpu(q.data(), s.data(), s.data(), 32, 96, 32).status().message().find("k 96"),
      std::string::npos);
  EXPECT_NE(PackInt4ForGpu(q.data(), s.data(), s.data(), 32, 256, 8)
                .status()
                .message()
                .find("group_size 8"),
            std::string::npos);
  EXPECT_NE(PackInt4ForGpu(q.data(), s.data(), s.data(), 32, 192, 128)
                .status()
                .message()
                .find("k 192 is not a multiple of group_size 128"),
            std::string::npos);
  const std::vector<int8_t> q8(64 * 256);
  EXPECT_EQ(PackInt8ForGpu(q8.data(), 20, 256).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(QuantGemmPackTest, E4m3RoundTripsEveryFiniteCode) {
  for (int code = 0; code < 256; ++code) {
    const float value = E4m3ToFloat(static_cast<uint8_t>(code));
    if ((code & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(value)) << code;
      continue;
    }
    EXPECT_EQ(FloatToE4m3(value), code) << code << " = " << value;
  }
  EXPECT_EQ(E4m3ToFloat(0x7e), 448.0f);
  EXPECT_EQ(E4m3ToFloat(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(FloatToE4m3(1000.0f), 0x7e);  // saturates
  EXPECT_EQ(FloatToE4m3(-1000.0f), 0xfe);
  // Every float between codes rounds to the nearest code by exhaustive search (ties to even).
  std::mt19937 rng(17);
  for (int i = 0; i < 20000; ++i) {
    const float value =
        std::ldexp(std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng), (i % 20) - 10);
    int best = 0;
    double best_error = std::fabs(value);
    for (int code = 1; code <= 0x7e; ++code) {
      const double error = std::fabs(E4m3ToFloat(static_cast<uint8_t>(code)) - std::fabs(value));
      if (error < best_error || (error == best_error && code % 2 == 0)) {
        best = code;
        best_error = error;
      }
    }
    ASSERT_EQ(FloatToE4m3(value), (std::signbit(value) ? 0x80 : 0) | best) << value;
  }
  EXPECT_EQ(FloatToE4m3(1.0625f),
            0x38);  // halfway between 1 and 1.125: to even (1.0)
  EXPECT_EQ(FloatToE4m3(1.1875f),
            0x3a);  // halfway between 1.125 and 1.25: to even (1.25)
}

// ---------------------------------------------------------------- checks (no GPU needed)

QuantGemmParams ValidParams(void* some_device_pointer) {
  QuantGemmParams p;
  p.x = p.weight = p.scales = some_device_pointer;
  p.y = some_device_pointer;
  p.act_dtype = DataType::kF16;
  p.format = QuantWeightFormat::kInt4;
  p.m = 256;  // output tiles fill any GPU of <= 256 SMs at n = 14336: no split
  p.n = 14336;
  p.k = 4096;
  p.group_size = 128;
  return p;
}

TEST(CudaQuantGemmTest, RejectsUnsupportedShapesBeforeLaunch) {
  alignas(16) static uint8_t storage[64] = {};
  ASSERT_TRUE(CheckQuantGemmParams(ValidParams(storage)).ok())
      << CheckQuantGemmParams(ValidParams(storage));
  EXPECT_EQ(QuantGemmWorkspaceBytes(ValidParams(storage)), 0u);
  auto expect_invalid = [&](const QuantGemmParams& p, const std::string& fragment) {
    const absl::Status status = CheckQuantGemmParams(p);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << fragment;
    EXPECT_NE(status.message().find(fragment), std::string::npos) << status;
    EXPECT_EQ(LaunchQuantGemm(p, nullptr).code(), absl::StatusCode::kInvalidArgument);
  };
  QuantGemmParams p = ValidParams(storage);
  p.act_dtype = DataType::kF32;
  expect_invalid(p, "act_dtype F32");
  p = ValidParams(storage);
  p.m = 257;
  expect_invalid(p, "m 257");
  p.m = -1;
  expect_invalid(p, "m -1");
  p = ValidParams(storage);
  p.n = 100;
  expect_invalid(p, "n 100");
  p = ValidParams(storage);
  p.k = 4000;
  expect_invalid(p, "k 4000");
  p = ValidParams(storage);
  p.group_size = 256;
  expect_invalid(p, "group_size 256");
  p = ValidParams(storage);
  p.k = 192;  // a multiple of 64, not of 128
  expect_invalid(p, "k 192 is not a multiple of group_size 128");
  p = ValidParams(storage);
  p.format = QuantWeightFormat::kInt8;
  p.group_size = 16;  // INT8: per output channel (0 or k) or groups of 32, 64, 128
  expect_invalid(p, "INT8 group_size 16");
  p.group_size = 32;
  EXPECT_TRUE(CheckQuantGemmParams(p).ok()) << CheckQuantGemmParams(p);
  EXPECT_TRUE(QuantGemmGrouped(p));
  p.group_size = p.k;  // one group per row is the per-channel form
  EXPECT_FALSE(QuantGemmGrouped(p));
  // F32 group scales (K-quants): INT8 in groups of 16 or 32, always group-wise.
  for (const QuantScaleType type : {QuantScaleType::kF32, QuantScaleType::kF32WithMin}) {
    p = ValidParams(storage);
    p.format = QuantWeightFormat::kInt8;
    p.scale_type = type;
    p.group_size = 16;
    EXPECT_TRUE(CheckQuantGemmParams(p).ok()) << CheckQuantGemmParams(p);
    EXPECT_TRUE(QuantGemmGrouped(p));
    p.group_size = 64;
    expect_invalid(p, "INT8 group_size 64 unsupported with F32 scales");
    p.group_size = 0;
    expect_invalid(p, "INT8 group_size 0 unsupported with F32 scales");
    p = ValidParams(storage);  // INT4
    p.scale_type = type;
    expect_invalid(p, "INT4 takes F16 scales");
  }
  p = ValidParams(storage);
  p.scale_type = static_cast<QuantScaleType>(7);
  expect_invalid(p, "scale_type 7");
  p = ValidParams(storage);
  p.group_size = 16;  // INT4 groups of 16 (Q3_K, Q2_K)
  EXPECT_TRUE(CheckQuantGemmParams(p).ok()) << CheckQuantGemmParams(p);
  p = ValidParams(storage);
  p.num_splits = kQuantGemmMaxSplits + 1;
  expect_invalid(p, "num_splits 17");
  p = ValidParams(storage);
  p.weight = nullptr;
  expect_invalid(p, "null");
  p = ValidParams(storage);
  p.x = storage + 8;
  expect_invalid(p, "16-byte aligned");
  p = ValidParams(storage);
  p.scales = storage + 8;  // INT4 scale/min are read with 16-byte copies
  expect_invalid(p, "16-byte aligned");
  p = ValidParams(storage);
  p.y = storage + 1;
  expect_invalid(p, "2-byte aligned");
  // Small m splits K: the workspace becomes mandatory.
  p = ValidParams(storage);
  p.m = 1;
  ASSERT_GT(QuantGemmWorkspaceBytes(p), 0u);
  expect_invalid(p, "workspace of 0 bytes");
  p.workspace = storage;
  p.workspace_bytes = QuantGemmWorkspaceBytes(p);
  EXPECT_TRUE(CheckQuantGemmParams(p).ok());
  // Tile counters, when given, must cover every output tile.
  p.counters = reinterpret_cast<uint32_t*>(storage);
  p.counter_words = QuantGemmCounterCount(p) - 1;
  expect_invalid(p, "counter words");
  p.counter_words = QuantGemmCounterCount(p);
  EXPECT_TRUE(CheckQuantGemmParams(p).ok()) << CheckQuantGemmParams(p);
  p.counters = nullptr;
  // Forced splits are provisioned as asked.
  p.num_splits = 3;
  EXPECT_EQ(QuantGemmWorkspaceBytes(p), 3u * 1 * 14336 * sizeof(float));
  p.num_splits = 1;
  EXPECT_EQ(QuantGemmWorkspaceBytes(p), 0u);
  // m = 0 is a no-op that needs no pointers.
  QuantGemmParams empty = ValidParams(nullptr);
  empty.m = 0;
  EXPECT_TRUE(CheckQuantGemmParams(empty).ok());
}

TEST(CudaQuantGemmTest, DispatchTableAndSplitHeuristic) {
  constexpr QuantWeightFormat kI8 = QuantWeightFormat::kInt8, kI4 = QuantWeightFormat::kInt4;
  EXPECT_EQ(QuantGemmTileFor(1, kI8).name, "gemv_m8");
  EXPECT_EQ(QuantGemmTileFor(8, kI8).name, "gemv_m8");
  EXPECT_EQ(QuantGemmTileFor(9, kI8).name, "gemv_m16");
  EXPECT_EQ(QuantGemmTileFor(16, kI8).name, "gemv_m16");
  EXPECT_EQ(QuantGemmTileFor(17, kI8).name, "tile_m32");
  EXPECT_EQ(QuantGemmTileFor(32, kI8).name, "tile_m32");
  EXPECT_EQ(QuantGemmTileFor(33, kI8).name, "tile_m64");
  EXPECT_EQ(QuantGemmTileFor(64, kI8).name, "tile_m64");
  EXPECT_EQ(QuantGemmTileFor(65, kI8).name, "tile_m64_n128");
  EXPECT_EQ(QuantGemmTileFor(128, kI8).name, "tile_m64_n128");
  EXPECT_EQ(QuantGemmTileFor(128, kI8).block_n, 128);
  EXPECT_EQ(QuantGemmTileFor(129, kI8).name, "tile_m64");
  EXPECT_EQ(QuantGemmTileFor(256, kI8).name, "tile_m64");
  EXPECT_EQ(QuantGemmTileFor(256, kI8).block_m, 64);
  // INT4 takes the 256-wide gemv at 9-16 tokens (its INT8 stages would not fit 99 KiB).
  EXPECT_EQ(QuantGemmTileFor(8, kI4).name, "gemv_m8");
  EXPECT_EQ(QuantGemmTileFor(9, kI4).name, "gemv_m16_n256");
  EXPECT_EQ(QuantGemmTileFor(16, kI4).name, "gemv_m16_n256");
  EXPECT_EQ(QuantGemmTileFor(16, kI4).block_n, 256);
  EXPECT_EQ(QuantGemmTileFor(17, kI4).name, "tile_m32");
  // K = 14336 in 128-wide steps allows up to 16 splits (4 steps each): INT4's 16 blocks of 256
  // features split 16 ways, INT8's 32 of 128 features 9 ways, both toward 2 blocks per SM.
  EXPECT_EQ(ChooseQuantGemmSplits(12, 4096, 14336, 132, kI4), 16);
  EXPECT_EQ(ChooseQuantGemmSplits(12, 4096, 14336, 132, kI8), 9);
  // Decode on 132 SMs: 32 blocks of 128 features; K = 4096 in 128-wide steps -> 8 splits (the
  // 4-steps-per-split floor), enough for ~2 blocks per SM.
  EXPECT_EQ(ChooseQuantGemmSplits(1, 4096, 4096, 132, kI8), 8);
  EXPECT_EQ(ChooseQuantGemmSplits(1, 14336, 4096, 132, kI8), 3);
  EXPECT_EQ(ChooseQuantGemmSplits(1, 4096, 14336, 132, kI8), 9);
  // Large m fills the GPU with output tiles: no split.
  EXPECT_EQ(ChooseQuantGemmSplits(256, 4096, 4096, 132, kI8), 1);
  // Short K cannot be split below 4 steps.
  EXPECT_EQ(ChooseQuantGemmSplits(1, 4096, 256, 132, kI8), 1);
  // Never more than the cap.
  EXPECT_LE(ChooseQuantGemmSplits(1, 16, 1 << 20, 256, kI8), kQuantGemmMaxSplits);
  // Split-K tile counters: one per output tile of the dispatched config, none without splits.
  QuantGemmParams p;
  p.m = 1;
  p.n = 4096;
  p.k = 14336;
  p.group_size = 128;
  EXPECT_EQ(QuantGemmCounterCount(p), 32u);  // 4096 / 128 features per gemv block
  p.m = 200;                                 // tile_m64: 4 m blocks x 4096 / 64 features
  p.num_splits = 2;
  EXPECT_EQ(QuantGemmCounterCount(p), 256u);
  p.m = 100;  // tile_m64_n128: 2 m blocks x 4096 / 128 features
  EXPECT_EQ(QuantGemmCounterCount(p), 64u);
  p.m = 12;  // INT4 (the params' default format): gemv_m16_n256, 4096 / 256 features
  EXPECT_EQ(QuantGemmCounterCount(p), 16u);
  p.format = kI8;  // gemv_m16: 4096 / 128 features
  EXPECT_EQ(QuantGemmCounterCount(p), 32u);
  p.num_splits = 1;
  EXPECT_EQ(QuantGemmCounterCount(p), 0u);
}

TEST(CudaQuantGemmTest, Fp8RejectsUnsupportedShapesBeforeLaunch) {
  alignas(256) static uint8_t storage[256] = {};
  Fp8GemmParams p;
  p.x = p.weight = p.y = storage;
  p.x_scale = p.w_scale = reinterpret_cast<const float*>(storage);
  p.m = 4;
  p.n = 64;
  p.k = 64;
  p.workspace = storage;
  p.workspace_bytes = Fp8GemmWorkspaceBytes(p);
  EXPECT_TRUE(CheckFp8GemmParams(p).ok()) << CheckFp8GemmParams(p);
  auto expect_invalid = [&](const Fp8GemmParams& bad, const std::string& fragment) {
    const absl::Status status = CheckFp8GemmParams(bad);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << fragment;
    EXPECT_NE(status.message().find(fragment), std::string::npos) << status;
    EXPECT_EQ(LaunchFp8Gemm(bad, nullptr).code(), absl::StatusCode::kInvalidArgument);
  };
  Fp8GemmParams bad = p;
  bad.k = 40;
  expect_invalid(bad, "k 40");
  bad = p;
  bad.n = 24;
  expect_invalid(bad, "n 24");
  bad = p;
  bad.out_dtype = DataType::kF32;  // accepted (the sums in place), with a 16-byte aligned y
  bad.y = storage + 2;
  expect_invalid(bad, "16- and 4-byte aligned");
  bad = p;
  bad.workspace_bytes = 16;
  expect_invalid(bad, "workspace of 16 bytes");
  bad = p;
  bad.x = storage + 4;
  expect_invalid(bad, "16-byte aligned");
  QuantizeFp8Params q;
  q.x = q.out = storage;
  q.scale = reinterpret_cast<float*>(storage);
  q.count = 10;
  q.in_dtype = DataType::kF32;
  EXPECT_NE(CheckQuantizeFp8Params(q).message().find("in_dtype F32"), std::string::npos);
  EXPECT_EQ(LaunchQuantizeFp8(q, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------- GPU: W4A16 / W8A16

struct GemmCase {
  QuantWeightFormat format;
  DataType dtype;
  int64_t m, n, k, group;
  bool bias;
  int num_splits = 0;  // 0: heuristic
  // Also launch with QuantGemmParams::counters (the splits summed inside the kernel), twice:
  // both y bit-identical to the reduce kernel's, and every counter back at zero.
  bool in_kernel_reduction = false;
  // Also launch with f32_out: the F32 y rounds to the act_dtype y bit for bit.
  bool f32_out_too = false;
  // Group-wise INT8: F16 scales (Q8_0's form) or F32 scales, with or without mins (K-quants).
  QuantScaleType scales = QuantScaleType::kF16;
  // >= 0: LaunchQuantGemmCandidate with this member of the tuning space instead.
  int candidate = -1;
};

std::string Describe(const GemmCase& c) {
  return absl::StrFormat("%s %s m=%d n=%d k=%d group=%d bias=%d splits=%d scales=%d",
                         QuantWeightFormatName(c.format), DataTypeName(c.dtype), c.m, c.n, c.k,
                         c.group, c.bias, c.num_splits, static_cast<int>(c.scales));
}

// One launch against the float64 reference over the same quantized values; the output is
// NaN-poisoned first and so is the split-K workspace (stale partials must not leak).
void RunGemmCase(const GemmCase& c, uint32_t seed) {
  SCOPED_TRACE(Describe(c));
  const std::vector<float> x =
      testing_util::RoundTo(c.dtype, testing_util::RandomFloats(c.m * c.k, seed, -1.0f, 1.0f));
  std::vector<float> bias;
  if (c.bias) {
    bias = testing_util::RoundTo(c.dtype, testing_util::RandomFloats(c.n, seed + 1, -0.5f, 0.5f));
  }
  std::vector<double> w, row_scale;
  DeviceBuffer d_weight, d_scales;
  if (c.format == QuantWeightFormat::kInt4) {
    const HostInt4 host = RandomInt4(c.n, c.k, c.group, seed + 2);
    w = DequantizedInt4(host, c.n, c.k, c.group, c.dtype);
    absl::StatusOr<Int4GpuWeight> packed =
        PackInt4ForGpu(host.q.data(), host.scales.data(), host.mins.data(), c.n, c.k, c.group);
    ASSERT_TRUE(packed.ok()) << packed.status();
    LOOM_ASSERT_OK_AND_ASSIGN(d_weight, testing_util::UploadRaw(packed->q));
    LOOM_ASSERT_OK_AND_ASSIGN(d_scales, testing_util::UploadRaw(packed->scale_min));
  } else if (c.group == 0) {
    std::mt19937 rng(seed + 2);
    std::uniform_int_distribution<int> value(-128, 127);
    std::uniform_real_distribution<float> scale(0.001f, 0.004f);
    std::vector<int8_t> q(c.n * c.k);
    for (int8_t& v : q) v = static_cast<int8_t>(value(rng));
    std::vector<uint16_t> scales(c.n);
    row_scale.resize(c.n);
    for (int64_t r = 0; r < c.n; ++r) {
      scales[r] = ToF16Bits(scale(rng));
      row_scale[r] = F16BitsToFloat(scales[r]);
    }
    w.assign(q.begin(), q.end());
    absl::StatusOr<std::vector<uint8_t>> packed = PackInt8ForGpu(q.data(), c.n, c.k);
    ASSERT_TRUE(packed.ok()) << packed.status();
    LOOM_ASSERT_OK_AND_ASSIGN(d_weight, testing_util::UploadRaw(*packed));
    LOOM_ASSERT_OK_AND_ASSIGN(d_scales, testing_util::UploadRaw(scales));
  } else if (c.scales != QuantScaleType::kF16) {
    // K-quants as Loom holds them: value = q * scale + min with F32 scales (and mins) of
    // its (row, group), over a wide range so that a scale applied to the wrong group, row or
    // lane shows; the kernel's value is the F32 fma rounded once to T.
    std::mt19937 rng(seed + 2);
    std::uniform_int_distribution<int> value(-128, 127);
    std::uniform_real_distribution<float> exponent(-12.0f, -4.0f), min(-0.3f, 0.3f);
    std::vector<int8_t> q(c.n * c.k);
    for (int8_t& v : q) v = static_cast<int8_t>(value(rng));
    const int64_t groups = c.k / c.group;
    const bool with_mins = c.scales == QuantScaleType::kF32WithMin;
    std::vector<float> scales(c.n * groups), mins(with_mins ? c.n * groups : 0);
    for (float& s : scales) s = std::exp2(exponent(rng)) * (1.0f + 0x1p-20f);  // not F16
    for (float& m : mins) m = min(rng);
    w.resize(c.n * c.k);
    for (int64_t r = 0; r < c.n; ++r) {
      for (int64_t col = 0; col < c.k; ++col) {
        const int64_t g = r * groups + col / c.group;
        const float exact =
            std::fma(static_cast<float>(q[r * c.k + col]), scales[g], with_mins ? mins[g] : -0.0f);
        w[r * c.k + col] = RoundToType(exact, c.dtype);
      }
    }
    absl::StatusOr<std::vector<uint8_t>> packed = PackInt8ForGpu(q.data(), c.n, c.k);
    ASSERT_TRUE(packed.ok()) << packed.status();
    absl::StatusOr<std::vector<float>> packed_scales = PackInt8GroupScalesF32ForGpu(
        scales.data(), with_mins ? mins.data() : nullptr, c.n, c.k, c.group);
    ASSERT_TRUE(packed_scales.ok()) << packed_scales.status();
    LOOM_ASSERT_OK_AND_ASSIGN(d_weight, testing_util::UploadRaw(*packed));
    LOOM_ASSERT_OK_AND_ASSIGN(d_scales, testing_util::UploadRaw(*packed_scales));
  } else {
    // Group-wise INT8 (GGUF Q8_0's form): value = q * scale of its (row, group), scales over
    // a wide range so that a scale applied to the wrong group or row shows.
    std::mt19937 rng(seed + 2);
    std::uniform_int_distribution<int> value(-128, 127);
    std::uniform_real_distribution<float> exponent(-12.0f, -4.0f);
    std::vector<int8_t> q(c.n * c.k);
    for (int8_t& v : q) v = static_cast<int8_t>(value(rng));
    const int64_t groups = c.k / c.group;
    std::vector<uint16_t> scales(c.n * groups);
    for (uint16_t& s : scales) s = ToF16Bits(std::exp2(exponent(rng)));
    w.resize(c.n * c.k);
    for (int64_t r = 0; r < c.n; ++r) {
      for (int64_t col = 0; col < c.k; ++col) {
        // One rounding of q times the scale as T holds it (BF16 rounds the scale first).
        const double scale =
            RoundToType(F16BitsToFloat(scales[r * groups + col / c.group]), c.dtype);
        w[r * c.k + col] = RoundToType(q[r * c.k + col] * scale, c.dtype);
      }
    }
    absl::StatusOr<std::vector<uint8_t>> packed = PackInt8ForGpu(q.data(), c.n, c.k);
    ASSERT_TRUE(packed.ok()) << packed.status();
    absl::StatusOr<std::vector<uint16_t>> packed_scales =
        PackInt8GroupScalesForGpu(scales.data(), c.n, c.k, c.group);
    ASSERT_TRUE(packed_scales.ok()) << packed_scales.status();
    LOOM_ASSERT_OK_AND_ASSIGN(d_weight, testing_util::UploadRaw(*packed));
    LOOM_ASSERT_OK_AND_ASSIGN(d_scales, testing_util::UploadRaw(*packed_scales));
  }
  const Reference ref = ReferenceGemm(x, w, row_scale, bias, c.m, c.n, c.k, c.dtype);

  LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_x, testing_util::Upload(c.dtype, x));
  LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_y, testing_util::Poisoned(c.dtype, c.m * c.n));
  DeviceBuffer d_bias;
  if (c.bias) {
    LOOM_ASSERT_OK_AND_ASSIGN(d_bias, testing_util::Upload(c.dtype, bias));
  }
  QuantGemmParams p;
  p.x = d_x.data();
  p.y = d_y.data();
  p.bias = c.bias ? d_bias.data() : nullptr;
  p.act_dtype = c.dtype;
  p.format = c.format;
  p.weight = d_weight.data();
  p.scales = d_scales.data();
  p.scale_type = c.scales;
  p.m = c.m;
  p.n = c.n;
  p.k = c.k;
  p.group_size = c.group;  // INT8: 0 per output channel, else groups
  p.num_splits = c.num_splits;
  DeviceBuffer workspace;
  if (c.candidate >= 0) {  // room for the most splits any member takes
    const size_t bytes = size_t{kQuantGemmMaxSplits} * c.m * c.n * sizeof(float);
    LOOM_ASSERT_OK_AND_ASSIGN(workspace, DeviceBuffer::Allocate(bytes));
    ASSERT_TRUE(workspace.Fill(0xff).ok());
    p.workspace = workspace.data();
    p.workspace_bytes = bytes;
  } else if (const size_t bytes = QuantGemmWorkspaceBytes(p); bytes > 0) {
    LOOM_ASSERT_OK_AND_ASSIGN(workspace, DeviceBuffer::Allocate(bytes));
    ASSERT_TRUE(workspace.Fill(0xff).ok());
    p.workspace = workspace.data();
    p.workspace_bytes = bytes;
  }
  const absl::Status launched = c.candidate >= 0 ? LaunchQuantGemmCandidate(p, c.candidate, nullptr)
                                                 : LaunchQuantGemm(p, nullptr);
  ASSERT_TRUE(launched.ok()) << launched;
  const absl::Status synced = SynchronizeStream(nullptr);
  ASSERT_TRUE(synced.ok()) << synced;
  LOOM_ASSERT_OK_AND_ASSIGN(std::vector<float> y, testing_util::Download(d_y, c.dtype, c.m * c.n));
  EXPECT_TRUE(WithinTolerance(y, ref.y, ref.tolerance));
  if (c.f32_out_too) {
    LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_y32,
                              testing_util::Poisoned(DataType::kF32, c.m * c.n));
    QuantGemmParams wide = p;
    wide.y = d_y32.data();
    wide.f32_out = true;
    if (workspace.bytes() > 0) {
      ASSERT_TRUE(workspace.Fill(0xff).ok());
    }
    const absl::Status wide_launched = LaunchQuantGemm(wide, nullptr);
    ASSERT_TRUE(wide_launched.ok()) << wide_launched;
    ASSERT_TRUE(SynchronizeStream(nullptr).ok());
    LOOM_ASSERT_OK_AND_ASSIGN(std::vector<float> y32,
                              testing_util::Download(d_y32, DataType::kF32, c.m * c.n));
    const std::vector<float> rounded = testing_util::RoundTo(c.dtype, y32);
    for (size_t i = 0; i < y.size(); ++i) {
      ASSERT_EQ(std::memcmp(&rounded[i], &y[i], sizeof(float)), 0)
          << "f32_out element " << i << ": " << y32[i] << " rounds to " << rounded[i]
          << ", the act_dtype output is " << y[i];
    }
    if (c.bias) {
      // The same bias as F32 (bias_f32, what CudaDevice uploads): its values are the
      // act_dtype's, so the F32 output is the same bit for bit.
      LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_bias32, testing_util::Upload(DataType::kF32, bias));
      wide.bias = d_bias32.data();
      wide.bias_f32 = true;
      if (workspace.bytes() > 0) {
        ASSERT_TRUE(workspace.Fill(0xff).ok());
      }
      ASSERT_TRUE(d_y32.Fill(0xff).ok());
      const absl::Status f32_bias_launched = LaunchQuantGemm(wide, nullptr);
      ASSERT_TRUE(f32_bias_launched.ok()) << f32_bias_launched;
      ASSERT_TRUE(SynchronizeStream(nullptr).ok());
      LOOM_ASSERT_OK_AND_ASSIGN(std::vector<float> with_f32_bias,
                                testing_util::Download(d_y32, DataType::kF32, c.m * c.n));
      for (size_t i = 0; i < y32.size(); ++i) {
        ASSERT_EQ(std::memcmp(&with_f32_bias[i], &y32[i], sizeof(float)), 0)
            << "F32 bias, element " << i << ": " << with_f32_bias[i] << " against " << y32[i];
      }
    }
  }
  if (!c.in_kernel_reduction) return;
  const size_t words = QuantGemmCounterCount(p);
  ASSERT_GT(words, 0u) << "no split: nothing to reduce in the kernel";
  LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer counters,
                            testing_util::UploadRaw(std::vector<uint32_t>(words, 0)));
  p.counters = static_cast<uint32_t*>(counters.data());
  p.counter_words = words - 1;  // one short: refused before launch
  EXPECT_EQ(LaunchQuantGemm(p, nullptr).code(), absl::StatusCode::kInvalidArgument);
  p.counter_words = words;
  // Launch 0 directly; then captured into a graph, which must hold the GEMM alone (no reduce
  // kernel: the in-kernel path ran), replayed twice on the same counters.
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const absl::Status captured = LaunchQuantGemm(p, stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_TRUE(captured.ok()) << captured;
  size_t nodes = 0;
  ASSERT_EQ(cudaGraphGetNodes(graph, nullptr, &nodes), cudaSuccess);
  EXPECT_EQ(nodes, 1u) << "the splits were not summed inside the GEMM's kernel";
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int launch = 0; launch < 3; ++launch) {
    SCOPED_TRACE(absl::StrFormat("in-kernel reduction, launch %d", launch));
    ASSERT_TRUE(d_y.Fill(0xff).ok());
    ASSERT_TRUE(workspace.Fill(0xff).ok());
    if (launch == 0) {
      const absl::Status again = LaunchQuantGemm(p, stream);
      ASSERT_TRUE(again.ok()) << again;
    } else {
      ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    }
    ASSERT_TRUE(SynchronizeStream(stream).ok());
    LOOM_ASSERT_OK_AND_ASSIGN(std::vector<float> y_in_kernel,
                              testing_util::Download(d_y, c.dtype, c.m * c.n));
    ASSERT_EQ(y_in_kernel.size(), y.size());
    for (size_t i = 0; i < y.size(); ++i) {
      ASSERT_EQ(std::memcmp(&y_in_kernel[i], &y[i], sizeof(float)), 0)
          << "element " << i << ": " << y_in_kernel[i] << " vs the reduce kernel's " << y[i];
    }
    std::vector<uint32_t> left(words, 1);
    ASSERT_EQ(
        cudaMemcpy(left.data(), counters.data(), words * sizeof(uint32_t), cudaMemcpyDeviceToHost),
        cudaSuccess);
    EXPECT_EQ(left, std::vector<uint32_t>(words, 0)) << "a counter was not set back to zero";
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST(CudaQuantGemmTest, Int4MatchesReferenceOverShapeSweep) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  uint32_t seed = 100;
  for (DataType dtype : {DataType::kF16, DataType::kBF16}) {
    for (int64_t group : {16, 32, 64, 128}) {  // 16: GGUF Q3_K, Q2_K
      for (int64_t m : {1, 3, 16, 23, 64, 100, 256}) {  // 23, 100: the tile_m32/m64 configs
        // n = 96: partial row tiles in every config; k = 256: fewer steps than stages.
        for (const auto& [n, k] :
             std::vector<std::pair<int64_t, int64_t>>{{96, 256}, {256, 1024}}) {
          RunGemmCase({QuantWeightFormat::kInt4, dtype, m, n, k, group, (seed % 2) == 0}, seed);
          ++seed;
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

TEST(CudaQuantGemmTest, Int8MatchesReferenceOverShapeSweep) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  uint32_t seed = 300;
  for (DataType dtype : {DataType::kF16, DataType::kBF16}) {
    for (bool bias : {false, true}) {
      for (int64_t m : {1, 3, 16, 37, 64, 130, 256}) {
        for (const auto& [n, k] :
             std::vector<std::pair<int64_t, int64_t>>{{96, 256}, {256, 1024}}) {
          RunGemmCase({QuantWeightFormat::kInt8, dtype, m, n, k, 0, bias}, seed++);
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

// GGUF Q8_0 on the W8A16 path: group-wise INT8 scales applied before the MMA, in every config
// (m 1 .. 256), every group size, with forced splits and the in-kernel reduction.
TEST(CudaQuantGemmTest, GroupWiseInt8MatchesReferenceInEveryConfig) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  uint32_t seed = 1300;
  for (DataType dtype : {DataType::kF16, DataType::kBF16}) {
    for (int64_t group : {32, 64, 128}) {
      for (int64_t m : {1, 13, 23, 37, 100, 130}) {
        RunGemmCase({QuantWeightFormat::kInt8, dtype, m, 160, 512, group, m % 2 == 1}, seed++);
        if (HasFatalFailure()) return;
      }
      if (group < 128) {  // k = 192: the last 128-column step of the gemv configs half empty
        for (int64_t m : {1, 13}) {
          RunGemmCase({QuantWeightFormat::kInt8, dtype, m, 96, 192, group, true}, seed++);
        }
      }
    }
  }
  for (DataType dtype : {DataType::kF16, DataType::kBF16}) {
    for (int64_t group : {32, 128}) {
      GemmCase split{QuantWeightFormat::kInt8, dtype, 1, 4096, 4096, group, true, 4};
      split.in_kernel_reduction = true;
      split.f32_out_too = true;
      RunGemmCase(split, seed++);
    }
  }
}

// Every member of the tuning space that fits (quantized_gemm_candidates.h) in both of its
// formats: m across one and several of its tiles (odd, so that rows past m are zero-filled and
// dropped), its own split-K heuristic on a wide shape and forced splits, against the reference.
TEST(CudaQuantGemmTest, EveryCandidateMatchesReference) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  uint32_t seed = 2300;
  int launched = 0;
  for (int index = 0; index < QuantGemmCandidateCount(); ++index) {
    SCOPED_TRACE(QuantGemmCandidateTile(index).name);
    for (QuantWeightFormat format : {QuantWeightFormat::kInt4, QuantWeightFormat::kInt8}) {
      const int64_t group = format == QuantWeightFormat::kInt4 ? 128 : 0;
      QuantGemmParams probe;  // m = 0: the format and the fit checked, nothing launched
      probe.format = format;
      probe.group_size = group;
      probe.n = 16;
      probe.k = 128;
      const absl::Status fits = LaunchQuantGemmCandidate(probe, index, nullptr);
      if (absl::IsUnimplemented(fits)) continue;
      ASSERT_TRUE(fits.ok()) << fits;
      const int64_t block_m = QuantGemmCandidateTile(index).block_m;
      for (int64_t m :
           {int64_t{1}, block_m - 1, std::min<int64_t>(2 * block_m + 3, kQuantGemmMaxM)}) {
        GemmCase c{format, DataType::kF16, std::max<int64_t>(m, 1), 288, 512, group, m % 2 == 1};
        c.candidate = index;
        RunGemmCase(c, seed++);
        if (HasFatalFailure()) return;
      }
      GemmCase split{format, DataType::kF16, block_m, 1024, 2048, group, true, 3};
      split.candidate = index;
      RunGemmCase(split, seed++);
      if (HasFatalFailure()) return;
      // The deep-ring (_sN) and direct (d_) members at k = 4224 (33 groups of 128): a split's
      // steps outnumber the deepest ring (8) and the direct members' rounds, so rings wrap and
      // sources advance a round; the last step is part empty (66 chunks of 64 against steps
      // of 4 or 8 chunks); n = 272 (17 row tiles) leaves a fragment pair half empty.
      const std::string_view name = QuantGemmCandidateTile(index).name;
      const bool rounds = name.find("_s") != std::string_view::npos || name.substr(0, 2) == "d_";
      for (const auto& [m, splits] : {std::pair<int64_t, int>{1, 1}, {block_m - 1, 2}}) {
        if (!rounds) break;
        GemmCase deep{format, DataType::kF16, std::max<int64_t>(m, 1), 272, 4224, group,
                      true,   splits};
        deep.candidate = index;
        RunGemmCase(deep, seed++);
        if (HasFatalFailure()) return;
      }
      ++launched;
    }
  }
  EXPECT_GE(launched, QuantGemmCandidateCount());  // INT4 fits every member
}

// GGUF K-quants on the W8A16 path (Q6_K: INT8 g16 F32 scales; Q5_K and Q4_K_M's fused
// projections: with F32 mins; groups of 32 too): in every config, a half-empty last step,
// forced splits with the in-kernel reduction, and the F32 output.
TEST(CudaQuantGemmTest, F32ScaledInt8MatchesReferenceInEveryConfig) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  uint32_t seed = 1700;
  for (DataType dtype : {DataType::kF16, DataType::kBF16}) {
    for (QuantScaleType scales : {QuantScaleType::kF32, QuantScaleType::kF32WithMin}) {
      for (int64_t group : {16, 32}) {
        for (int64_t m : {1, 13, 23, 37, 100, 130}) {
          GemmCase c{QuantWeightFormat::kInt8, dtype, m, 160, 512, group, m % 2 == 1};
          c.scales = scales;
          RunGemmCase(c, seed++);
          if (HasFatalFailure()) return;
        }
        for (int64_t m : {1, 13}) {  // k = 192: the gemv configs' last 128-column step half empty
          GemmCase c{QuantWeightFormat::kInt8, dtype, m, 96, 192, group, true};
          c.scales = scales;
          RunGemmCase(c, seed++);
          if (HasFatalFailure()) return;
        }
        GemmCase split{QuantWeightFormat::kInt8, dtype, 1, 1024, 4096, group, true, 4};
        split.scales = scales;
        split.in_kernel_reduction = true;
        split.f32_out_too = true;
        RunGemmCase(split, seed++);
        if (HasFatalFailure()) return;
      }
    }
  }
}

// The F32-scaled weights bit for bit: token i's input is one-hot at column c_i, so its F32
// output row is exactly the weights of column c_i as the kernel dequantized them, which must
// be fma(q, scale, min) in F32 rounded once to T (an F16-rounded scale would differ). m = 8
// (a gemv config, four 128-column steps: more than the three stages of the members with
// mins in groups of 16) and m = 128 (tile_m128). Also compute-sanitizer's case for them.
TEST(CudaQuantGemmTest, F32ScaledInt8WeightsReadBackBitForBit) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  constexpr int64_t n = 32, k = 512;
  uint32_t seed = 1900;
  for (DataType dtype : {DataType::kF16, DataType::kBF16}) {
    for (QuantScaleType type : {QuantScaleType::kF32, QuantScaleType::kF32WithMin}) {
      for (int64_t group : {16, 32}) {
        for (int64_t m : {8, 128}) {
          SCOPED_TRACE(absl::StrFormat("%s scales=%d group=%d m=%d", DataTypeName(dtype),
                                       static_cast<int>(type), group, m));
          std::mt19937 rng(seed++);
          std::uniform_int_distribution<int> value(-128, 127);
          std::uniform_real_distribution<float> exponent(-12.0f, 2.0f), min(-4.0f, 4.0f);
          const bool with_mins = type == QuantScaleType::kF32WithMin;
          const int64_t groups = k / group;
          std::vector<int8_t> q(n * k);
          for (int8_t& v : q) v = static_cast<int8_t>(value(rng));
          std::vector<float> scales(n * groups), mins(with_mins ? n * groups : 0);
          for (float& s : scales) s = std::exp2(exponent(rng)) * (1.0f + 0x1p-20f);
          for (float& v : mins) v = min(rng);
          std::vector<float> x(m * k, 0.0f);
          std::vector<int64_t> column(m);
          for (int64_t i = 0; i < m; ++i) {
            column[i] = (i * 7) % k;  // distinct columns, across every group
            x[i * k + column[i]] = 1.0f;
          }
          absl::StatusOr<std::vector<uint8_t>> packed = PackInt8ForGpu(q.data(), n, k);
          absl::StatusOr<std::vector<float>> packed_scales = PackInt8GroupScalesF32ForGpu(
              scales.data(), with_mins ? mins.data() : nullptr, n, k, group);
          ASSERT_TRUE(packed.ok() && packed_scales.ok());
          LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_weight, testing_util::UploadRaw(*packed));
          LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_scales, testing_util::UploadRaw(*packed_scales));
          LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_x, testing_util::Upload(dtype, x));
          LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_y,
                                    testing_util::Poisoned(DataType::kF32, m * n));
          QuantGemmParams p;
          p.x = d_x.data();
          p.y = d_y.data();
          p.f32_out = true;
          p.act_dtype = dtype;
          p.format = QuantWeightFormat::kInt8;
          p.weight = d_weight.data();
          p.scales = d_scales.data();
          p.scale_type = type;
          p.m = m;
          p.n = n;
          p.k = k;
          p.group_size = group;
          p.num_splits = 1;  // one product per output: no split partials to add
          const absl::Status launched = LaunchQuantGemm(p, nullptr);
          ASSERT_TRUE(launched.ok()) << launched;
          ASSERT_TRUE(SynchronizeStream(nullptr).ok());
          LOOM_ASSERT_OK_AND_ASSIGN(std::vector<float> y,
                                    testing_util::Download(d_y, DataType::kF32, m * n));
          for (int64_t i = 0; i < m; ++i) {
            for (int64_t r = 0; r < n; ++r) {
              const int64_t c = column[i], g = r * groups + c / group;
              const float exact = std::fma(static_cast<float>(q[r * k + c]), scales[g],
                                           with_mins ? mins[g] : -0.0f);
              const float want = static_cast<float>(RoundToType(exact, dtype));
              ASSERT_EQ(y[i * n + r], want) << "token " << i << " row " << r << " column " << c
                                            << ": q " << int{q[r * k + c]};
            }
          }
        }
      }
    }
  }
}

TEST(CudaQuantGemmTest, BiasAndOddTokenCountsInEveryConfig) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  uint32_t seed = 500;
  for (DataType dtype : {DataType::kF16, DataType::kBF16}) {
    // Partial token tiles of gemv_m16, tile_m32, tile_m64 and tile_m64_n128 (four, since the
    // sanitizers run this test; gemv_m8 is F32ScaledInt8WeightsReadBackBitForBit's there).
    for (int64_t m : {13, 23, 37, 100}) {
      RunGemmCase({QuantWeightFormat::kInt4, dtype, m, 160, 384, 128, true}, seed++);
      RunGemmCase({QuantWeightFormat::kInt4, dtype, m, 160, 384, 64, false}, seed++);
      if (HasFatalFailure()) return;
    }
  }
}

TEST(CudaQuantGemmTest, ForcedSplitsIncludingEmptyOnesMatchReference) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  uint32_t seed = 700;
  for (int splits : {1, 2, 3, 7, 16}) {
    // k = 256 is 2 steps of gemv (128 wide): 3+ splits leave some with no steps at all.
    RunGemmCase({QuantWeightFormat::kInt4, DataType::kF16, 1, 96, 256, 32, true, splits}, seed++);
    RunGemmCase({QuantWeightFormat::kInt8, DataType::kBF16, 16, 128, 1024, 0, true, splits},
                seed++);
    RunGemmCase({QuantWeightFormat::kInt4, DataType::kBF16, 100, 64, 640, 64, true, splits},
                seed++);
    if (HasFatalFailure()) return;
  }
}

// The splits summed inside the kernel by the last split of each tile: the reduce kernel's
// bits, over every config (gemv with warps_k 2, the tile configs with several m blocks),
// forced splits including empty ones and the heuristic's; launched twice on the same
// counters (they are zero again after each launch).
TEST(CudaQuantGemmTest, InKernelSplitReductionEqualsTheReduceKernelBitForBit) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  uint32_t seed = 800;
  for (int splits : {2, 3, 16}) {
    GemmCase c{QuantWeightFormat::kInt4, DataType::kF16, 1, 96, 256, 32, true, splits};
    c.in_kernel_reduction = true;
    RunGemmCase(c, seed++);
    c = {QuantWeightFormat::kInt8, DataType::kBF16, 13, 160, 1024, 0, true, splits};
    c.in_kernel_reduction = true;
    RunGemmCase(c, seed++);
    c = {QuantWeightFormat::kInt4, DataType::kBF16, 200, 64, 640, 64, false, splits};
    c.in_kernel_reduction = true;
    RunGemmCase(c, seed++);
    // Tiles along both n and m.
    c = {QuantWeightFormat::kInt4, DataType::kBF16, 200, 320, 640, 64, true, splits};
    c.in_kernel_reduction = true;
    RunGemmCase(c, seed++);
    // gemv_m16_n256 (INT4 only), tile_m32 (two K warps) and tile_m64_n128.
    c = {QuantWeightFormat::kInt4, DataType::kBF16, 11, 512, 1024, 32, true, splits};
    c.in_kernel_reduction = true;
    RunGemmCase(c, seed++);
    c = {QuantWeightFormat::kInt8, DataType::kF16, 29, 256, 1024, 0, true, splits};
    c.in_kernel_reduction = true;
    RunGemmCase(c, seed++);
    c = {QuantWeightFormat::kInt4, DataType::kF16, 100, 256, 1024, 128, false, splits};
    c.in_kernel_reduction = true;
    RunGemmCase(c, seed++);
    if (HasFatalFailure()) return;
  }
  // Many waves of blocks (2,048 of them), so splits of one tile run far apart in time.
  GemmCase waves{QuantWeightFormat::kInt4, DataType::kF16, 1, 16384, 4096, 128, true, 16};
  waves.in_kernel_reduction = true;
  RunGemmCase(waves, seed++);
  // The heuristic's own splits on this GPU.
  LOOM_ASSERT_OK_AND_ASSIGN(const int sms, CurrentDeviceSmCount());
  ASSERT_GT(ChooseQuantGemmSplits(1, 4096, 14336, sms, QuantWeightFormat::kInt4), 1)
      << sms << " SMs";
  GemmCase heuristic{QuantWeightFormat::kInt4, DataType::kF16, 1, 4096, 14336, 128, false};
  heuristic.in_kernel_reduction = true;
  RunGemmCase(heuristic, seed++);
}

// f32_out (what CudaDevice::Linear asks for): the F32 sums plus the bias, which round to the
// act_dtype output bit for bit, without splits, through the reduce kernel and in every
// config; a bias given as F32 (bias_f32) adds the same.
TEST(CudaQuantGemmTest, F32OutputRoundsToTheActivationOutput) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  uint32_t seed = 850;
  for (DataType dtype : {DataType::kF16, DataType::kBF16}) {
    for (int64_t m : {1, 13, 23, 37, 100, 130}) {
      for (int splits : {1, 3}) {
        GemmCase c{QuantWeightFormat::kInt4, dtype, m, 160, 384, 64, true, splits};
        c.f32_out_too = true;
        RunGemmCase(c, seed++);
        c = {QuantWeightFormat::kInt8, dtype, m, 96, 512, 0, m % 2 == 1, splits};
        c.f32_out_too = true;
        RunGemmCase(c, seed++);
        if (HasFatalFailure()) return;
      }
    }
  }
}

TEST(CudaQuantGemmTest, LlamaSizedShapesMatchReference) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  RunGemmCase({QuantWeightFormat::kInt4, DataType::kF16, 1, 4096, 4096, 128, false}, 900);
  RunGemmCase({QuantWeightFormat::kInt4, DataType::kBF16, 64, 4096, 4096, 32, true}, 901);
  RunGemmCase({QuantWeightFormat::kInt8, DataType::kF16, 16, 4096, 4096, 0, true}, 902);
  RunGemmCase({QuantWeightFormat::kInt8, DataType::kBF16, 1, 4096, 4096, 0, false}, 903);
}

// ---------------------------------------------------------------- GPU: FP8

// E4M3 spacing at |value| (normal or subnormal).
double E4m3Ulp(double value) {
  int exponent = 0;
  std::frexp(std::max(std::abs(value), 1e-30), &exponent);
  return std::ldexp(1.0, std::max(exponent - 1, -6) - 3);
}

TEST(CudaQuantGemmTest, Fp8QuantizerRoundsToNearestWithDynamicScale) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  for (DataType dtype : {DataType::kF16, DataType::kBF16}) {
    SCOPED_TRACE(DataTypeName(dtype));
    constexpr int64_t count = 3 * 1000 + 17;
    const std::vector<float> x =
        testing_util::RoundTo(dtype, testing_util::RandomFloats(count, 41, -3.0f, 3.0f));
    LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_x, testing_util::Upload(dtype, x));
    LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_out, DeviceBuffer::Allocate(count));
    ASSERT_TRUE(d_out.Fill(0x7f).ok());  // NaN in E4M3
    LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_scale, DeviceBuffer::Allocate(sizeof(float)));
    ASSERT_TRUE(d_scale.Fill(0xff).ok());
    QuantizeFp8Params p;
    p.x = d_x.data();
    p.out = d_out.data();
    p.scale = static_cast<float*>(d_scale.data());
    p.in_dtype = dtype;
    p.count = count;
    ASSERT_TRUE(LaunchQuantizeFp8(p, nullptr).ok());
    ASSERT_TRUE(SynchronizeStream(nullptr).ok());
    std::vector<uint8_t> out(count);
    float scale = 0.0f;
    ASSERT_TRUE(d_out.CopyToHost(out.data(), out.size()).ok());
    ASSERT_TRUE(d_scale.CopyToHost(&scale, sizeof(scale)).ok());
    float amax = 0.0f;
    for (float v : x) amax = std::max(amax, std::abs(v));
    EXPECT_EQ(scale, amax / kE4m3Max);
    for (int64_t i = 0; i < count; ++i) {
      const double target = static_cast<double>(x[i]) / scale;
      const double got = E4m3ToFloat(out[i]);
      ASSERT_FALSE(std::isnan(got)) << i;
      // Nearest (a tie may go either way after the float reciprocal): half a spacing.
      ASSERT_LE(std::abs(got - std::clamp(target, -448.0, 448.0)),
                0.5 * E4m3Ulp(target) * (1 + 1e-5))
          << "at " << i << ": x " << x[i] << " -> " << got << " vs " << target;
    }
  }
}

struct Fp8Case {
  DataType dtype;
  int64_t m, n, k;
  bool per_channel, bias;
  // The input quantized per row (QuantizeFp8Params::row_size, x_scale_per_row), and the
  // output (and bias) in F32, as CudaDevice's FP8 linear layers run.
  bool per_row_x = false;
  bool f32_out = false;
};

void RunFp8Case(const Fp8Case& c, uint32_t seed) {
  SCOPED_TRACE(absl::StrFormat("%s m=%d n=%d k=%d per_channel=%d bias=%d per_row_x=%d f32_out=%d",
                               DataTypeName(c.dtype), c.m, c.n, c.k, c.per_channel, c.bias,
                               c.per_row_x, c.f32_out));
  const DataType out_dtype = c.f32_out ? DataType::kF32 : c.dtype;
  const int64_t x_scales = c.per_row_x ? c.m : 1;
  // Activations through the GPU quantizer; the reference reads back what it produced.
  const std::vector<float> x =
      testing_util::RoundTo(c.dtype, testing_util::RandomFloats(c.m * c.k, seed, -2.0f, 2.0f));
  LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_x, testing_util::Upload(c.dtype, x));
  LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_xq, DeviceBuffer::Allocate(c.m * c.k));
  LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_x_scale,
                            DeviceBuffer::Allocate(x_scales * sizeof(float)));
  QuantizeFp8Params qp;
  qp.x = d_x.data();
  qp.out = d_xq.data();
  qp.scale = static_cast<float*>(d_x_scale.data());
  qp.in_dtype = c.dtype;
  qp.count = c.m * c.k;
  qp.row_size = c.per_row_x ? c.k : 0;
  ASSERT_TRUE(LaunchQuantizeFp8(qp, nullptr).ok());
  // Weights quantized on the host with their own per-row (or one) scale.
  const std::vector<float> w = testing_util::RandomFloats(c.n * c.k, seed + 1, -1.0f, 1.0f);
  std::vector<float> w_scale(c.per_channel ? c.n : 1, 0.0f);
  for (int64_t r = 0; r < c.n; ++r) {
    float& s = w_scale[c.per_channel ? r : 0];
    for (int64_t i = 0; i < c.k; ++i) s = std::max(s, std::abs(w[r * c.k + i]) / kE4m3Max);
  }
  std::vector<uint8_t> wq(c.n * c.k);
  for (int64_t r = 0; r < c.n; ++r) {
    for (int64_t i = 0; i < c.k; ++i) {
      wq[r * c.k + i] = FloatToE4m3(w[r * c.k + i] / w_scale[c.per_channel ? r : 0]);
    }
  }
  std::vector<float> bias;
  if (c.bias) {
    bias = testing_util::RoundTo(out_dtype, testing_util::RandomFloats(c.n, seed + 2, -0.5f, 0.5f));
  }
  LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_w, testing_util::UploadRaw(wq));
  LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_w_scale, testing_util::UploadRaw(w_scale));
  LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_y, testing_util::Poisoned(out_dtype, c.m * c.n));
  DeviceBuffer d_bias;
  if (c.bias) {
    LOOM_ASSERT_OK_AND_ASSIGN(d_bias, testing_util::Upload(out_dtype, bias));
  }
  Fp8GemmParams p;
  p.x = d_xq.data();
  p.x_scale = static_cast<const float*>(d_x_scale.data());
  p.x_scale_per_row = c.per_row_x;
  p.weight = d_w.data();
  p.w_scale = static_cast<const float*>(d_w_scale.data());
  p.per_channel = c.per_channel;
  p.bias = c.bias ? d_bias.data() : nullptr;
  p.y = d_y.data();
  p.out_dtype = out_dtype;
  p.m = c.m;
  p.n = c.n;
  p.k = c.k;
  LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer workspace,
                            DeviceBuffer::Allocate(Fp8GemmWorkspaceBytes(p)));
  ASSERT_TRUE(workspace.Fill(0xff).ok());
  p.workspace = workspace.data();
  p.workspace_bytes = workspace.bytes();
  const absl::Status launched = LaunchFp8Gemm(p, nullptr);
  ASSERT_TRUE(launched.ok()) << launched;
  ASSERT_TRUE(SynchronizeStream(nullptr).ok());

  std::vector<uint8_t> xq(c.m * c.k);
  std::vector<float> x_scale(x_scales, 0.0f);
  ASSERT_TRUE(d_xq.CopyToHost(xq.data(), xq.size()).ok());
  ASSERT_TRUE(d_x_scale.CopyToHost(x_scale.data(), x_scale.size() * sizeof(float)).ok());
  if (c.per_row_x) {
    // Each row's scale is its own max |x| / 448 (1 / 448 for a zero row).
    for (int64_t i = 0; i < c.m; ++i) {
      float amax = 0.0f;
      for (int64_t l = 0; l < c.k; ++l) amax = std::max(amax, std::abs(x[i * c.k + l]));
      ASSERT_EQ(x_scale[i], amax > 0.0f ? amax / kE4m3Max : 1.0f / kE4m3Max) << "row " << i;
      for (int64_t l = 0; l < c.k; ++l) {  // and its codes the nearest to x / scale
        const double target = static_cast<double>(x[i * c.k + l]) / x_scale[i];
        ASSERT_LE(std::abs(E4m3ToFloat(xq[i * c.k + l]) - std::clamp(target, -448.0, 448.0)),
                  0.5 * E4m3Ulp(target) * (1 + 1e-5))
            << "row " << i << " column " << l;
      }
    }
  }
  // Reference over the exact E4M3 values; tolerance 2^-10 * sum |x||w| (F32 accumulation inside
  // cuBLASLt's FP8 kernels, promoted periodically) + u * |y|.
  // The codes decoded once through a table (E4m3ToFloat per product made the 16 x 4096 x 4096
  // case take 36 s of the window's kernel step).
  std::array<double, 256> decoded;
  for (int code = 0; code < 256; ++code) decoded[code] = E4m3ToFloat(static_cast<uint8_t>(code));
  const auto decode = [&](const std::vector<uint8_t>& codes) {
    std::vector<double> values(codes.size());
    for (size_t i = 0; i < codes.size(); ++i) values[i] = decoded[codes[i]];
    return values;
  };
  const std::vector<double> xv = decode(xq), wv = decode(wq);
  const double u = UnitRoundoff(out_dtype);
  std::vector<double> expected(c.m * c.n), tolerance(c.m * c.n);
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < c.n; ++j) {
      double sum = 0.0, magnitude = 0.0;
      for (int64_t l = 0; l < c.k; ++l) {
        const double product = xv[i * c.k + l] * wv[j * c.k + l];
        sum += product;
        magnitude += std::abs(product);
      }
      const double scale =
          static_cast<double>(x_scale[c.per_row_x ? i : 0]) * w_scale[c.per_channel ? j : 0];
      double value = sum * scale;
      magnitude *= scale;
      if (c.bias) {
        value += bias[j];
        magnitude += std::abs(bias[j]);
      }
      expected[i * c.n + j] = value;
      tolerance[i * c.n + j] = 0x1p-10 * magnitude + u * std::abs(value) + 1e-30;
    }
  }
  LOOM_ASSERT_OK_AND_ASSIGN(std::vector<float> y,
                            testing_util::Download(d_y, out_dtype, c.m * c.n));
  EXPECT_TRUE(WithinTolerance(y, expected, tolerance));
}

TEST(CudaQuantGemmTest, Fp8GemmMatchesReferenceOnSm89Plus) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  if (!Fp8GemmSupported()) {
    // The launch must say why rather than fail later.
    alignas(256) static uint8_t storage[256] = {};
    Fp8GemmParams p;
    p.x = p.weight = p.y = storage;
    p.x_scale = p.w_scale = reinterpret_cast<const float*>(storage);
    p.m = 1;
    p.n = 16;
    p.k = 16;
    p.workspace = storage;
    p.workspace_bytes = Fp8GemmWorkspaceBytes(p);
    EXPECT_EQ(LaunchFp8Gemm(p, nullptr).code(), absl::StatusCode::kFailedPrecondition);
    GTEST_SKIP() << "FP8 GEMM needs compute capability >= 8.9: " << CudaDeviceDescription(0);
  }
  uint32_t seed = 1100;
  for (DataType dtype : {DataType::kF16, DataType::kBF16}) {
    for (int64_t m : {1, 16, 256}) {
      RunFp8Case({dtype, m, 96, 256, m % 2 == 0, true}, seed++);
      RunFp8Case({dtype, m, 256, 512, m % 2 == 1, false}, seed++);
      if (HasFatalFailure()) return;
    }
  }
  RunFp8Case({DataType::kBF16, 16, 4096, 4096, true, true}, seed++);
  // As CudaDevice runs it: per-row input scales, per-channel weights, F32 output and bias.
  for (DataType dtype : {DataType::kF16, DataType::kBF16}) {
    for (int64_t m : {1, 7, 256}) {
      RunFp8Case({dtype, m, 96, 256, true, m != 7, /*per_row_x=*/true, /*f32_out=*/true}, seed++);
      if (HasFatalFailure()) return;
    }
  }
}

}  // namespace
}  // namespace loom::kernels::cuda
