#include "quant/awq.h"

#include <cmath>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/quantize.h"

namespace loom::quant {
namespace {

using kernels::cpu::WeightFormat;

std::vector<float> Normal(int64_t n, float stddev, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// Activations [tokens, channels] whose first `salient` channels are `boost` times larger
// than the rest, as in LLM layers (a few channels carry large activations).
std::vector<float> SalientActivations(int64_t tokens, int64_t channels, int64_t salient,
                                      float boost, uint32_t seed) {
  std::vector<float> x = Normal(tokens * channels, 1.0f, seed);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t c = 0; c < salient; ++c) x[t * channels + c * 7 % channels] *= boost;
  }
  return x;
}

TEST(ActivationStatsTest, AveragesMagnitudesAndSamplesEveryNthToken) {
  ActivationStats stats(/*in_features=*/2, /*max_samples=*/3, /*sample_every=*/2);
  const std::vector<float> first = {1, -2, -3, 4, 5, -6};  // tokens 0, 1, 2
  const std::vector<float> second = {7, 8, 9, 10};         // tokens 3, 4
  stats.Add(first.data(), 3);
  stats.Add(second.data(), 2);
  EXPECT_EQ(stats.num_tokens(), 5);
  EXPECT_THAT(stats.MeanAbs(), testing::ElementsAre(25.0f / 5, 30.0f / 5));
  // Tokens 0, 2 and 4 (the count runs across calls), capped at 3.
  EXPECT_EQ(stats.num_samples(), 3);
  EXPECT_THAT(stats.samples(), testing::ElementsAre(1, -2, 5, -6, 9, 10));
  stats.Add(first.data(), 3);
  EXPECT_EQ(stats.num_samples(), 3);
}

class AwqSearchTest : public testing::TestWithParam<std::pair<WeightFormat, int64_t>> {};

TEST_P(AwqSearchTest, ProtectsSalientChannelsBetterThanRoundToNearest) {
  const auto [format, group] = GetParam();
  const int64_t rows = 96, cols = 256, tokens = 256;
  const std::vector<float> weight = Normal(rows * cols, 0.05f, 1);
  const std::vector<float> x = SalientActivations(tokens, cols, 8, 40.0f, 2);
  ActivationStats stats(cols, tokens, 1);
  stats.Add(x.data(), tokens);
  kernels::cpu::ThreadPool pool(2);
  AwqOptions options;
  options.format = format;
  options.group_size = group;
  absl::StatusOr<AwqResult> result =
      SearchAwqScales(weight.data(), rows, cols, stats, options, pool);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_GT(result->alpha, 0.0);
  EXPECT_GT(result->rtn_error, 0.0);
  EXPECT_LT(result->error, 0.8 * result->rtn_error)
      << "alpha " << result->alpha << " error " << result->error << " rtn " << result->rtn_error;
  // The salient channels get scales above the others.
  EXPECT_GT(result->scales[0], result->scales[1]);
  for (float s : result->scales) ASSERT_TRUE(std::isfinite(s) && s > 0);

  // The reported errors are what ScaledQuantizationError measures for those scales.
  absl::StatusOr<double> rtn = ScaledQuantizationError(
      weight.data(), rows, cols, nullptr, stats.samples().data(), tokens, options, pool);
  absl::StatusOr<double> scaled =
      ScaledQuantizationError(weight.data(), rows, cols, result->scales.data(),
                              stats.samples().data(), tokens, options, pool);
  ASSERT_TRUE(rtn.ok() && scaled.ok());
  EXPECT_DOUBLE_EQ(*rtn, result->rtn_error);
  EXPECT_DOUBLE_EQ(*scaled, result->error);
}

INSTANTIATE_TEST_SUITE_P(Formats, AwqSearchTest,
                         testing::Values(std::make_pair(WeightFormat::kInt4, int64_t{128}),
                                         std::make_pair(WeightFormat::kInt4, int64_t{32}),
                                         std::make_pair(WeightFormat::kInt8, int64_t{256})));

TEST(AwqSearchTest, UniformChannelsKeepUnitScales) {
  // Every channel has the same mean |x|: s = m^alpha / sqrt(max * min) = 1 for any alpha,
  // so no alpha beats alpha 0 and the weight is left alone.
  const int64_t rows = 32, cols = 64, tokens = 32;
  const std::vector<float> weight = Normal(rows * cols, 0.05f, 3);
  std::vector<float> x(tokens * cols);
  for (int64_t i = 0; i < tokens * cols; ++i) x[i] = (i % 3 == 0) ? 0.5f : -0.5f;
  ActivationStats stats(cols, tokens, 1);
  stats.Add(x.data(), tokens);
  kernels::cpu::ThreadPool pool(1);
  AwqOptions options;
  options.group_size = 32;
  absl::StatusOr<AwqResult> result =
      SearchAwqScales(weight.data(), rows, cols, stats, options, pool);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->alpha, 0.0);
  EXPECT_EQ(result->error, result->rtn_error);
  for (float s : result->scales) EXPECT_EQ(s, 1.0f);
}

TEST(AwqSearchTest, RejectsMissingSamplesAndShapeMismatch) {
  kernels::cpu::ThreadPool pool(1);
  std::vector<float> weight(32 * 64, 0.1f);
  ActivationStats empty(64, 16, 1);
  EXPECT_THAT(SearchAwqScales(weight.data(), 32, 64, empty, {}, pool).status().message(),
              testing::HasSubstr("no calibration samples"));
  ActivationStats other(128, 16, 1);
  EXPECT_THAT(SearchAwqScales(weight.data(), 32, 64, other, {}, pool).status().message(),
              testing::HasSubstr("64 input channels, its statistics 128"));
}

// Output error of one row's INT4 quantization on inputs x [n, cols], group by group (the
// sum over groups of the mean squared partial product error, as ClipWeights measures it).
double RowGroupErrors(const std::vector<float>& original, const std::vector<float>& quantized_from,
                      const std::vector<float>& x, int64_t n, int64_t cols, int64_t group) {
  const kernels::cpu::QuantizedMatrix q =
      kernels::cpu::QuantizeRtn(quantized_from.data(), 1, cols, WeightFormat::kInt4, group).value();
  std::vector<float> deq(cols);
  kernels::cpu::DequantizeMatrix(q, deq.data());
  double error = 0;
  for (int64_t g0 = 0; g0 < cols; g0 += group) {
    for (int64_t t = 0; t < n; ++t) {
      double d = 0;
      for (int64_t c = g0; c < g0 + group; ++c) {
        d += x[t * cols + c] * (static_cast<double>(deq[c]) - original[c]);
      }
      error += d * d / static_cast<double>(n);
    }
  }
  return error;
}

TEST(AwqClipTest, ClippingOutlierWeightsLowersTheOutputError) {
  // Heavy-tailed weights: one outlier per group stretches the 16-level grid, so shrinking
  // the range trades the outlier's error for finer steps everywhere else.
  const int64_t rows = 24, cols = 128, group = 64, n = 96;
  std::vector<float> weight = Normal(rows * cols, 0.02f, 6);
  for (int64_t r = 0; r < rows; ++r) weight[r * cols + (r * 13) % cols] = 0.3f;
  const std::vector<float> x = Normal(n * cols, 1.0f, 7);
  const std::vector<float> original = weight;
  kernels::cpu::ThreadPool pool(2);
  absl::StatusOr<ClipResult> result =
      ClipWeights(weight.data(), rows, cols, x.data(), n, group, 20, 0.5, pool);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_GT(result->clipped_groups, 0);
  EXPECT_LT(result->error, result->unclipped_error);
  // The reported errors are the real output errors of quantizing the clipped rows.
  double before = 0, after = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<float> row(original.begin() + r * cols, original.begin() + (r + 1) * cols);
    const std::vector<float> clipped(weight.begin() + r * cols, weight.begin() + (r + 1) * cols);
    for (int64_t c = 0; c < cols; ++c) ASSERT_LE(std::fabs(clipped[c]), std::fabs(row[c]) + 1e-7f);
    before += RowGroupErrors(row, row, x, n, cols, group);
    after += RowGroupErrors(row, clipped, x, n, cols, group);
  }
  EXPECT_NEAR(before, result->unclipped_error, 1e-6 * before);
  EXPECT_NEAR(after, result->error, 1e-6 * before);
  EXPECT_LT(after, before);
}

TEST(AwqClipTest, LeavesWellBehavedGroupsAloneAndRejectsBadArguments) {
  // Two-valued groups quantize exactly: any clipping can only add error.
  const int64_t rows = 4, cols = 64;
  std::vector<float> weight(rows * cols);
  for (int64_t i = 0; i < rows * cols; ++i) weight[i] = (i % 2) ? 0.5f : -0.25f;
  const std::vector<float> original = weight;
  const std::vector<float> x = Normal(16 * cols, 1.0f, 8);
  kernels::cpu::ThreadPool pool(1);
  absl::StatusOr<ClipResult> result =
      ClipWeights(weight.data(), rows, cols, x.data(), 16, 32, 20, 0.5, pool);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->clipped_groups, 0);
  EXPECT_EQ(weight, original);
  EXPECT_FALSE(ClipWeights(weight.data(), rows, cols, x.data(), 16, 48, 20, 0.5, pool).ok());
  EXPECT_FALSE(ClipWeights(weight.data(), rows, cols, x.data(), 16, 32, 20, 1.0, pool).ok());
}

TEST(AwqFoldingTest, ScalingColumnsAndTheInputCancelsBeforeQuantization) {
  // (W diag(s)) (x / s) == W x: the fold is an identity up to float rounding.
  const int64_t rows = 5, cols = 64;
  std::vector<float> w = Normal(rows * cols, 1.0f, 4);
  std::vector<float> x = Normal(cols, 1.0f, 5);
  std::vector<float> s(cols);
  for (int64_t c = 0; c < cols; ++c) s[c] = 0.25f + 0.1f * static_cast<float>(c % 17);
  std::vector<float> scaled = w;
  ScaleColumns(scaled.data(), rows, cols, s.data());
  for (int64_t r = 0; r < rows; ++r) {
    double want = 0, got = 0;
    for (int64_t c = 0; c < cols; ++c) {
      want += static_cast<double>(w[r * cols + c]) * x[c];
      got += static_cast<double>(scaled[r * cols + c]) * (x[c] / s[c]);
    }
    EXPECT_NEAR(got, want, 1e-5 * (1 + std::fabs(want)));
  }
  std::vector<float> up = {2, 4, 6, 8, 10, 12};
  const std::vector<float> divisors = {2, 4};
  DivideRows(up.data(), 2, 3, divisors.data());
  EXPECT_THAT(up, testing::ElementsAre(1, 2, 3, 2, 2.5, 3));
}

}  // namespace
}  // namespace loom::quant
