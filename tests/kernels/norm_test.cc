#include "kernels/cpu/norm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace loom::kernels::cpu {
namespace {

// Tolerance: float accumulation of the sum of squares and three roundings per element:
// |out - ref| <= 1e-5 * |ref| + 1e-6.
constexpr double kRelTol = 1e-5;

std::vector<float> Random(int64_t n, uint32_t seed, float mean = 0.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(mean, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

void ExpectClose(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << i;
    ASSERT_NEAR(got[i], want[i], kRelTol * std::fabs(want[i]) + 1e-6) << i;
  }
}

TEST(NormTest, RmsNormMatchesReferenceOverShapes) {
  uint32_t seed = 1;
  for (int64_t hidden : {1, 7, 64, 576, 2048, 4097}) {
    for (int64_t tokens : {1, 3, 17}) {
      const std::vector<float> x = Random(tokens * hidden, ++seed, 0.3f);
      const std::vector<float> w = Random(hidden, ++seed, 1.0f);
      std::vector<float> got(x.size()), want(x.size());
      RmsNorm(x.data(), w.data(), 1e-5f, tokens, hidden, got.data());
      RmsNormReference(x.data(), w.data(), 1e-5f, tokens, hidden, want.data());
      ExpectClose(got, want);
      // In place (out aliases x).
      std::vector<float> in_place = x;
      RmsNorm(in_place.data(), w.data(), 1e-5f, tokens, hidden, in_place.data());
      ExpectClose(in_place, want);
    }
  }
}

TEST(NormTest, AddRmsNormAddsIntoResidualThenNormalizes) {
  uint32_t seed = 50;
  for (int64_t hidden : {5, 576, 960}) {
    const int64_t tokens = 4;
    std::vector<float> residual = Random(tokens * hidden, ++seed);
    const std::vector<float> x = Random(tokens * hidden, ++seed);
    const std::vector<float> w = Random(hidden, ++seed, 1.0f);
    std::vector<float> sum(residual.size());
    for (size_t i = 0; i < sum.size(); ++i) sum[i] = residual[i] + x[i];
    std::vector<float> want(sum.size()), got(sum.size());
    RmsNormReference(sum.data(), w.data(), 1e-6f, tokens, hidden, want.data());
    AddRmsNorm(residual.data(), x.data(), w.data(), 1e-6f, tokens, hidden, got.data());
    EXPECT_EQ(residual, sum);
    ExpectClose(got, want);
  }
}

}  // namespace
}  // namespace loom::kernels::cpu
