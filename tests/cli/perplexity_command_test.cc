#include "cli/perplexity_command.h"

#include <cmath>
#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/tokenizer/tokenizer.h"
#include "tests/worker/tiny_model.h"
#include "worker/forward_pass.h"
#include "worker/model_step_backend.h"
#include "worker/step_batch.h"

namespace loom::cli {
namespace {

using worker::ForwardPass;
using worker::StepBatch;

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
  CountingModel(float confidence, int64_t num_kv_blocks)
      : confidence_(confidence), num_kv_blocks_(num_kv_blocks) {
    config_.vocab_size = 8;
    config_.context_length = 64;
  }
  const common::ModelConfig& config() const override { return config_; }
  int64_t num_kv_blocks() const override { return num_kv_blocks_; }
  int64_t block_size() const override { return 4; }
  absl::Status Step(const StepBatch& batch, std::vector<float>& logits) override {
    absl::Status valid = worker::ValidateStepBatch(batch, config_.vocab_size, config_.context_length,
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
  int64_t num_kv_blocks_;
};

// The counting model behind the in-process engine, with an 8-token tokenizer ("t0".."t7").
struct CountingEngine {
  CountingEngine(float confidence, int64_t max_step_tokens, int64_t num_kv_blocks = 5) {
    worker::testing::TinyModelSpec spec;
    spec.vocab = 8;
    vocabulary = worker::testing::TinyModel(spec);
    tokenizer = common::Tokenizer::FromGguf(*vocabulary).value();
    auto owned = std::make_unique<CountingModel>(confidence, num_kv_blocks);
    model = owned.get();
    backend = std::make_unique<worker::ModelStepBackend>(std::move(owned));
    LocalEngineOptions options;
    options.max_num_batched_tokens = max_step_tokens;
    options.enable_prefix_caching = false;
    engine = std::make_unique<LocalEngine>(*backend, *tokenizer, options);
  }

  std::unique_ptr<common::GgufFile> vocabulary;  // the tokenizer's source
  std::unique_ptr<common::Tokenizer> tokenizer;
  CountingModel* model = nullptr;  // owned by the backend
  std::unique_ptr<worker::ModelStepBackend> backend;
  std::unique_ptr<LocalEngine> engine;
};

TEST(ComputePerplexityTest, UniformLogitsGiveTheVocabularySize) {
  // Windows of 16 prefilled 5 tokens per step.
  CountingEngine counting(0.0f, 5);
  std::vector<int32_t> tokens(40);
  for (int i = 0; i < 40; ++i) tokens[i] = (i * 3) % 8;
  absl::StatusOr<PerplexityResult> result = ComputePerplexity(*counting.engine, tokens, {16, 8});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->scored(), 39);
  EXPECT_NEAR(result->perplexity(), 8.0, 1e-9);
  EXPECT_EQ(counting.model->max_position, 15);  // every window restarts at position 0
  EXPECT_EQ(counting.model->steps, 4 * 4);      // 4 windows of 4 chunks
  EXPECT_EQ(counting.engine->block_manager().num_free(), 5);
}

TEST(ComputePerplexityTest, ScoresTheTokenThatFollows) {
  // The model puts logit 3 on "previous + 1"; a counting sequence is predicted with
  // p = e^3 / (e^3 + 7) at every position.
  CountingEngine counting(3.0f, 512);
  std::vector<int32_t> tokens(30);
  for (int i = 0; i < 30; ++i) tokens[i] = i % 8;
  absl::StatusOr<PerplexityResult> result = ComputePerplexity(*counting.engine, tokens, {12, 6});
  ASSERT_TRUE(result.ok()) << result.status();
  const double nll = -std::log(std::exp(3.0) / (std::exp(3.0) + 7.0));
  EXPECT_NEAR(result->mean_nll(), nll, 1e-9);
  EXPECT_EQ(result->scored(), 29);
  ASSERT_EQ(result->token_nll.size(), 29u);
  for (double token : result->token_nll) EXPECT_NEAR(token, nll, 1e-9);
  EXPECT_NEAR(result->nll_stderr(), 0.0, 1e-9);  // every token alike
  // A sequence the model never predicts: all scored tokens get p = 1 / (e^3 + 7).
  std::vector<int32_t> constant(30, 5);
  result = ComputePerplexity(*counting.engine, constant, {12, 6});
  ASSERT_TRUE(result.ok());
  EXPECT_NEAR(result->mean_nll(), std::log(std::exp(3.0) + 7.0), 1e-9);
}

TEST(ComputePerplexityTest, TokensInTextOrderAndTheMeansStandardError) {
  // Counting tokens broken by a 0 every sixth: the model predicts 20 of the 29 scored
  // tokens (NLL a) and misses 9 (NLL b), each at its place in the text.
  CountingEngine counting(3.0f, 512);
  std::vector<int32_t> tokens(30);
  for (int i = 0; i < 30; ++i) tokens[i] = i % 6 == 5 ? 0 : i % 8;
  absl::StatusOr<PerplexityResult> result = ComputePerplexity(*counting.engine, tokens, {12, 6});
  ASSERT_TRUE(result.ok()) << result.status();
  const double a = -std::log(std::exp(3.0) / (std::exp(3.0) + 7.0));
  const double b = std::log(std::exp(3.0) + 7.0);
  ASSERT_EQ(result->token_nll.size(), 29u);
  std::vector<double> want;
  for (int i = 1; i < 30; ++i) want.push_back(tokens[i] == (tokens[i - 1] + 1) % 8 ? a : b);
  for (int i = 0; i < 29; ++i) EXPECT_NEAR(result->token_nll[i], want[i], 1e-9) << i;
  double mean = 0, squares = 0;
  for (double v : want) mean += v / 29.0;
  for (double v : want) squares += (v - mean) * (v - mean);
  EXPECT_NEAR(result->mean_nll(), mean, 1e-9);
  EXPECT_NEAR(result->nll_stderr(), std::sqrt(squares / 28.0 / 29.0), 1e-9);
  EXPECT_NEAR(result->perplexity_stderr(), std::exp(mean) * result->nll_stderr(), 1e-9);
}

TEST(ComputePerplexityTest, RejectsWindowsTheForwardPassCannotHold) {
  CountingEngine counting(0.0f, 512, /*num_kv_blocks=*/4);
  std::vector<int32_t> tokens(100, 1);
  // 32 tokens and the one sampled after them, in blocks of 4.
  EXPECT_THAT(ComputePerplexity(*counting.engine, tokens, {32, 16}).status().message(),
              HasSubstr("needs 9 KV blocks, the engine has 4"));
  EXPECT_THAT(ComputePerplexity(*counting.engine, tokens, {128, 16}).status().message(),
              HasSubstr("exceeds the model's context length 64"));
  EXPECT_THAT(ComputePerplexity(*counting.engine, tokens, {64, 16}).status().message(),
              HasSubstr("must be below the model's context length 64"));
  EXPECT_EQ(counting.model->steps, 0);
}

}  // namespace
}  // namespace loom::cli
