#include "cli/perplexity_command.h"

#include <cmath>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/step_batch.h"

namespace loom::worker {
namespace {

using namespace ::loom::cli;  // NOLINT: the commands moved to cli/

using ::testing::HasSubstr;

TEST(PlanPerplexityWindowsTest, ScoresEveryTokenButTheFirstExactlyOnce) {
  for (auto [n, context, stride] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {10, 4, 2}, {100, 32, 16}, {100, 32, 31}, {101, 32, 7}, {5, 8, 4}, {2, 2, 1}}) {
    absl::StatusOr<std::vector<PerplexityWindow>> windows =
        PlanPerplexityWindows(n, context, stride);
    ASSERT_TRUE(windows.ok()) << windows.status();
    std::vector<int> scored(n, 0);
    for (const PerplexityWindow& w : *windows) {
      EXPECT_LE(w.end - w.begin, context);
      EXPECT_GE(w.score_begin, w.begin + 1);
      for (int64_t p = w.score_begin; p < w.end; ++p) ++scored[p];
    }
    EXPECT_EQ(scored[0], 0);
    for (int64_t p = 1; p < n; ++p) EXPECT_EQ(scored[p], 1) << "token " << p << " of " << n;
    EXPECT_EQ(windows->back().end, n);
  }
  // Disjoint windows: each window's first token has no context and is not scored.
  absl::StatusOr<std::vector<PerplexityWindow>> disjoint = PlanPerplexityWindows(100, 32, 32);
  ASSERT_TRUE(disjoint.ok());
  int64_t disjoint_scored = 0;
  for (const PerplexityWindow& w : *disjoint) disjoint_scored += w.end - w.score_begin;
  EXPECT_EQ(disjoint_scored, 100 - 4);
  // HF's recipe: windows start every stride tokens; each scores what is new to it.
  absl::StatusOr<std::vector<PerplexityWindow>> windows = PlanPerplexityWindows(10, 4, 2);
  ASSERT_TRUE(windows.ok());
  ASSERT_EQ(windows->size(), 4u);
  EXPECT_EQ((*windows)[1].begin, 2);
  EXPECT_EQ((*windows)[1].end, 6);
  EXPECT_EQ((*windows)[1].score_begin, 4);
}

TEST(PlanPerplexityWindowsTest, RejectsImpossibleWindows) {
  EXPECT_THAT(PlanPerplexityWindows(10, 4, 5).status().message(), HasSubstr("stride 5"));
  EXPECT_FALSE(PlanPerplexityWindows(10, 4, 0).ok());
  EXPECT_FALSE(PlanPerplexityWindows(10, 1, 1).ok());
  EXPECT_THAT(PlanPerplexityWindows(1, 4, 2).status().message(), HasSubstr("at least 2 tokens"));
}

// A model that predicts "previous token + 1" with logit `confidence` and 0 elsewhere, and
// records the positions it is asked for.
class CountingModel : public ForwardPass {
 public:
  explicit CountingModel(float confidence) : confidence_(confidence) {
    config_.vocab_size = 8;
    config_.context_length = 64;
  }
  const common::ModelConfig& config() const override { return config_; }
  int64_t num_kv_blocks() const override { return 4; }
  int64_t block_size() const override { return 4; }
  absl::Status Step(const StepBatch& batch, std::vector<float>& logits) override {
    absl::Status valid = ValidateStepBatch(batch, config_.vocab_size, config_.context_length,
                                           num_kv_blocks(), block_size());
    if (!valid.ok()) return valid;
    max_position =
        std::max(max_position, *std::max_element(batch.positions.begin(), batch.positions.end()));
    steps += 1;
    logits.assign(batch.sample_rows.size() * config_.vocab_size, 0.0f);
    for (size_t i = 0; i < batch.sample_rows.size(); ++i) {
      const int32_t next = (batch.token_ids[batch.sample_rows[i]] + 1) % config_.vocab_size;
      logits[i * config_.vocab_size + next] = confidence_;
    }
    return absl::OkStatus();
  }

  int32_t max_position = -1;
  int steps = 0;

 private:
  common::ModelConfig config_;
  float confidence_;
};

TEST(ComputePerplexityTest, UniformLogitsGiveTheVocabularySize) {
  CountingModel model(0.0f);
  std::vector<int32_t> tokens(40);
  for (int i = 0; i < 40; ++i) tokens[i] = (i * 3) % 8;
  absl::StatusOr<PerplexityResult> result = ComputePerplexity(model, tokens, {16, 8, 5});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->scored, 39);
  EXPECT_NEAR(result->perplexity(), 8.0, 1e-9);
  EXPECT_EQ(model.max_position, 15);  // every window restarts at position 0
}

TEST(ComputePerplexityTest, ScoresTheTokenThatFollows) {
  // The model puts logit 3 on "previous + 1"; a counting sequence is predicted with
  // p = e^3 / (e^3 + 7) at every position.
  CountingModel model(3.0f);
  std::vector<int32_t> tokens(30);
  for (int i = 0; i < 30; ++i) tokens[i] = i % 8;
  absl::StatusOr<PerplexityResult> result = ComputePerplexity(model, tokens, {12, 6, 512});
  ASSERT_TRUE(result.ok()) << result.status();
  const double nll = -std::log(std::exp(3.0) / (std::exp(3.0) + 7.0));
  EXPECT_NEAR(result->mean_nll(), nll, 1e-9);
  EXPECT_EQ(result->scored, 29);
  // A sequence the model never predicts: all scored tokens get p = 1 / (e^3 + 7).
  std::vector<int32_t> constant(30, 5);
  result = ComputePerplexity(model, constant, {12, 6, 512});
  ASSERT_TRUE(result.ok());
  EXPECT_NEAR(result->mean_nll(), std::log(std::exp(3.0) + 7.0), 1e-9);
}

TEST(ComputePerplexityTest, RejectsWindowsTheRunnerCannotHold) {
  CountingModel model(0.0f);
  std::vector<int32_t> tokens(100, 1);
  EXPECT_THAT(ComputePerplexity(model, tokens, {32, 16, 512}).status().message(),
              HasSubstr("needs 8 KV blocks, the runner has 4"));
  EXPECT_THAT(ComputePerplexity(model, tokens, {128, 16, 512}).status().message(),
              HasSubstr("exceeds the model's context length 64"));
}

}  // namespace
}  // namespace loom::worker
