#include "worker/model_step_backend.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "common/status_macros.h"
#include "tests/worker/device_sampling_pass.h"
#include "tests/worker/tiny_model.h"
#include "worker/cpu_forward_pass.h"
#include "worker/step_batch.h"

namespace loom::worker {
namespace {

using test_util::DeviceSamplingPass;

// The CPU forward pass of `gguf` on one thread with 16 blocks of 16 tokens.
std::unique_ptr<CpuForwardPass> SmallCpuPass(const common::GgufFile& gguf) {
  CpuForwardPassOptions options;
  options.num_threads = 1;
  options.num_kv_blocks = 16;
  options.block_size = 16;
  auto forward_pass = CpuForwardPass::Create(gguf, options);
  EXPECT_TRUE(forward_pass.ok()) << forward_pass.status();
  return forward_pass.ok() ? std::move(*forward_pass) : nullptr;
}

class ModelStepBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    gguf_ = testing::TinyModel(testing::TinyModelSpec{});
    ASSERT_NE(gguf_, nullptr);
    std::tie(pass_, backend_) = FreshBackend();
    ASSERT_NE(backend_, nullptr);
  }

  // A backend over a device-sampling pass of its own (fresh KV pool).
  std::pair<DeviceSamplingPass*, std::unique_ptr<ModelStepBackend>> FreshBackend() {
    std::unique_ptr<CpuForwardPass> forward_pass = SmallCpuPass(*gguf_);
    if (forward_pass == nullptr) return {nullptr, nullptr};
    auto pass = std::make_unique<DeviceSamplingPass>(std::move(forward_pass));
    DeviceSamplingPass* raw = pass.get();
    return {raw, std::make_unique<ModelStepBackend>(std::move(pass), "test")};
  }

  // A two-sequence prefill step (prompts of 3 and 5 tokens, blocks 0 and 1).
  static StepBatch TwoPrompts() {
    StepBatch batch;
    EXPECT_TRUE(AppendSequence(batch, {1, 2, 3}, 0, {0}, 16, true).ok());
    EXPECT_TRUE(AppendSequence(batch, {4, 5, 6, 7, 8}, 0, {1}, 16, true).ok());
    return batch;
  }

  // Runs TwoPrompts() with `a` and `b` sampling its two rows: the tokens; every row must
  // emit one.
  std::vector<SampledToken> RunTwoPrompts(SequenceSampler& a, SequenceSampler& b) {
    std::vector<SampleRow> rows = {{1, &a, {}, {}}, {2, &b, {}, {}}};
    std::vector<SampledToken> tokens;
    std::vector<int32_t> emitted;
    BackendTimings timings;
    EXPECT_TRUE(backend_->Run(TwoPrompts(), rows, tokens, emitted, timings).ok());
    EXPECT_EQ(tokens.size(), 2u);
    EXPECT_EQ(emitted, (std::vector<int32_t>{1, 1}));
    return tokens;
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
  const std::vector<SampledToken> tokens = RunTwoPrompts(a, b);
  ASSERT_EQ(tokens.size(), 2u);
  EXPECT_EQ(pass_->device_steps, 1);
  EXPECT_EQ(pass_->host_steps, 0);
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

// Each row is sampled where it would be alone: a row wanting top-n logprobs (which the device
// sampler does not report) on the host from its logits, the other on the device, so a
// seeded request's tokens never depend on what else its step carries.
TEST_F(ModelStepBackendTest, RowsWantingTopLogprobsAreSampledOnTheHostBesideDeviceRows) {
  SamplingParams top;
  top.temperature = 0.0f;
  top.num_logprobs = 3;  // top-n alternatives: the device sampler reports only the chosen
  SamplingParams seeded;
  seeded.temperature = 0.9f;
  seeded.seed = 11;
  seeded.num_logprobs = 0;  // the chosen token's, which the device reports
  SequenceSampler a(top, std::vector<int32_t>{1, 2, 3}, 24);
  SequenceSampler b(seeded, std::vector<int32_t>{4, 5, 6, 7, 8}, 24);
  std::vector<SampledToken> tokens = RunTwoPrompts(a, b);
  ASSERT_EQ(tokens.size(), 2u);
  EXPECT_EQ(pass_->device_steps, 1);
  EXPECT_EQ(pass_->host_steps, 0);
  // Row a's logits came back and the host sampled it: its top logprobs, the greedy token.
  EXPECT_EQ(pass_->last_rows.logits_rows, (std::vector<int32_t>{0}));
  ASSERT_EQ(tokens[0].top_logprobs.size(), 3u);
  EXPECT_EQ(tokens[0].token_id, tokens[0].top_logprobs[0].token_id);
  // Row b went to the device with its own parameters, as it would in a step of its own.
  EXPECT_EQ(pass_->last_rows.params[1].seed, 11u);
  EXPECT_FLOAT_EQ(tokens[1].logprob, -0.5f);

  // Alone, the seeded row is sampled the same way: on the device, with the same parameters
  // and position (its token the same there).
  auto [pass, backend] = FreshBackend();
  SequenceSampler alone(seeded, std::vector<int32_t>{4, 5, 6, 7, 8}, 24);
  std::vector<SampleRow> single = {{2, &alone, {}, {}}};
  StepBatch batch;
  ASSERT_TRUE(AppendSequence(batch, {4, 5, 6, 7, 8}, 0, {1}, 16, true).ok());
  std::vector<int32_t> emitted;
  BackendTimings timings;
  ASSERT_TRUE(backend->Run(batch, single, tokens, emitted, timings).ok());
  EXPECT_EQ(pass->device_steps, 1);
  EXPECT_EQ(pass->last_rows.positions, (std::vector<int64_t>{5}));
  EXPECT_TRUE(pass->last_rows.logits_rows.empty());
}

TEST_F(ModelStepBackendTest, AStepWithoutARowTheDeviceSamplesRunsOnTheHost) {
  SamplingParams top;
  top.temperature = 0.0f;
  top.num_logprobs = 2;
  SequenceSampler a(top, std::vector<int32_t>{1, 2, 3}, 24);
  SequenceSampler b(top, std::vector<int32_t>{4, 5, 6, 7, 8}, 24);
  const std::vector<SampledToken> tokens = RunTwoPrompts(a, b);
  ASSERT_EQ(tokens.size(), 2u);
  EXPECT_EQ(pass_->device_steps, 0);
  EXPECT_EQ(pass_->host_steps, 1);
  EXPECT_EQ(tokens[1].top_logprobs.size(), 2u);
}

// A prompt followed by its drafts in one prefill, with a sample row at the prompt's last
// token and at each draft (as StepExecutor lays out a speculative step).
StepBatch PromptWithDrafts(const std::vector<int32_t>& prompt, const std::vector<int32_t>& drafts,
                           int32_t block) {
  StepBatch batch;
  std::vector<int32_t> tokens = prompt;
  tokens.insert(tokens.end(), drafts.begin(), drafts.end());
  EXPECT_TRUE(AppendSequence(batch, tokens, 0, {block}, 16, /*sample_last=*/false).ok());
  for (size_t d = 0; d <= drafts.size(); ++d) {
    batch.sample_rows.push_back(static_cast<int32_t>(prompt.size() - 1 + d));
  }
  return batch;
}

// One step of `prompt` and its `drafts` (`q`: the draft model's distributions, or none) with a
// fresh sampler of `params`, on `host` (side 0) and `device` (side 1): what each picked and
// emitted.
void RunOnBothSides(ModelStepBackend& host, ModelStepBackend& device, const SamplingParams& params,
                    const std::vector<int32_t>& prompt, const std::vector<int32_t>& drafts,
                    const std::vector<float>& q, std::vector<int32_t> (&picked)[2],
                    std::vector<int32_t> (&emitted)[2]) {
  for (int side = 0; side < 2; ++side) {
    SequenceSampler sampler(params, prompt, 24);
    std::vector<SampleRow> rows = {{1, &sampler, drafts, q}};
    std::vector<SampledToken> tokens;
    BackendTimings timings;
    ModelStepBackend& backend = side == 0 ? host : device;
    ASSERT_TRUE(
        backend.Run(PromptWithDrafts(prompt, drafts, 3), rows, tokens, emitted[side], timings)
            .ok());
    for (const SampledToken& token : tokens) picked[side].push_back(token.token_id);
  }
}

// The token `backend` picks greedily after `prompt` (in block 2); -1 where the step fails.
int32_t GreedyNext(ModelStepBackend& backend, const std::vector<int32_t>& prompt) {
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  SequenceSampler sampler(greedy, prompt, 24);
  std::vector<SampleRow> rows = {{1, &sampler, {}, {}}};
  std::vector<SampledToken> tokens;
  std::vector<int32_t> emitted;
  BackendTimings timings;
  StepBatch batch;
  if (!AppendSequence(batch, prompt, 0, {2}, 16, true).ok() ||
      !backend.Run(batch, rows, tokens, emitted, timings).ok() || tokens.empty()) {
    return -1;
  }
  return tokens[0].token_id;
}

// One-hot drafts (n-gram proposals) are verified on the device: every position sampled
// there (positions and penalties as a plain decode at that position would have them, the
// drafts before it counted), the drafts accepted on the host while they equal the samples:
// the same tokens and counts as the host path gives. A draft model's q with a non-greedy
// sampler still takes the host's rejection sampling.
TEST_F(ModelStepBackendTest, OneHotDraftsAreVerifiedOnTheDeviceAsTheHostVerifiesThem) {
  std::unique_ptr<CpuForwardPass> host_pass = SmallCpuPass(*gguf_);
  ASSERT_NE(host_pass, nullptr);
  ModelStepBackend host(std::move(host_pass), "host");
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.num_logprobs = 0;
  const std::vector<int32_t> prompt = {4, 5, 6};
  // The greedy continuation of the prompt, so the first draft is accepted.
  const int32_t next = GreedyNext(host, prompt);
  ASSERT_GE(next, 0);
  for (const std::vector<int32_t>& drafts :
       {std::vector<int32_t>{next, 9, 9}, std::vector<int32_t>{(next + 1) % 24, 3}}) {
    std::vector<int32_t> emitted[2];
    std::vector<int32_t> picked[2];
    ASSERT_NO_FATAL_FAILURE(
        RunOnBothSides(host, *backend_, greedy, prompt, drafts, {}, picked, emitted));
    EXPECT_EQ(picked[1], picked[0]);
    EXPECT_EQ(emitted[1], emitted[0]);
    EXPECT_EQ(emitted[0][0], drafts[0] == next ? 2 : 1);  // next, then 9 is (almost) never
  }
  EXPECT_EQ(pass_->device_steps, 2);
  EXPECT_EQ(pass_->host_steps, 0);

  // A penalized sampler: the draft rows' penalties count the drafts before them.
  SamplingParams penalized;
  penalized.temperature = 0.7f;
  penalized.seed = 11;
  penalized.frequency_penalty = 0.5f;
  SequenceSampler sampler(penalized, prompt, 24);
  const std::vector<int32_t> drafts = {7, 7};
  std::vector<SampleRow> rows = {{1, &sampler, drafts, {}}};
  std::vector<SampledToken> tokens;
  std::vector<int32_t> emitted;
  BackendTimings timings;
  ASSERT_TRUE(
      backend_->Run(PromptWithDrafts(prompt, drafts, 4), rows, tokens, emitted, timings).ok());
  const DeviceSampleRows& sent = pass_->last_rows;
  EXPECT_EQ(sent.positions, (std::vector<int64_t>{3, 4, 5}));
  // No outputs yet: nothing for the first row, 7 once for the second, twice for the third.
  EXPECT_EQ(sent.penalty_indptr, (std::vector<int32_t>{0, 0, 1, 2}));
  EXPECT_EQ(sent.penalty_tokens, (std::vector<int32_t>{7, 7}));
  EXPECT_EQ(sent.penalty_counts, (std::vector<int32_t>{1, 2}));

  // A draft distribution with a non-greedy sampler that wants logprobs: the host verifies.
  std::vector<float> q(2 * 24, 1.0f / 24);
  SamplingParams with_logprobs = penalized;
  with_logprobs.num_logprobs = 0;
  SequenceSampler other(with_logprobs, prompt, 24);
  rows = {{1, &other, drafts, q}};
  ASSERT_TRUE(
      backend_->Run(PromptWithDrafts(prompt, drafts, 5), rows, tokens, emitted, timings).ok());
  EXPECT_EQ(pass_->host_steps, 1);
}

// A draft model's distributions under a sampler that samples (no logprobs): verified on the
// device (DeviceSampleRows::verifies, with the host's uniforms), emitting what the host's
// rejection sampling emits, over seeds and drafts the target likes and dislikes.
TEST_F(ModelStepBackendTest, DraftDistributionsAreVerifiedOnTheDeviceAsTheHostVerifiesThem) {
  std::unique_ptr<CpuForwardPass> host_pass = SmallCpuPass(*gguf_);
  ASSERT_NE(host_pass, nullptr);
  ModelStepBackend host(std::move(host_pass), "host");
  const std::vector<int32_t> prompt = {4, 5, 6};
  // The greedy continuation: a draft the target likes.
  const int32_t likely = GreedyNext(host, prompt);
  ASSERT_GE(likely, 0);
  int device_steps = 0;
  std::set<int32_t> emitted_counts;
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    SamplingParams params;
    params.temperature = seed % 2 == 0 ? 0.7f : 1.2f;
    params.top_p = seed % 3 == 0 ? 0.9f : 1.0f;
    params.seed = seed;
    const std::vector<int32_t> drafts = {seed % 2 == 0 ? likely : static_cast<int32_t>(seed % 24),
                                         9, 11};
    // The draft model's q: most of its mass on each draft.
    std::vector<float> q(drafts.size() * 24, 0.2f / 23);
    for (size_t i = 0; i < drafts.size(); ++i) q[i * 24 + drafts[i]] = 0.8f;
    std::vector<int32_t> emitted[2];
    std::vector<int32_t> picked[2];
    ASSERT_NO_FATAL_FAILURE(
        RunOnBothSides(host, *backend_, params, prompt, drafts, q, picked, emitted));
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    EXPECT_EQ(picked[1], picked[0]);
    EXPECT_EQ(emitted[1], emitted[0]);
    ASSERT_EQ(pass_->last_rows.verifies.size(), 1u);
    const DeviceSampleRows::DraftVerify& sent = pass_->last_rows.verifies[0];
    EXPECT_EQ(sent.first_row, 0);
    EXPECT_EQ(std::vector<int32_t>(sent.drafts.begin(), sent.drafts.end()), drafts);
    EXPECT_EQ(sent.accept_uniforms.size(), drafts.size() + 1);
    EXPECT_EQ(pass_->device_steps, ++device_steps);
    emitted_counts.insert(emitted[0][0]);
  }
  EXPECT_EQ(pass_->host_steps, 0);
  // Both ways out were taken: a first draft rejected (one token) and one accepted.
  EXPECT_TRUE(emitted_counts.contains(1));
  EXPECT_GT(*emitted_counts.rbegin(), 1);
}

}  // namespace
}  // namespace loom::worker
