// --activations bf16 (kernels/cpu/matmul_bf16act_amx.cc): every weight format against
// MatmulReference's BF16 rounding, batch invariance, and the refusal where the CPU (or
// LOOM_CPU_ISA) offers no AMX-BF16. On such a machine only the refusal runs: the rest skips
// with the reason.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/formats/ggml_type.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/weights.h"
#include "tests/kernels/kquant_test_util.h"

namespace loom::kernels::cpu {
namespace {

constexpr ActivationPrecision kBf16 = ActivationPrecision::kBf16;

std::vector<float> Random(int64_t count, uint32_t seed, float spread = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, spread);
  std::vector<float> out(count);
  for (float& v : out) v = normal(rng);
  return out;
}

struct Case {
  std::string name;
  PackedWeight weight;
};

// One weight of every format Matmul takes, n x k.
std::vector<Case> AllFormats(int64_t n, int64_t k, uint32_t seed) {
  std::vector<Case> cases;
  const std::vector<float> values = Random(n * k, seed, 0.05f);
  auto add = [&](std::string name, absl::StatusOr<PackedWeight> packed) {
    ASSERT_TRUE(packed.ok()) << name << ": " << packed.status();
    cases.push_back({std::move(name), *std::move(packed)});
  };
  add("F32", PackFromF32(values.data(), n, k, WeightFormat::kF32, 0));
  add("F16", PackFromF32(values.data(), n, k, WeightFormat::kF16, 0));
  add("BF16", PackFromF32(values.data(), n, k, WeightFormat::kBf16, 0));
  add("INT8 g32", PackFromF32(values.data(), n, k, WeightFormat::kInt8, 32));
  add("INT8 per channel", PackFromF32(values.data(), n, k, WeightFormat::kInt8, k));
  add("INT4 g32", PackFromF32(values.data(), n, k, WeightFormat::kInt4, 32));
  add("INT4 g64", PackFromF32(values.data(), n, k, WeightFormat::kInt4, 64));
  add("INT5 g32", PackFromF32(values.data(), n, k, WeightFormat::kInt5, 32));
  std::mt19937 rng(seed + 1);
  std::uniform_int_distribution<int> byte(0, 255);
  std::vector<uint8_t> iq4(n * k / 32 * 18);
  for (size_t b = 0; b < iq4.size(); b += 18) {
    const uint16_t scale = FloatToHalf(0.004f * static_cast<float>(byte(rng) - 128) / 128.0f);
    iq4[b] = static_cast<uint8_t>(scale & 0xff);
    iq4[b + 1] = static_cast<uint8_t>(scale >> 8);
    for (int i = 2; i < 18; ++i) iq4[b + i] = static_cast<uint8_t>(byte(rng));
  }
  add("NL4 (IQ4_NL)", PackWeight(common::GgmlType::kIQ4_NL, iq4.data(), n, k));
  if (k % 256 == 0) {
    for (common::GgmlType type : {common::GgmlType::kQ4_K, common::GgmlType::kQ6_K,
                                  common::GgmlType::kQ5_K, common::GgmlType::kQ3_K}) {
      const std::vector<uint8_t> blocks = testing_util::RandomKQuantBlocks(type, n * k, seed + 2);
      add(common::RawGgmlTypeName(static_cast<uint32_t>(type)),
          PackWeight(type, blocks.data(), n, k));
    }
  }
  return cases;
}

bool Bf16Runs() { return ActivationPrecisionStatus(kBf16).ok(); }

// Matmul with BF16 activations against MatmulReference's (BF16 inputs, double sums): the
// kernel's F32 sums over k differ from the double ones by float rounding only.
void ExpectMatchesReference(const Case& c, int64_t m, bool with_bias, int threads) {
  const PackedWeight& w = c.weight;
  SCOPED_TRACE(testing::Message() << c.name << " n=" << w.rows << " k=" << w.cols << " m=" << m
                                  << " bias=" << with_bias << " threads=" << threads);
  const std::vector<float> x = Random(m * w.cols, 100 + m);
  const std::vector<float> bias = Random(w.rows, 7);
  std::vector<float> y(m * w.rows, std::nanf("")), reference(m * w.rows);
  ThreadPool pool(threads);
  const MatmulParams params{x.data(), &w, with_bias ? bias.data() : nullptr, y.data(), m, kBf16};
  ASSERT_TRUE(Matmul(params, pool).ok());
  MatmulParams reference_params = params;
  reference_params.y = reference.data();
  ASSERT_TRUE(MatmulReference(reference_params).ok());
  // The magnitude of each sum's terms bounds its F32 rounding.
  std::vector<float> row(w.cols);
  int bad = 0;
  for (int64_t j = 0; j < w.rows; ++j) {
    DequantizeRows(w, j, j + 1, row.data());
    for (int64_t t = 0; t < m; ++t) {
      double magnitude = 0.0;
      for (int64_t i = 0; i < w.cols; ++i) {
        magnitude +=
            std::fabs(static_cast<double>(RoundToBf16(row[i])) * RoundToBf16(x[t * w.cols + i]));
      }
      const float got = y[t * w.rows + j], want = reference[t * w.rows + j];
      if (!(std::fabs(got - want) <= 2e-6 * magnitude + 1e-6) && bad++ < 5) {
        ADD_FAILURE() << "y[" << t << ", " << j << "] = " << got << ", reference " << want
                      << " (sum of |terms| " << magnitude << ")";
      }
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST(MatmulBf16Test, EveryFormatMatchesTheBf16ReferenceOverShapesAndTokens) {
  if (!Bf16Runs()) GTEST_SKIP() << ActivationPrecisionStatus(kBf16).message();
  // n: one block, a partial block, an odd number of blocks; k: 256 (K-quants too), 192 (not
  // a multiple of 256).
  for (int64_t n : {16, 40, 48}) {
    for (int64_t k : {256, 192}) {
      for (const Case& c : AllFormats(n, k, static_cast<uint32_t>(n * 1000 + k))) {
        // m: one token, a partial tile, one tile, a tile and one, two tiles and a partial one.
        for (int64_t m : {1, 5, 16, 17, 40}) ExpectMatchesReference(c, m, m % 2 == 1, 2);
      }
    }
  }
}

TEST(MatmulBf16Test, FloatWeightsOfAnyWidthAndThreadCount) {
  if (!Bf16Runs()) GTEST_SKIP() << ActivationPrecisionStatus(kBf16).message();
  // k = 77 and 33: not a multiple of 32 (padded with zeros), odd (a last pair (w, 0)).
  for (int64_t k : {77, 33, 576}) {
    const std::vector<float> values = Random(200 * k, 3, 0.05f);
    for (WeightFormat format : {WeightFormat::kF32, WeightFormat::kF16, WeightFormat::kBf16}) {
      absl::StatusOr<PackedWeight> packed = PackFromF32(values.data(), 200, k, format, 0);
      ASSERT_TRUE(packed.ok()) << packed.status();
      const Case c{WeightFormatName(format), *std::move(packed)};
      for (int threads : {1, 3}) ExpectMatchesReference(c, 35, true, threads);
    }
  }
}

// A token's result is the same bits whatever else is in its batch and wherever it falls in
// the 16-token tiles, and whatever the thread count.
TEST(MatmulBf16Test, EachTokensResultIsIndependentOfTheBatch) {
  if (!Bf16Runs()) GTEST_SKIP() << ActivationPrecisionStatus(kBf16).message();
  constexpr int64_t kN = 200, kK = 576, kM = 37;
  const std::vector<float> x = Random(kM * kK, 11);
  for (const Case& c : AllFormats(kN, kK, 12)) {
    if (c.name == "INT4 g64" || c.name == "INT8 per channel") continue;
    std::vector<float> batched(kM * kN);
    ThreadPool pool2(2), pool3(3);
    ASSERT_TRUE(Matmul({x.data(), &c.weight, nullptr, batched.data(), kM, kBf16}, pool2).ok());
    for (int64_t t = 0; t < kM; t += 3) {
      for (int64_t subset : {1, 2, 17}) {
        if (t + subset > kM) continue;
        std::vector<float> alone(subset * kN);
        ThreadPool& pool = subset == 2 ? pool3 : pool2;
        ASSERT_TRUE(
            Matmul({x.data() + t * kK, &c.weight, nullptr, alone.data(), subset, kBf16}, pool)
                .ok());
        for (int64_t i = 0; i < subset * kN; ++i) {
          ASSERT_EQ(alone[i], batched[t * kN + i])
              << c.name << " token " << t << " output " << i << " batch of " << subset;
        }
      }
    }
  }
}

// An F16/F32 weight packed as BF16 (PackOptions::floats_as_bf16, which the CPU forward pass
// sets for --activations bf16) gives the same bits as the weight converted on the fly: the
// conversion is the same rounding, and the tiles the same sums.
TEST(MatmulBf16Test, WeightsHeldAsBf16GiveTheBitsOfConvertingThemPerCall) {
  if (!Bf16Runs()) GTEST_SKIP() << ActivationPrecisionStatus(kBf16).message();
  for (int64_t k : {77, 576}) {
    constexpr int64_t kN = 72;
    const std::vector<float> values = Random(kN * k, 9, 0.05f);
    std::vector<uint16_t> halves(values.size());
    for (size_t i = 0; i < values.size(); ++i) halves[i] = FloatToHalf(values[i]);
    const PackOptions as_bf16{.floats_as_bf16 = true};
    for (const auto& [type, data] : std::vector<std::pair<common::GgmlType, const void*>>{
             {common::GgmlType::kF32, values.data()}, {common::GgmlType::kF16, halves.data()}}) {
      absl::StatusOr<PackedWeight> plain = PackWeight(type, data, kN, k);
      absl::StatusOr<PackedWeight> held = PackWeight(type, data, kN, k, as_bf16);
      ASSERT_TRUE(plain.ok() && held.ok());
      ASSERT_EQ(held->format, WeightFormat::kBf16);
      ASSERT_NE(plain->format, WeightFormat::kBf16);
      for (int64_t m : {1, 5, 40}) {
        const std::vector<float> x = Random(m * k, 20 + m);
        std::vector<float> converted(m * kN), native(m * kN);
        ThreadPool pool(2);
        ASSERT_TRUE(Matmul({x.data(), &*plain, nullptr, converted.data(), m, kBf16}, pool).ok());
        ASSERT_TRUE(Matmul({x.data(), &*held, nullptr, native.data(), m, kBf16}, pool).ok());
        for (int64_t i = 0; i < m * kN; ++i) {
          ASSERT_EQ(native[i], converted[i])
              << plain->source << " k " << k << " m " << m << " output " << i;
        }
      }
    }
  }
}

// BF16 is not F32: on the same inputs the results differ from the f32 path by BF16's rounding
// of x and W (2^-9 relative), more than F32 sums do, so the test above would catch a kernel
// that ignored the precision.
TEST(MatmulBf16Test, RoundsInputsToBf16) {
  if (!Bf16Runs()) GTEST_SKIP() << ActivationPrecisionStatus(kBf16).message();
  const std::vector<float> values = Random(64 * 256, 5, 0.05f);
  absl::StatusOr<PackedWeight> w = PackFromF32(values.data(), 64, 256, WeightFormat::kF32, 0);
  ASSERT_TRUE(w.ok());
  const std::vector<float> x = Random(4 * 256, 6);
  std::vector<float> bf16(4 * 64), f32(4 * 64);
  ThreadPool pool(1);
  ASSERT_TRUE(Matmul({x.data(), &*w, nullptr, bf16.data(), 4, kBf16}, pool).ok());
  ASSERT_TRUE(
      Matmul({x.data(), &*w, nullptr, f32.data(), 4, ActivationPrecision::kF32}, pool).ok());
  double max_diff = 0.0;
  for (size_t i = 0; i < f32.size(); ++i)
    max_diff = std::max<double>(max_diff, std::fabs(bf16[i] - f32[i]));
  EXPECT_GT(max_diff, 1e-4);
  EXPECT_LT(max_diff, 0.1);
}

TEST(MatmulBf16Test, RefusedWithTheReasonWhereAmxBf16IsMissing) {
  const absl::Status status = ActivationPrecisionStatus(kBf16);
  if (status.ok()) {
    GTEST_SKIP() << "this CPU runs BF16 activations (LOOM_CPU_ISA=avx512 covers the refusal)";
  }
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(status.message()).find("--activations bf16"), std::string::npos) << status;
  const std::vector<float> values = Random(16 * 32, 1);
  absl::StatusOr<PackedWeight> w = PackFromF32(values.data(), 16, 32, WeightFormat::kF32, 0);
  ASSERT_TRUE(w.ok());
  std::vector<float> y(16, 0.0f);
  ThreadPool pool(1);
  const absl::Status refused = Matmul({values.data(), &*w, nullptr, y.data(), 1, kBf16}, pool);
  EXPECT_EQ(refused, status);
  for (float v : y) EXPECT_EQ(v, 0.0f);  // nothing written
}

TEST(MatmulBf16Test, ParsesAndNamesTheFlagValue) {
  absl::StatusOr<ActivationPrecision> parsed = ParseActivationPrecision("bf16");
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(*parsed, kBf16);
  EXPECT_STREQ(ActivationPrecisionName(kBf16), "bf16");
  const absl::StatusOr<ActivationPrecision> bad = ParseActivationPrecision("fp16");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("f32, int8 or bf16"), std::string::npos);
}

}  // namespace
}  // namespace loom::kernels::cpu
