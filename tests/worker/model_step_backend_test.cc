#include "worker/model_step_backend.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "common/status_macros.h"
#include "tests/worker/tiny_model.h"
#include "worker/cpu_forward_pass.h"
#include "worker/step_batch.h"

namespace loom::worker {
namespace {

// A forward pass that "samples on its device" the way the CUDA forward pass is asked to: it
// runs the real CPU forward pass and picks the greedy token of each row itself, recording what
// ModelStepBackend handed it. Stands in for the GPU, which this machine lacks (the CUDA
// forward pass's own StepAndSample is tested against the CPU in cuda_forward_pass_test).
class DeviceSamplingPass : public ForwardPass {
 public:
  explicit DeviceSamplingPass(std::unique_ptr<CpuForwardPass> forward_pass)
      : forward_pass_(std::move(forward_pass)) {}
  const common::ModelConfig& config() const override { return forward_pass_->config(); }
  int64_t num_kv_blocks() const override { return forward_pass_->num_kv_blocks(); }
  int64_t block_size() const override { return forward_pass_->block_size(); }
  absl::Status Step(const StepBatch& batch, std::vector<float>& logits) override {
    ++host_steps;
    return forward_pass_->Step(batch, logits);
  }
  bool samples_on_device() const override { return true; }
  absl::Status StepAndSample(const StepBatch& batch, const DeviceSampleRows& rows,
                             std::vector<int32_t>& tokens, std::vector<float>& logprobs) override {
    ++device_steps;
    last_rows = rows;
    std::vector<float> logits;
    LOOM_RETURN_IF_ERROR(forward_pass_->Step(batch, logits));
    const int64_t vocab = config().vocab_size;
    tokens.clear();
    logprobs.clear();
    for (size_t i = 0; i < rows.params.size(); ++i) {
      const float* row = logits.data() + i * vocab;
      tokens.push_back(static_cast<int32_t>(std::max_element(row, row + vocab) - row));
      logprobs.push_back(-0.5f);
    }
    return absl::OkStatus();
  }

  int host_steps = 0;
  int device_steps = 0;
  DeviceSampleRows last_rows;

 private:
  std::unique_ptr<CpuForwardPass> forward_pass_;
};

class ModelStepBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    gguf_ = testing::TinyModel(testing::TinyModelSpec{});
    ASSERT_NE(gguf_, nullptr);
    CpuForwardPassOptions options;
    options.num_threads = 1;
    options.num_kv_blocks = 16;
    options.block_size = 16;
    auto forward_pass = CpuForwardPass::Create(*gguf_, options);
    ASSERT_TRUE(forward_pass.ok()) << forward_pass.status();
    auto pass = std::make_unique<DeviceSamplingPass>(std::move(*forward_pass));
    pass_ = pass.get();
    backend_ = std::make_unique<ModelStepBackend>(std::move(pass), "test");
  }

  // A two-sequence prefill step (prompts of 3 and 5 tokens, blocks 0 and 1).
  static StepBatch TwoPrompts() {
    StepBatch batch;
    EXPECT_TRUE(AppendSequence(batch, {1, 2, 3}, 0, {0}, 16, true).ok());
    EXPECT_TRUE(AppendSequence(batch, {4, 5, 6, 7, 8}, 0, {1}, 16, true).ok());
    return batch;
  }

  std::unique_ptr<common::GgufFile> gguf_;
  DeviceSamplingPass* pass_ = nullptr;
  std::unique_ptr<ModelStepBackend> backend_;
};

TEST_F(ModelStepBackendTest, PlainRowsAreSampledOnTheDeviceWithTheirPenaltiesAndPositions) {
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.num_logprobs = 0;
  SamplingParams penalized;
  penalized.temperature = 0.8f;
  penalized.seed = 7;
  penalized.repetition_penalty = 1.3f;
  SequenceSampler a(greedy, std::vector<int32_t>{1, 2, 3}, 24);
  SequenceSampler b(penalized, std::vector<int32_t>{4, 5, 6, 7, 8}, 24);
  std::vector<SampleRow> rows = {{1, &a, {}, {}}, {2, &b, {}, {}}};
  std::vector<SampledToken> tokens;
  std::vector<int32_t> emitted;
  BackendTimings timings;
  ASSERT_TRUE(backend_->Run(TwoPrompts(), rows, tokens, emitted, timings).ok());
  EXPECT_EQ(pass_->device_steps, 1);
  EXPECT_EQ(pass_->host_steps, 0);
  ASSERT_EQ(tokens.size(), 2u);
  EXPECT_EQ(emitted, (std::vector<int32_t>{1, 1}));
  EXPECT_FLOAT_EQ(tokens[0].logprob, -0.5f);  // asked for (num_logprobs 0)
  const DeviceSampleRows& sent = pass_->last_rows;
  ASSERT_EQ(sent.params.size(), 2u);
  EXPECT_EQ(sent.params[1].seed, 7u);
  // The tokens decided are at positions 3 and 5 (after each prompt's last token).
  EXPECT_EQ(sent.positions, (std::vector<int64_t>{3, 5}));
  // Row a has no penalties; row b's repetition penalty touches its 5 prompt tokens.
  EXPECT_EQ(sent.penalty_indptr, (std::vector<int32_t>{0, 0, 5}));
  std::vector<int32_t> listed(sent.penalty_tokens.begin(), sent.penalty_tokens.end());
  std::sort(listed.begin(), listed.end());
  EXPECT_EQ(listed, (std::vector<int32_t>{4, 5, 6, 7, 8}));
  // The picked token was recorded: b's next penalties list it (generated once).
  std::vector<int32_t> ids, counts;
  b.PenaltyEntries(ids, counts);
  const auto found = std::find(ids.begin(), ids.end(), tokens[1].token_id);
  ASSERT_NE(found, ids.end());
  EXPECT_EQ(counts[found - ids.begin()], 1);
}

TEST_F(ModelStepBackendTest, RowsWantingTopLogprobsOrWithDraftsStayOnTheHost) {
  SamplingParams top;
  top.temperature = 0.0f;
  top.num_logprobs = 3;  // top-n alternatives: the device sampler reports only the chosen
  SamplingParams plain;
  plain.temperature = 0.0f;
  SequenceSampler a(top, std::vector<int32_t>{1, 2, 3}, 24);
  SequenceSampler b(plain, std::vector<int32_t>{4, 5, 6, 7, 8}, 24);
  std::vector<SampleRow> rows = {{1, &a, {}, {}}, {2, &b, {}, {}}};
  std::vector<SampledToken> tokens;
  std::vector<int32_t> emitted;
  BackendTimings timings;
  ASSERT_TRUE(backend_->Run(TwoPrompts(), rows, tokens, emitted, timings).ok());
  EXPECT_EQ(pass_->device_steps, 0);
  EXPECT_EQ(pass_->host_steps, 1);
  ASSERT_EQ(tokens.size(), 2u);
  EXPECT_EQ(tokens[0].top_logprobs.size(), 3u);
}

}  // namespace
}  // namespace loom::worker
