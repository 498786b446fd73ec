#include "kernels/cpu/moe_routing.h"

#include <cmath>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace loom::kernels::cpu {
namespace {

struct Routed {
  std::vector<int32_t> chosen;
  std::vector<float> weights;
};

Routed Route(const std::vector<float>& logits, int64_t experts, int64_t top_k, bool normalize) {
  const int64_t tokens = static_cast<int64_t>(logits.size()) / experts;
  Routed routed{std::vector<int32_t>(tokens * top_k), std::vector<float>(tokens * top_k)};
  MoeRoute(logits.data(), tokens, experts, {.top_k = top_k, .normalize = normalize},
           routed.chosen.data(), routed.weights.data());
  return routed;
}

TEST(MoeRoutingTest, PicksTheLargestLogitsMostProbableFirst) {
  const std::vector<float> logits = {0.5f,  3.0f,  -1.0f, 2.0f,   // token 0
                                     -2.0f, -3.0f, 4.0f,  1.0f};  // token 1
  Routed routed = Route(logits, 4, 2, /*normalize=*/true);
  EXPECT_EQ(routed.chosen, (std::vector<int32_t>{1, 3, 2, 3}));
  // Renormalized: a softmax over the chosen logits.
  EXPECT_NEAR(routed.weights[0], 1.0 / (1.0 + std::exp(-1.0)), 1e-6);
  EXPECT_NEAR(routed.weights[0] + routed.weights[1], 1.0, 1e-6);
  EXPECT_NEAR(routed.weights[2], 1.0 / (1.0 + std::exp(-3.0)), 1e-6);
}

TEST(MoeRoutingTest, WithoutNormalizingTheWeightsAreSoftmaxProbabilities) {
  const std::vector<float> logits = {0.5f, 3.0f, -1.0f, 2.0f};
  Routed routed = Route(logits, 4, 1, /*normalize=*/false);
  double total = 0.0;
  for (float logit : logits) total += std::exp(logit);
  EXPECT_EQ(routed.chosen[0], 1);
  EXPECT_NEAR(routed.weights[0], std::exp(3.0) / total, 1e-6);
  // Every expert chosen: the weights are the whole softmax, summing to 1 either way.
  Routed all = Route(logits, 4, 4, /*normalize=*/false);
  EXPECT_EQ(all.chosen, (std::vector<int32_t>{1, 3, 0, 2}));
  EXPECT_NEAR(all.weights[0] + all.weights[1] + all.weights[2] + all.weights[3], 1.0, 1e-6);
}

TEST(MoeRoutingTest, TiesGoToTheLowerIndexAndNanRanksLast) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Routed tie = Route({1.0f, 2.0f, 2.0f, 2.0f}, 4, 2, true);
  EXPECT_EQ(tie.chosen, (std::vector<int32_t>{1, 2}));
  EXPECT_FLOAT_EQ(tie.weights[0], 0.5f);
  Routed with_nan = Route({nan, 0.0f, 1.0f, nan}, 4, 2, true);
  EXPECT_EQ(with_nan.chosen, (std::vector<int32_t>{2, 1}));
  EXPECT_TRUE(std::isfinite(with_nan.weights[0]) && std::isfinite(with_nan.weights[1]));
}

TEST(MoeRoutingTest, SigmoidScoresChooseWithTheBiasAndWeighWithoutIt) {
  // GLM-4.5 / DeepSeek-V3: scores sigmoid(logit); the bias moves expert 2 ahead of expert 1
  // for the choice, and the weights are the unbiased scores, renormalized, times the scale.
  const std::vector<float> logits = {0.5f, 3.0f, 2.0f, -1.0f};
  const std::vector<float> bias = {0.0f, -0.2f, 0.3f, 0.0f};
  auto sigmoid = [](double x) { return 1.0 / (1.0 + std::exp(-x)); };
  Routed routed{std::vector<int32_t>(2), std::vector<float>(2)};
  MoeRoute(logits.data(), 1, 4,
           {.top_k = 2,
            .sigmoid = true,
            .selection_bias = bias.data(),
            .normalize = true,
            .scale = 2.5f},
           routed.chosen.data(), routed.weights.data());
  EXPECT_EQ(routed.chosen, (std::vector<int32_t>{2, 1}));
  const double sum = sigmoid(2.0) + sigmoid(3.0);
  EXPECT_NEAR(routed.weights[0], sigmoid(2.0) / sum * 2.5, 1e-6);
  EXPECT_NEAR(routed.weights[1], sigmoid(3.0) / sum * 2.5, 1e-6);
  // Not renormalized: the scores themselves (times the scale); no bias: the logits' order.
  MoeRoute(logits.data(), 1, 4, {.top_k = 2, .sigmoid = true, .normalize = false, .scale = 1.0f},
           routed.chosen.data(), routed.weights.data());
  EXPECT_EQ(routed.chosen, (std::vector<int32_t>{1, 2}));
  EXPECT_NEAR(routed.weights[0], sigmoid(3.0), 1e-6);
  EXPECT_NEAR(routed.weights[1], sigmoid(2.0), 1e-6);
}

TEST(MoeRoutingTest, GroupsLimitTheChoiceToTheBestGroups) {
  // Three groups of two: (0, 1), (2, 3), (4, 5). Expert 0 scores best, but its group's two
  // together score below the others' pairs.
  const std::vector<float> logits = {4.0f, -4.0f, 2.0f, 2.0f, 2.5f, 1.0f};
  auto sigmoid = [](double x) { return 1.0 / (1.0 + std::exp(-x)); };
  Routed routed{std::vector<int32_t>(2), std::vector<float>(2)};
  // DeepSeek-V3: sigmoid scores, each group's two best summed; the best 2 groups.
  MoeRoute(logits.data(), 1, 6,
           {.top_k = 2, .sigmoid = true, .normalize = true, .groups = 3, .groups_used = 2},
           routed.chosen.data(), routed.weights.data());
  EXPECT_EQ(routed.chosen, (std::vector<int32_t>{4, 2}));  // 2 before 3: the lower index
  const double sum = sigmoid(2.5) + sigmoid(2.0);
  EXPECT_NEAR(routed.weights[0], sigmoid(2.5) / sum, 1e-6);
  // One group used: (2, 3) sums to 1.76, (4, 5) to 1.65; within it, equal scores.
  MoeRoute(logits.data(), 1, 6,
           {.top_k = 2, .sigmoid = true, .normalize = false, .groups = 3, .groups_used = 1},
           routed.chosen.data(), routed.weights.data());
  EXPECT_EQ(routed.chosen, (std::vector<int32_t>{2, 3}));
  // DeepSeek-V2: softmax probabilities, each group scored by its best: expert 0's group
  // wins, then (4, 5).
  MoeRoute(logits.data(), 1, 6, {.top_k = 2, .normalize = false, .groups = 3, .groups_used = 2},
           routed.chosen.data(), routed.weights.data());
  EXPECT_EQ(routed.chosen, (std::vector<int32_t>{0, 4}));
  // Without groups expert 0 and the best of the rest.
  MoeRoute(logits.data(), 1, 6, {.top_k = 2, .sigmoid = true, .normalize = false},
           routed.chosen.data(), routed.weights.data());
  EXPECT_EQ(routed.chosen, (std::vector<int32_t>{0, 4}));
}

TEST(MoeRoutingTest, ABiasMovesASoftmaxChoiceToo) {
  const std::vector<float> logits = {0.0f, 1.0f, 0.9f};
  const std::vector<float> bias = {0.0f, 0.0f, 0.5f};
  Routed routed{std::vector<int32_t>(1), std::vector<float>(1)};
  MoeRoute(logits.data(), 1, 3, {.top_k = 1, .selection_bias = bias.data(), .normalize = false},
           routed.chosen.data(), routed.weights.data());
  EXPECT_EQ(routed.chosen[0], 2);
  const double total = std::exp(0.0) + std::exp(1.0) + std::exp(0.9);
  EXPECT_NEAR(routed.weights[0], std::exp(0.9) / total, 1e-6);
}

TEST(MoeRoutingTest, ARowsRoutingDoesNotDependOnTheOtherRows) {
  std::vector<float> logits(16 * 8);
  for (size_t i = 0; i < logits.size(); ++i)
    logits[i] = std::sin(0.37f * static_cast<float>(i)) * 3;
  Routed batch = Route(logits, 8, 3, true);
  for (int64_t t = 0; t < 16; ++t) {
    Routed one =
        Route(std::vector<float>(logits.begin() + t * 8, logits.begin() + (t + 1) * 8), 8, 3, true);
    for (int64_t i = 0; i < 3; ++i) {
      EXPECT_EQ(one.chosen[i], batch.chosen[t * 3 + i]);
      EXPECT_EQ(one.weights[i], batch.weights[t * 3 + i]);
    }
  }
}

}  // namespace
}  // namespace loom::kernels::cpu
