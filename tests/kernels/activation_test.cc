#include "kernels/cpu/activation.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/activation_internal.h"
#include "kernels/cpu/matmul_internal.h"

namespace loom::kernels::cpu {
namespace {

// Tolerance: |out - ref| <= 5e-7 * |ref| + 1e-30 against a double reference: float exp
// (within 2 ulp), a division and a multiplication, about 2 ulp (2.4e-7) measured on both
// paths; the absolute term covers gates below -88.7, where e^-g overflows and the float
// result saturates to -0 while the reference is a denormal-sized product (< 1e-34 here).
constexpr double kRelTol = 5e-7;
constexpr double kAbsTol = 1e-30;

class SiluMulTest : public testing::TestWithParam<bool> {  // param: SIMD enabled
 protected:
  void SetUp() override {
    // The SIMD case runs the best span LOOM_CPU_ISA allows: AVX-512, or AVX2 under
    // LOOM_CPU_ISA=avx2 (ctest kernels/isa_avx2) and on AVX2-only CPUs.
    if (GetParam() && !internal::IsaSupported(internal::MatmulIsaChoice::kAvx2)) {
      GTEST_SKIP() << "no AVX2 on this CPU: the SIMD case would run the scalar loop";
    }
    internal::SetActivationSimdForTesting(GetParam());
  }
  void TearDown() override { internal::SetActivationSimdForTesting(true); }
};

void ExpectNearReference(const std::vector<float>& gate_up, int64_t tokens, int64_t ffn,
                         const std::vector<float>& got) {
  std::vector<float> want(tokens * ffn);
  SiluMulReference(gate_up.data(), tokens, ffn, want.data());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << "tokens " << tokens << " ffn " << ffn << " i " << i;
    ASSERT_NEAR(got[i], want[i], kRelTol * std::fabs(want[i]) + kAbsTol)
        << "tokens " << tokens << " ffn " << ffn << " i " << i << " gate "
        << gate_up[(i / ffn) * 2 * ffn + i % ffn];
  }
}

TEST_P(SiluMulTest, MatchesReferenceOverShapes) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  for (int64_t ffn : {1, 5, 16, 17, 64, 1536, 8193}) {
    for (int64_t tokens : {1, 3, 17}) {
      std::vector<float> gate_up(tokens * 2 * ffn);
      for (float& v : gate_up) v = normal(rng);
      gate_up[0] = -90.0f;              // exp overflow side: silu -> -0
      if (ffn > 1) gate_up[1] = 90.0f;  // exp underflow side: silu -> g
      std::vector<float> got(tokens * ffn);
      SiluMul(gate_up.data(), tokens, ffn, got.data());
      ExpectNearReference(gate_up, tokens, ffn, got);
    }
  }
}

// A dense sweep of gates over the whole range where silu is neither 0 nor g, which is
// where the vector exp's range reduction and polynomial are exercised.
TEST_P(SiluMulTest, MatchesReferenceAcrossTheExpRange) {
  const int64_t ffn = 1 << 18;
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> gates(-88.0f, 88.0f), ups(-3.0f, 3.0f);
  std::vector<float> gate_up(2 * ffn);
  for (int64_t i = 0; i < ffn; ++i) {
    // Half the gates evenly spaced, half random; small magnitudes included.
    gate_up[i] = i % 2 == 0 ? -88.0f + 176.0f * static_cast<float>(i) / ffn : gates(rng);
    if (i % 97 == 0) gate_up[i] = std::ldexp(gate_up[i], -static_cast<int>(i % 40));
    gate_up[ffn + i] = ups(rng);
  }
  std::vector<float> got(ffn);
  SiluMul(gate_up.data(), 1, ffn, got.data());
  ExpectNearReference(gate_up, 1, ffn, got);
}

TEST_P(SiluMulTest, SaturatesWithoutNanOrInfAtExtremeGates) {
  const float gates[] = {-1e30f, -1000.0f, -104.5f, -90.0f, -88.8f, -88.7f, -87.0f,  -0.0f, 0.0f,
                         1e-30f, -1e-30f,  87.0f,   88.8f,  90.0f,  104.5f, 1000.0f, -2.5f};
  const int64_t ffn = sizeof(gates) / sizeof(gates[0]);
  std::vector<float> gate_up(2 * ffn);
  for (int64_t i = 0; i < ffn; ++i) {
    gate_up[i] = gates[i];
    gate_up[ffn + i] = gates[i] < -80.0f ? 1e38f : 1.5f;  // g * up alone would overflow
  }
  std::vector<float> got(ffn);
  SiluMul(gate_up.data(), 1, ffn, got.data());
  for (int64_t i = 0; i < ffn; ++i) {
    SCOPED_TRACE(testing::Message() << "gate " << gates[i]);
    ASSERT_TRUE(std::isfinite(got[i])) << got[i];
    if (gates[i] <= -90.0f) {
      EXPECT_EQ(got[i], 0.0f);  // -0 or +0: e^-g is +Inf in float
    } else if (gates[i] >= 87.0f) {
      EXPECT_EQ(got[i], gates[i] * 1.5f);  // 1 + e^-g rounds to 1
    }
  }
  EXPECT_TRUE(std::signbit(got[3]));  // silu(-90) = -0
}

TEST_P(SiluMulTest, PoolSplitIsBitIdenticalToOneThread) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  // Below the split threshold, just above it, and a size whose chunks end mid-row.
  const int64_t shapes[][2] = {{16, 1536}, {43, 1536}, {64, 1536}, {37, 3001}, {1, 200003}};
  for (const auto& shape : shapes) {
    const int64_t tokens = shape[0], ffn = shape[1];
    std::vector<float> gate_up(tokens * 2 * ffn);
    for (float& v : gate_up) v = normal(rng);
    std::vector<float> serial(tokens * ffn);
    SiluMul(gate_up.data(), tokens, ffn, serial.data());
    for (int threads : {1, 2, 3}) {
      ThreadPool pool(threads);
      std::vector<float> split(tokens * ffn, std::nanf(""));
      SiluMul(gate_up.data(), tokens, ffn, split.data(), pool);
      ASSERT_EQ(std::memcmp(split.data(), serial.data(), split.size() * sizeof(float)), 0)
          << "tokens " << tokens << " ffn " << ffn << " threads " << threads;
    }
    ExpectNearReference(gate_up, tokens, ffn, serial);
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, SiluMulTest, testing::Values(true, false),
                         [](const testing::TestParamInfo<bool>& info) {
                           return info.param ? "Simd" : "Scalar";
                         });

TEST(SiluMulIsaTest, SimdAgreesWithScalarFallbackWithinTwoRoundings) {
  if (!internal::IsaSupported(internal::MatmulIsaChoice::kAvx512)) {
    GTEST_SKIP() << "no AVX-512 on this CPU";
  }
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 6.0f);
  const int64_t count = 100003;
  std::vector<float> gate(count), up(count), simd(count), scalar(count);
  for (int64_t i = 0; i < count; ++i) {
    gate[i] = normal(rng);
    up[i] = normal(rng);
  }
  internal::SiluMulSpanAvx512(gate.data(), up.data(), count, simd.data());
  internal::SiluMulSpanScalar(gate.data(), up.data(), count, scalar.data());
  for (int64_t i = 0; i < count; ++i) {
    ASSERT_NEAR(simd[i], scalar[i], 2 * kRelTol * std::fabs(scalar[i]) + kAbsTol)
        << "gate " << gate[i];
  }
}

// The AVX2 span directly (whatever the best ISA is): within two roundings of the scalar
// one over a dense gate sweep, with the saturating ends and NaN.
TEST(SiluMulIsaTest, Avx2AgreesWithScalarFallbackAcrossTheRange) {
  if (!internal::IsaSupported(internal::MatmulIsaChoice::kAvx2)) {
    GTEST_SKIP() << "no AVX2 on this CPU";
  }
  const int64_t count = 200003;  // a tail of 3 after the 8-lane loop
  std::mt19937 rng(13);
  std::uniform_real_distribution<float> ups(-3.0f, 3.0f);
  std::vector<float> gate(count), up(count), simd(count), scalar(count);
  for (int64_t i = 0; i < count; ++i) {
    gate[i] = -110.0f + 220.0f * static_cast<float>(i) / count;
    if (i % 89 == 0) gate[i] = std::ldexp(gate[i], -static_cast<int>(i % 60));
    up[i] = ups(rng);
  }
  gate[5] = std::numeric_limits<float>::quiet_NaN();
  internal::SiluMulSpanAvx2(gate.data(), up.data(), count, simd.data());
  internal::SiluMulSpanScalar(gate.data(), up.data(), count, scalar.data());
  EXPECT_TRUE(std::isnan(simd[5]));
  for (int64_t i = 0; i < count; ++i) {
    if (i == 5) continue;
    ASSERT_NEAR(simd[i], scalar[i], 2 * kRelTol * std::fabs(scalar[i]) + kAbsTol)
        << "gate " << gate[i];
  }
  std::vector<float> want(count);
  std::vector<float> gate_up(2 * count);
  std::copy(gate.begin(), gate.end(), gate_up.begin());
  std::copy(up.begin(), up.end(), gate_up.begin() + count);
  gate_up[5] = 0.0f;
  simd[5] = 0.0f;
  ExpectNearReference(gate_up, 1, count, simd);
}

// Exp256 follows Exp512 step for step (two exact-exponent multiplies for vscalefps): the
// AVX2 and AVX-512 spans give the same bits, denormal results included.
TEST(SiluMulIsaTest, Avx2IsBitIdenticalToAvx512) {
  if (!internal::IsaSupported(internal::MatmulIsaChoice::kAvx512)) {
    GTEST_SKIP() << "no AVX-512 on this CPU";
  }
  const int64_t count = 100001;
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.0f, 30.0f);
  std::vector<float> gate(count), up(count), avx2(count), avx512(count);
  for (int64_t i = 0; i < count; ++i) {
    gate[i] = normal(rng);
    up[i] = i % 3 == 0 ? 1e38f : normal(rng);
  }
  internal::SiluMulSpanAvx2(gate.data(), up.data(), count, avx2.data());
  internal::SiluMulSpanAvx512(gate.data(), up.data(), count, avx512.data());
  ASSERT_EQ(std::memcmp(avx2.data(), avx512.data(), count * sizeof(float)), 0);
}

// Scale multiplies each value by the factor (one float rounding), in place.
TEST(ScaleTest, MultipliesEveryValueInPlace) {
  std::vector<float> x = {1.0f, -2.5f, 0.0f, 3e38f, -1e-40f, 7.0f};
  const std::vector<float> before = x;
  Scale(x.data(), static_cast<int64_t>(x.size()), 0.22f);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(x[i], before[i] * 0.22f) << i;
  Scale(x.data(), 0, 100.0f);  // nothing to do
  EXPECT_EQ(x[0], 0.22f);
}

// AddSigmoidGatedRows adds each row of x scaled by its gate's sigmoid (one rounding of the
// product, one of the sum), or unscaled without gates; the gates saturate to 0 and 1.
TEST(AddSigmoidGatedRowsTest, AddsEachRowScaledByItsGate) {
  const int64_t rows = 4, cols = 3;
  const std::vector<float> x = {1.0f, -2.0f, 0.5f, 3.0f,  4.0f,  -1.0f,
                                2.0f, 2.0f,  2.0f, 1e30f, -7.0f, 0.25f};
  const std::vector<float> gates = {0.0f, 1.5f, -200.0f, 200.0f};
  std::vector<float> out(rows * cols, 10.0f);
  AddSigmoidGatedRows(x.data(), gates.data(), rows, cols, out.data());
  for (int64_t t = 0; t < rows; ++t) {
    const double s = 1.0 / (1.0 + std::exp(-static_cast<double>(gates[t])));
    for (int64_t i = 0; i < cols; ++i) {
      const double want = 10.0 + s * x[t * cols + i];
      EXPECT_NEAR(out[t * cols + i], want, 1e-6 * std::abs(want)) << t << "," << i;
    }
  }
  EXPECT_EQ(out[0], 10.5f);          // sigmoid(0) = 1/2
  EXPECT_EQ(out[7], 10.0f);          // sigmoid(-200) = 0: the row adds nothing
  EXPECT_EQ(out[9], 1e30f + 10.0f);  // sigmoid(200) = 1
  std::vector<float> plain(rows * cols, 1.0f);
  AddSigmoidGatedRows(x.data(), nullptr, rows, cols, plain.data());
  for (int64_t i = 0; i < rows * cols; ++i) EXPECT_EQ(plain[i], 1.0f + x[i]) << i;
}

}  // namespace
}  // namespace loom::kernels::cpu
