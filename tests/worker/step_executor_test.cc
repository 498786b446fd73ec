#include "worker/step_executor.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cli/local_engine.h"
#include "common/formats/gguf_file.h"
#include "common/formats/model_config.h"
#include "common/status_macros.h"
#include "common/tokenizer/tokenizer.h"
#include "tests/test_paths.h"
#include "worker/cpu_forward_pass.h"
#include "worker/model_step_backend.h"
#include "worker/noop_backend.h"

namespace loom::worker {
namespace {

constexpr int64_t kNumBlocks = 64;
constexpr int64_t kBlockSize = 16;

std::string ModelPath() {
  return loom::test_env::ModelPath();
}

// A fixed 21-token prompt (SmolLM2 ids of an English sentence).
std::vector<int32_t> Prompt() {
  return {504, 3575,  282, 4649, 314,  7042, 30,   378, 3575, 282, 7493,
          314, 11657, 30,  378,  3575, 282,  3576, 314, 216,  1345};
}

loom::v1::NewSequence NewSequence(uint64_t seq_id, const std::vector<int32_t>& prompt,
                                  float temperature = 0.0f) {
  loom::v1::NewSequence added;
  added.set_seq_id(seq_id);
  added.mutable_prompt_token_ids()->Add(prompt.begin(), prompt.end());
  loom::v1::SamplingParams* sampling = added.mutable_sampling();
  sampling->set_temperature(temperature);
  sampling->set_top_k(0);
  sampling->set_top_p(1.0f);
  sampling->set_min_p(0.0f);
  sampling->set_repetition_penalty(1.0f);
  sampling->set_presence_penalty(0.0f);
  sampling->set_frequency_penalty(0.0f);
  sampling->set_seed(0);
  sampling->set_num_logprobs(-1);
  return added;
}

void Schedule(loom::v1::StepPlan& plan, uint64_t seq_id, int32_t num_tokens, bool sample,
              std::vector<int32_t> new_blocks = {}) {
  loom::v1::ScheduledSequence* entry = plan.add_scheduled();
  entry->set_seq_id(seq_id);
  entry->set_num_tokens(num_tokens);
  entry->set_sample(sample);
  entry->mutable_new_block_ids()->Add(new_blocks.begin(), new_blocks.end());
}

// A plan with the next step id of `executor_steps`.
loom::v1::StepPlan Plan(uint64_t& step_id) {
  loom::v1::StepPlan plan;
  plan.set_step_id(++step_id);
  return plan;
}

// ---------------------------------------------------------------------------------------
// Bookkeeping and validation, on the noop backend (no weights).

class StepExecutorNoopTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto gguf = common::GgufFile::Open(ModelPath());
    ASSERT_TRUE(gguf.ok()) << gguf.status();
    auto config = common::ModelConfigFromGguf(**gguf);
    ASSERT_TRUE(config.ok()) << config.status();
    backend_ =
        std::make_unique<NoopBackend>(*config, kNumBlocks, kBlockSize, std::vector<int32_t>{0, 2});
    executor_ = std::make_unique<StepExecutor>(*backend_);
  }

  // Adds `seq_id` with `prompt` and prefills it whole (sampling its first token).
  void AddAndPrefill(uint64_t seq_id, const std::vector<int32_t>& prompt,
                     std::vector<int32_t> blocks) {
    loom::v1::StepPlan plan = Plan(step_id_);
    *plan.add_added() = NewSequence(seq_id, prompt);
    Schedule(plan, seq_id, static_cast<int32_t>(prompt.size()), true, std::move(blocks));
    const loom::v1::StepResult result = executor_->Execute(plan);
    ASSERT_EQ(result.error_code(), 0) << result.error_message();
    ASSERT_EQ(result.outputs_size(), 1);
  }

  // Expects `plan` to be rejected with INVALID_ARGUMENT whose message contains `what`.
  void ExpectRejected(const loom::v1::StepPlan& plan, const std::string& what) {
    const loom::v1::StepResult result = executor_->Execute(plan);
    EXPECT_EQ(result.step_id(), plan.step_id());
    EXPECT_EQ(result.error_code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
    EXPECT_NE(result.error_message().find(what), std::string::npos) << result.error_message();
    EXPECT_EQ(result.outputs_size(), 0);
  }

  std::unique_ptr<NoopBackend> backend_;
  std::unique_ptr<KvHostTier> tier_;  // before executor_: it outlives the executor using it
  std::unique_ptr<StepExecutor> executor_;
  // Replaces the executor with one over a bookkeeping-only host tier of 4 slots.
  KvHostTier* UseHostTier() {
    tier_ = *KvHostTier::Create(4, nullptr, 1);
    StepExecutorOptions options;
    options.host_tier = tier_.get();
    executor_ = std::make_unique<StepExecutor>(*backend_, options);
    return tier_.get();
  }
  uint64_t step_id_ = 0;
};

void AddCopy(loom::v1::StepPlan& plan, bool to_host, int32_t block, int32_t slot) {
  loom::v1::KvBlockCopy* copy = plan.add_kv_copies();
  copy->set_direction(to_host ? loom::v1::KvBlockCopy::DEVICE_TO_HOST
                              : loom::v1::KvBlockCopy::HOST_TO_DEVICE);
  copy->set_device_block(block);
  copy->set_host_slot(slot);
}

TEST_F(StepExecutorNoopTest, RefusesKvCopiesWithoutAHostTierOrThatTheTierCannotRun) {
  loom::v1::StepPlan plan = Plan(step_id_);
  *plan.add_added() = NewSequence(5, {1, 2, 3});
  Schedule(plan, 5, 3, true, {0});
  AddCopy(plan, true, 1, 0);
  ExpectRejected(plan, "this worker has no host tier (--kv-offload-memory)");
  EXPECT_FALSE(executor_->HasSequence(5));  // the plan was all or nothing

  KvHostTier* const tier = UseHostTier();
  loom::v1::StepPlan unwritten = Plan(step_id_);
  *unwritten.add_added() = NewSequence(5, {1, 2, 3});
  Schedule(unwritten, 5, 3, true, {0});
  AddCopy(unwritten, false, 0, 2);
  ExpectRejected(unwritten, "host slot 2 holds no block");
  loom::v1::StepPlan out_of_range = Plan(step_id_);
  AddCopy(out_of_range, true, 1, 4);
  ExpectRejected(out_of_range, "host slot 4 is not in the host tier [0, 4)");

  // Offloaded by one plan, reloaded by a later one: both run.
  loom::v1::StepPlan offload = Plan(step_id_);
  AddCopy(offload, true, 1, 3);
  EXPECT_EQ(executor_->Execute(offload).error_code(), 0);
  loom::v1::StepPlan reload = Plan(step_id_);
  *reload.add_added() = NewSequence(6, {1, 2, 3});
  Schedule(reload, 6, 3, true, {2});
  AddCopy(reload, false, 2, 3);
  const loom::v1::StepResult result = executor_->Execute(reload);
  EXPECT_EQ(result.error_code(), 0) << result.error_message();
  EXPECT_EQ(result.outputs_size(), 1);
  EXPECT_EQ(tier->stats().blocks_to_host, 1);
  EXPECT_EQ(tier->stats().blocks_to_device, 1);
  EXPECT_FALSE(executor_->kv_copies_failed(offload.step_id(), reload.step_id()));
  EXPECT_TRUE(executor_->kv_copies_failed(out_of_range.step_id(), reload.step_id()));
  ASSERT_TRUE(executor_->Reset().ok());  // a new stream: its ids may start over
  EXPECT_FALSE(executor_->kv_copies_failed(0, reload.step_id()));
}

TEST_F(StepExecutorNoopTest, APlanClosesItsPushHoldsEvenWhenItIsRefused) {
  // The coordinator may give a closed hold's slots to other content once the plan came
  // back, refused or not: from then on a write naming the hold writes nothing.
  KvHostTier* const tier = UseHostTier();
  loom::v1::StepPlan plan = Plan(step_id_);
  plan.add_kv_push_holds_closed(41);
  AddCopy(plan, true, 1, 9);
  ExpectRejected(plan, "host slot 9 is not in the host tier");
  // Its copies never ran: a reader waiting for them is told so.
  EXPECT_TRUE(executor_->kv_copies_failed(plan.step_id(), plan.step_id()));
  const absl::Status late = tier->WriteSlot(0, 0, {}, {41, nullptr});
  EXPECT_EQ(late.code(), absl::StatusCode::kCancelled) << late;
  EXPECT_TRUE(tier->WriteSlot(0, 0, {}, {42, nullptr}).ok());
}

TEST_F(StepExecutorNoopTest, ReturnsOneOutputPerSampledSequenceInPlanOrder) {
  loom::v1::StepPlan plan = Plan(step_id_);
  *plan.add_added() = NewSequence(5, {1, 2, 3});
  *plan.add_added() = NewSequence(9, {4, 5, 6, 7});
  *plan.add_added() = NewSequence(3, {8, 9});
  Schedule(plan, 9, 4, true, {1});
  Schedule(plan, 5, 2, false, {0});  // a prefill chunk: no output
  Schedule(plan, 3, 2, true, {2});
  loom::v1::StepResult result = executor_->Execute(plan);
  ASSERT_EQ(result.error_code(), 0) << result.error_message();
  EXPECT_EQ(result.num_tokens(), 8);
  ASSERT_EQ(result.outputs_size(), 2);
  EXPECT_EQ(result.outputs(0).seq_id(), 9u);
  EXPECT_EQ(result.outputs(0).token_id(), backend_->TokenFor(9, 4));
  EXPECT_EQ(result.outputs(1).seq_id(), 3u);
  EXPECT_EQ(result.outputs(1).token_id(), backend_->TokenFor(3, 2));
  EXPECT_EQ(executor_->NumTokens(9), 5);
  EXPECT_EQ(executor_->NumComputed(5), 2);

  // Decodes carry no token ids: the worker computes the token it sampled.
  loom::v1::StepPlan decode = Plan(step_id_);
  Schedule(decode, 9, 1, true);
  Schedule(decode, 5, 1, true);
  Schedule(decode, 3, 1, true);
  result = executor_->Execute(decode);
  ASSERT_EQ(result.error_code(), 0) << result.error_message();
  ASSERT_EQ(result.outputs_size(), 3);
  EXPECT_EQ(result.outputs(0).token_id(), backend_->TokenFor(9, 5));
  EXPECT_EQ(result.outputs(1).token_id(), backend_->TokenFor(5, 3));
  EXPECT_EQ(executor_->NumComputed(9), 5);
  EXPECT_EQ(executor_->NumTokens(9), 6);
}

TEST_F(StepExecutorNoopTest, NeverPicksExcludedIds) {
  // 0 and 2 are excluded: seq 0 at position 0 would be token 0, at 2 token 2.
  EXPECT_EQ(backend_->TokenFor(0, 0), 1);
  EXPECT_EQ(backend_->TokenFor(0, 2), 3);
  EXPECT_EQ(backend_->TokenFor(0, 5), 5);
}

TEST_F(StepExecutorNoopTest, UnknownSequenceIsRejectedAndOnlyTheNamedSequencesAreDropped) {
  AddAndPrefill(1, {1, 2, 3}, {0});
  AddAndPrefill(2, {4, 5, 6}, {1});
  loom::v1::StepPlan plan = Plan(step_id_);
  Schedule(plan, 2, 1, true);
  Schedule(plan, 77, 1, true);
  ExpectRejected(plan, "unknown");
  EXPECT_FALSE(executor_->HasSequence(2));
  ASSERT_TRUE(executor_->HasSequence(1));
  EXPECT_EQ(executor_->NumComputed(1), 3);
  EXPECT_EQ(executor_->NumTokens(1), 4);

  loom::v1::StepPlan next = Plan(step_id_);
  Schedule(next, 1, 1, true);
  const loom::v1::StepResult result = executor_->Execute(next);
  ASSERT_EQ(result.error_code(), 0) << result.error_message();
  ASSERT_EQ(result.outputs_size(), 1);
  EXPECT_EQ(result.outputs(0).token_id(), backend_->TokenFor(1, 4));
}

TEST_F(StepExecutorNoopTest, RejectedPlanDropsSequencesWhoseNewBlocksItAlreadyTook) {
  AddAndPrefill(1, {1, 2, 3}, {0});
  AddAndPrefill(2, std::vector<int32_t>(16, 5), {1});
  // Sequence 2's 17th token needs a second block, given before the bad entry.
  loom::v1::StepPlan plan = Plan(step_id_);
  Schedule(plan, 2, 1, true, {4});
  Schedule(plan, 77, 1, true);
  ExpectRejected(plan, "unknown");
  EXPECT_FALSE(executor_->HasSequence(2));
  ASSERT_TRUE(executor_->HasSequence(1));

  // Re-added, sequence 2 starts from the blocks its new plan gives, nothing left over.
  loom::v1::StepPlan again = Plan(step_id_);
  *again.add_added() = NewSequence(2, std::vector<int32_t>(16, 5));
  Schedule(again, 2, 16, true, {6});
  loom::v1::StepResult result = executor_->Execute(again);
  ASSERT_EQ(result.error_code(), 0) << result.error_message();
  loom::v1::StepPlan next = Plan(step_id_);
  Schedule(next, 2, 1, true);  // position 16 needs a second block, and none was given
  ExpectRejected(next, "blocks");
}

TEST_F(StepExecutorNoopTest, AReusedResultCarriesOnlyItsOwnStep) {
  loom::v1::StepPlan plan = Plan(step_id_);
  *plan.add_added() = NewSequence(1, {1, 2, 3});
  *plan.add_added() = NewSequence(2, {4, 5});
  Schedule(plan, 1, 3, true, {0});
  Schedule(plan, 2, 2, true, {1});
  loom::v1::StepResult result;
  executor_->Execute(plan, result);
  ASSERT_EQ(result.error_code(), 0) << result.error_message();
  ASSERT_EQ(result.outputs_size(), 2);

  loom::v1::StepPlan bad = Plan(step_id_);
  Schedule(bad, 77, 1, true);
  executor_->Execute(bad, result);
  EXPECT_EQ(result.step_id(), bad.step_id());
  EXPECT_EQ(result.error_code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(result.outputs_size(), 0);

  loom::v1::StepPlan decode = Plan(step_id_);
  Schedule(decode, 2, 1, true);
  executor_->Execute(decode, result);
  EXPECT_EQ(result.step_id(), decode.step_id());
  EXPECT_EQ(result.error_code(), 0) << result.error_message();
  EXPECT_TRUE(result.error_message().empty());
  ASSERT_EQ(result.outputs_size(), 1);
  EXPECT_EQ(result.outputs(0).seq_id(), 2u);
  EXPECT_EQ(result.outputs(0).token_id(), backend_->TokenFor(2, 3));
  EXPECT_EQ(result.num_tokens(), 1);
}

TEST_F(StepExecutorNoopTest, BlockOutsideThePoolIsRejectedBeforeAnythingChanges) {
  AddAndPrefill(1, {1, 2, 3}, {0});
  loom::v1::StepPlan plan = Plan(step_id_);
  *plan.add_added() = NewSequence(2, {1, 2});
  Schedule(plan, 2, 2, true, {3});
  Schedule(plan, 1, 1, true, {kNumBlocks});
  ExpectRejected(plan, "KV pool");
  EXPECT_FALSE(executor_->HasSequence(1));  // named by the plan
  EXPECT_FALSE(executor_->HasSequence(2));  // its addition was not applied
  EXPECT_EQ(executor_->num_sequences(), 0);

  loom::v1::StepPlan negative = Plan(step_id_);
  *negative.add_added() = NewSequence(3, {1, 2});
  Schedule(negative, 3, 2, true, {-1});
  ExpectRejected(negative, "KV pool");
}

TEST_F(StepExecutorNoopTest, ComputingPastTheKnownTokensIsRejected) {
  AddAndPrefill(1, {1, 2, 3}, {0});
  AddAndPrefill(2, {1, 2, 3}, {1});
  loom::v1::StepPlan plan = Plan(step_id_);
  Schedule(plan, 1, 2, true);  // 3 computed, 4 known: only 1 more
  ExpectRejected(plan, "past the 4 tokens");
  EXPECT_EQ(executor_->NumComputed(2), 3);

  loom::v1::StepPlan chunk = Plan(step_id_);
  *chunk.add_added() = NewSequence(4, {1, 2, 3, 4, 5});
  Schedule(chunk, 4, 3, true, {2});  // sampling in the middle of the prompt
  ExpectRejected(chunk, "sampling after token 3");
  EXPECT_TRUE(executor_->HasSequence(2));
}

TEST_F(StepExecutorNoopTest, RejectsBadAdditions) {
  loom::v1::StepPlan empty = Plan(step_id_);
  *empty.add_added() = NewSequence(1, {});
  ExpectRejected(empty, "empty prompt");

  loom::v1::StepPlan out_of_vocab = Plan(step_id_);
  *out_of_vocab.add_added() =
      NewSequence(1, {1, static_cast<int32_t>(backend_->config().vocab_size)});
  ExpectRejected(out_of_vocab, "vocabulary");

  loom::v1::StepPlan bad_sampling = Plan(step_id_);
  *bad_sampling.add_added() = NewSequence(1, {1});
  bad_sampling.mutable_added(0)->mutable_sampling()->set_top_p(0.0f);
  ExpectRejected(bad_sampling, "top_p");

  AddAndPrefill(1, {1, 2}, {0});
  loom::v1::StepPlan duplicate = Plan(step_id_);
  *duplicate.add_added() = NewSequence(1, {1});
  ExpectRejected(duplicate, "already holds");

  loom::v1::StepPlan zero_tokens = Plan(step_id_);
  *zero_tokens.add_added() = NewSequence(2, {1});
  Schedule(zero_tokens, 2, 0, true, {1});
  ExpectRejected(zero_tokens, "num_tokens");

  loom::v1::StepPlan twice = Plan(step_id_);
  *twice.add_added() = NewSequence(3, {1, 2});
  Schedule(twice, 3, 1, false, {2});
  Schedule(twice, 3, 1, true);
  ExpectRejected(twice, "twice");
}

TEST_F(StepExecutorNoopTest, StepIdsMustIncrease) {
  AddAndPrefill(1, {1, 2}, {0});
  loom::v1::StepPlan stale;
  stale.set_step_id(step_id_);
  Schedule(stale, 1, 1, true);
  ExpectRejected(stale, "strictly increase");
  ASSERT_TRUE(executor_->Reset().ok());
  EXPECT_EQ(executor_->num_sequences(), 0);
  loom::v1::StepPlan fresh;  // a new stream may start over
  fresh.set_step_id(1);
  *fresh.add_added() = NewSequence(1, {1, 2});
  Schedule(fresh, 1, 2, true, {0});
  EXPECT_EQ(executor_->Execute(fresh).error_code(), 0);
}

TEST_F(StepExecutorNoopTest, FinishedAndPreemptedReleaseState) {
  AddAndPrefill(1, {1, 2, 3}, {0});
  AddAndPrefill(2, {4, 5, 6}, {1});
  AddAndPrefill(3, {7, 8, 9}, {2});
  loom::v1::StepPlan plan = Plan(step_id_);
  plan.add_finished(1);
  plan.add_preempted(2);
  plan.add_finished(12345);  // unknown ids are ignored
  Schedule(plan, 3, 1, true);
  loom::v1::StepResult result = executor_->Execute(plan);
  ASSERT_EQ(result.error_code(), 0) << result.error_message();
  EXPECT_EQ(executor_->num_sequences(), 1);
  EXPECT_FALSE(executor_->HasSequence(1));
  EXPECT_FALSE(executor_->HasSequence(2));

  loom::v1::StepPlan released = Plan(step_id_);
  Schedule(released, 1, 1, true);
  ExpectRejected(released, "unknown");

  // The preempted sequence comes back with its output so far; it recomputes all of it.
  loom::v1::StepPlan resumed = Plan(step_id_);
  loom::v1::NewSequence again = NewSequence(2, {4, 5, 6});
  again.add_output_token_ids(backend_->TokenFor(2, 3));
  *resumed.add_added() = again;
  Schedule(resumed, 2, 4, true, {5});
  result = executor_->Execute(resumed);
  ASSERT_EQ(result.error_code(), 0) << result.error_message();
  ASSERT_EQ(result.outputs_size(), 1);
  EXPECT_EQ(result.outputs(0).token_id(), backend_->TokenFor(2, 4));
  EXPECT_EQ(executor_->NumTokens(2), 5);

  // Released and re-added in the same plan: a fresh sequence.
  loom::v1::StepPlan replaced = Plan(step_id_);
  replaced.add_finished(3);
  *replaced.add_added() = NewSequence(3, {1});
  Schedule(replaced, 3, 1, true, {6});
  result = executor_->Execute(replaced);
  ASSERT_EQ(result.error_code(), 0) << result.error_message();
  EXPECT_EQ(executor_->NumTokens(3), 2);
}

TEST_F(StepExecutorNoopTest, CachedTokensStartTheComputedCount) {
  loom::v1::StepPlan plan = Plan(step_id_);
  loom::v1::NewSequence added = NewSequence(7, std::vector<int32_t>(20, 5));
  added.set_num_cached_tokens(16);
  *plan.add_added() = added;
  // Blocks 3 (cached: tokens 0-15) and 8 (tokens 16-19): only 4 tokens left to compute.
  Schedule(plan, 7, 4, true, {3, 8});
  const loom::v1::StepResult result = executor_->Execute(plan);
  ASSERT_EQ(result.error_code(), 0) << result.error_message();
  EXPECT_EQ(result.num_tokens(), 4);
  ASSERT_EQ(result.outputs_size(), 1);
  EXPECT_EQ(executor_->NumComputed(7), 20);
  EXPECT_EQ(executor_->NumTokens(7), 21);
}

TEST_F(StepExecutorNoopTest, ComputingMoreThanTheUncachedTokensIsRejected) {
  loom::v1::StepPlan plan = Plan(step_id_);
  loom::v1::NewSequence added = NewSequence(7, std::vector<int32_t>(20, 5));
  added.set_num_cached_tokens(16);
  *plan.add_added() = added;
  Schedule(plan, 7, 20, true, {3, 8});
  ExpectRejected(plan, "runs past");
}

TEST_F(StepExecutorNoopTest, RejectsCachedTokensThatLeaveNothingToCompute) {
  loom::v1::StepPlan all = Plan(step_id_);
  loom::v1::NewSequence added = NewSequence(7, std::vector<int32_t>(16, 5));
  added.set_num_cached_tokens(16);
  *all.add_added() = added;
  Schedule(all, 7, 1, true, {3});
  ExpectRejected(all, "num_cached_tokens is 16");

  loom::v1::StepPlan negative = Plan(step_id_);
  added.set_num_cached_tokens(-1);
  *negative.add_added() = added;
  Schedule(negative, 7, 16, true, {3});
  ExpectRejected(negative, "num_cached_tokens is -1");
  EXPECT_EQ(executor_->num_sequences(), 0);
}

TEST_F(StepExecutorNoopTest, RejectsPromptScoringOutsideTheComputedPrompt) {
  loom::v1::NewSequence added = NewSequence(7, std::vector<int32_t>(20, 5));
  for (const auto& [from, cached] : std::vector<std::pair<int32_t, int32_t>>{
           {20, 0}, {-1, 0}, {16, 16}, {3, 4}}) {
    loom::v1::StepPlan plan = Plan(step_id_);
    added.set_score_prompt_from(from);
    added.set_num_cached_tokens(cached);
    *plan.add_added() = added;
    Schedule(plan, 7, 20 - cached, true, {3, 4});
    ExpectRejected(plan, "score_prompt_from is " + std::to_string(from));
  }
  // Valid, but the noop backend cannot score: the step fails and names why.
  loom::v1::StepPlan plan = Plan(step_id_);
  added.set_score_prompt_from(1);
  added.set_num_cached_tokens(0);
  *plan.add_added() = added;
  Schedule(plan, 7, 20, true, {3, 4});
  const loom::v1::StepResult result = executor_->Execute(plan);
  EXPECT_EQ(result.error_code(), static_cast<int>(absl::StatusCode::kUnimplemented));
  EXPECT_NE(result.error_message().find("noop backend cannot score prompts"), std::string::npos)
      << result.error_message();
  EXPECT_EQ(executor_->num_sequences(), 0);
}

// ---------------------------------------------------------------------------------------
// Progress for the heartbeat, and the test-only delay and hang.

TEST_F(StepExecutorNoopTest, EveryStepCountsItsStartAndEndAsProgressEvenWhenRejected) {
  StepProgress progress;
  StepExecutorOptions options;
  options.progress = &progress;
  StepExecutor executor(*backend_, options);
  loom::v1::StepPlan plan = Plan(step_id_);
  *plan.add_added() = NewSequence(1, {1, 2, 3});
  Schedule(plan, 1, 3, true, {0});
  ASSERT_EQ(executor.Execute(plan).error_code(), 0);
  loom::v1::StepProgress snapshot = progress.Snapshot();
  EXPECT_EQ(snapshot.step_id(), plan.step_id());
  EXPECT_FALSE(snapshot.running());
  EXPECT_EQ(snapshot.units_done(), 2u);
  EXPECT_EQ(snapshot.steps_started(), 1u);

  loom::v1::StepPlan bad = Plan(step_id_);
  Schedule(bad, 77, 1, true);  // unknown sequence
  EXPECT_NE(executor.Execute(bad).error_code(), 0);
  snapshot = progress.Snapshot();
  EXPECT_FALSE(snapshot.running());
  EXPECT_EQ(snapshot.units_done(), 4u);
  EXPECT_EQ(snapshot.steps_started(), 2u);
}

TEST_F(StepExecutorNoopTest, DebugDelayReportsProgressWhileItSleeps) {
  StepProgress progress;
  StepExecutorOptions options;
  options.progress = &progress;
  options.debug_step_delay_ms = 100;  // five 20 ms slices, one unit each
  StepExecutor executor(*backend_, options);
  loom::v1::StepPlan plan = Plan(step_id_);
  *plan.add_added() = NewSequence(1, {1, 2, 3});
  Schedule(plan, 1, 3, true, {0});
  const auto start = std::chrono::steady_clock::now();
  ASSERT_EQ(executor.Execute(plan).error_code(), 0);
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(100));
  EXPECT_EQ(progress.Snapshot().units_done(), 2u + 5u);
}

TEST_F(StepExecutorNoopTest, DebugHangStopsProgressUntilReleased) {
  StepProgress progress;
  StepExecutorOptions options;
  options.progress = &progress;
  options.debug_hang_at_step = 2;
  StepExecutor executor(*backend_, options);
  loom::v1::StepPlan first = Plan(step_id_);
  *first.add_added() = NewSequence(1, {1, 2, 3});
  Schedule(first, 1, 3, true, {0});
  ASSERT_EQ(executor.Execute(first).error_code(), 0);

  loom::v1::StepPlan second = Plan(step_id_);
  Schedule(second, 1, 1, true);
  loom::v1::StepResult result;
  std::thread stepping([&] { executor.Execute(second, result); });
  // The hung step has started (running, its start counted) and then nothing moves.
  while (progress.Snapshot().steps_started() < 2) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const loom::v1::StepProgress hung = progress.Snapshot();
  EXPECT_TRUE(hung.running());
  EXPECT_EQ(hung.step_id(), second.step_id());
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(progress.Snapshot().units_done(), hung.units_done());
  executor.ReleaseDebugHang();
  stepping.join();
  EXPECT_EQ(result.error_code(), 0) << result.error_message();
  EXPECT_FALSE(progress.Snapshot().running());
}

// ---------------------------------------------------------------------------------------
// Pipeline parallelism: plans that name their input tokens, and a stage that samples nothing.

TEST_F(StepExecutorNoopTest, InputTokensAreCheckedWhenKnownAndLearnedWhenNew) {
  // A prompt computed without sampling: the worker knows 3 tokens.
  loom::v1::StepPlan prefill = Plan(step_id_);
  *prefill.add_added() = NewSequence(4, {1, 2, 3});
  Schedule(prefill, 4, 3, false, {0});
  ASSERT_EQ(executor_->Execute(prefill).error_code(), 0);
  EXPECT_EQ(executor_->NumTokens(4), 3);

  // The replica sampled token 42 elsewhere: the plan names it and the worker learns it.
  loom::v1::StepPlan decode = Plan(step_id_);
  Schedule(decode, 4, 1, true);
  decode.mutable_scheduled(0)->add_input_token_ids(42);
  loom::v1::StepResult result = executor_->Execute(decode);
  ASSERT_EQ(result.error_code(), 0) << result.error_message();
  EXPECT_EQ(executor_->NumTokens(4), 5);  // 42, then the token it sampled
  ASSERT_EQ(result.outputs_size(), 1);
  const int32_t sampled = result.outputs(0).token_id();

  // A token the worker knows must be the one named.
  loom::v1::StepPlan wrong = Plan(step_id_);
  Schedule(wrong, 4, 1, true);
  wrong.mutable_scheduled(0)->add_input_token_ids(sampled + 1);
  ExpectRejected(wrong, "but the worker has");
  // (The rejected plan dropped the sequence; a fresh one shows the gap check.)
  loom::v1::StepPlan again = Plan(step_id_);
  *again.add_added() = NewSequence(6, {1, 2, 3});
  Schedule(again, 6, 2, false, {1});
  ASSERT_EQ(executor_->Execute(again).error_code(), 0);
  loom::v1::StepPlan gap = Plan(step_id_);
  Schedule(gap, 6, 3, false);
  gap.mutable_scheduled(0)->add_input_token_ids(7);  // position 4, but 3 tokens are known
  ExpectRejected(gap, "but the worker knows 3 tokens");
  loom::v1::StepPlan too_many = Plan(step_id_);
  *too_many.add_added() = NewSequence(8, {1, 2});
  Schedule(too_many, 8, 1, false, {2});
  too_many.mutable_scheduled(0)->add_input_token_ids(1);
  too_many.mutable_scheduled(0)->add_input_token_ids(2);
  ExpectRejected(too_many, "2 input token ids for a step of 1 tokens");
}

// A pipeline stage before the last: computes (here: validates) and emits nothing, and
// passes a failed plan on through SkipStep.
class NonSamplingStage : public NoopBackend {
 public:
  using NoopBackend::NoopBackend;
  bool samples() const override { return false; }
  absl::Status Run(const StepBatch& batch, absl::Span<const SampleRow> rows,
                   std::vector<SampledToken>& tokens, std::vector<int32_t>& num_emitted,
                   BackendTimings& timings) override {
    LOOM_RETURN_IF_ERROR(NoopBackend::Run(batch, rows, tokens, num_emitted, timings));
    step_ids.push_back(batch.step_id);
    tokens.clear();
    num_emitted.clear();
    return absl::OkStatus();
  }
  void SkipStep(uint64_t step_id, const absl::Status& why) override {
    skipped.emplace_back(step_id, std::string(why.message()));
  }
  std::vector<uint64_t> step_ids;
  std::vector<std::pair<uint64_t, std::string>> skipped;
};

TEST(StepExecutorStageTest, AStageBeforeTheLastCommitsItsTokensWithoutOutputs) {
  auto gguf = common::GgufFile::Open(ModelPath());
  ASSERT_TRUE(gguf.ok()) << gguf.status();
  auto config = common::ModelConfigFromGguf(**gguf);
  ASSERT_TRUE(config.ok()) << config.status();
  NonSamplingStage stage(*config, kNumBlocks, kBlockSize, {});
  StepExecutor executor(stage);
  uint64_t step_id = 0;
  loom::v1::StepPlan prefill = Plan(step_id);
  *prefill.add_added() = NewSequence(1, Prompt());
  Schedule(prefill, 1, static_cast<int32_t>(Prompt().size()), true, {0, 1});
  loom::v1::StepResult result = executor.Execute(prefill);
  ASSERT_EQ(result.error_code(), 0) << result.error_message();
  EXPECT_EQ(result.outputs_size(), 0);
  EXPECT_EQ(result.num_tokens(), static_cast<int32_t>(Prompt().size()));
  EXPECT_EQ(executor.NumComputed(1), static_cast<int64_t>(Prompt().size()));
  EXPECT_EQ(executor.NumTokens(1), static_cast<int64_t>(Prompt().size()));  // sampled elsewhere

  // The next decode names the token the last stage sampled.
  loom::v1::StepPlan decode = Plan(step_id);
  Schedule(decode, 1, 1, true);
  decode.mutable_scheduled(0)->add_input_token_ids(77);
  result = executor.Execute(decode);
  ASSERT_EQ(result.error_code(), 0) << result.error_message();
  EXPECT_EQ(result.outputs_size(), 0);
  EXPECT_EQ(executor.NumTokens(1), static_cast<int64_t>(Prompt().size()) + 1);
  EXPECT_EQ(stage.step_ids, (std::vector<uint64_t>{1, 2}));

  // Without the token the plan fails here, and the stage passes the failure on; a plan
  // that schedules nothing is no message at all.
  loom::v1::StepPlan missing = Plan(step_id);
  Schedule(missing, 1, 1, true);
  EXPECT_NE(executor.Execute(missing).error_code(), 0);
  ASSERT_EQ(stage.skipped.size(), 1u);
  EXPECT_EQ(stage.skipped[0].first, 3u);
  EXPECT_NE(stage.skipped[0].second.find("runs past"), std::string::npos);
  loom::v1::StepPlan empty = Plan(step_id);
  empty.add_finished(1);
  EXPECT_EQ(executor.Execute(empty).error_code(), 0);
  EXPECT_EQ(stage.skipped.size(), 1u);
}

// ---------------------------------------------------------------------------------------
// The real model.

class StepExecutorModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto gguf = common::GgufFile::Open(ModelPath());
    ASSERT_TRUE(gguf.ok()) << gguf.status();
    CpuForwardPassOptions options;
    options.num_threads = 2;
    options.num_kv_blocks = kNumBlocks;
    options.block_size = kBlockSize;
    auto forward_pass = CpuForwardPass::Create(**gguf, options);
    ASSERT_TRUE(forward_pass.ok()) << forward_pass.status();
    auto tokenizer = common::Tokenizer::FromGguf(**gguf);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_ = tokenizer->release();
    backend_ = new ModelStepBackend(std::move(*forward_pass));
  }
  static void TearDownTestSuite() {
    delete backend_;
    backend_ = nullptr;
    delete tokenizer_;
    tokenizer_ = nullptr;
  }
  void SetUp() override {
    if (backend_ == nullptr) GTEST_SKIP() << "model not loaded";
  }

  // The serving engine's tokens for `prompt` (the reference): its scheduler prefills the
  // 21 tokens in one step, in its own blocks.
  static std::vector<int32_t> Reference(const std::vector<int32_t>& prompt, int max_tokens,
                                        SamplingParams sampling) {
    // The engine borrows the same backend; its blocks are overwritten by later steps.
    cli::LocalEngine engine(*backend_, *tokenizer_);
    cli::EngineRequest request;
    request.prompt_ids = prompt;
    request.max_tokens = max_tokens;
    request.sampling = sampling;
    request.ignore_eos = true;
    auto results = engine.Generate({request});
    EXPECT_TRUE(results.ok()) << results.status();
    return results.ok() ? (*results)[0].token_ids() : std::vector<int32_t>{};
  }

  static ModelStepBackend* backend_;
  static common::Tokenizer* tokenizer_;
};

ModelStepBackend* StepExecutorModelTest::backend_ = nullptr;
common::Tokenizer* StepExecutorModelTest::tokenizer_ = nullptr;

TEST_F(StepExecutorModelTest, ChunkedPrefillThenDecodesMatchOnePrefill) {
  const std::vector<int32_t> prompt = Prompt();
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  const std::vector<int32_t> expected = Reference(prompt, 4, greedy);
  ASSERT_EQ(expected.size(), 4u);

  StepExecutor executor(*backend_);
  uint64_t step_id = 100;
  // Chunk 1: 12 of 21 prompt tokens in block 9; chunk 2: the other 9, block 4 appended.
  loom::v1::StepPlan first = Plan(step_id);
  *first.add_added() = NewSequence(42, prompt);
  first.mutable_added(0)->mutable_sampling()->set_num_logprobs(2);
  Schedule(first, 42, 12, false, {9});
  loom::v1::StepResult result = executor.Execute(first);
  ASSERT_EQ(result.error_code(), 0) << result.error_message();
  EXPECT_EQ(result.outputs_size(), 0);
  EXPECT_EQ(result.num_tokens(), 12);

  loom::v1::StepPlan second = Plan(step_id);
  Schedule(second, 42, 9, true, {4});
  result = executor.Execute(second);
  ASSERT_EQ(result.error_code(), 0) << result.error_message();
  ASSERT_EQ(result.outputs_size(), 1);
  std::vector<int32_t> tokens = {result.outputs(0).token_id()};
  EXPECT_LT(result.outputs(0).logprob(), 0.0f);
  ASSERT_EQ(result.outputs(0).top_logprobs_size(), 2);
  EXPECT_EQ(result.outputs(0).top_logprobs(0).token_id(), tokens[0]);  // greedy
  EXPECT_GT(result.timings().execute_seconds(), 0.0);

  for (int i = 0; i < 3; ++i) {
    loom::v1::StepPlan decode = Plan(step_id);
    Schedule(decode, 42, 1, true);  // 21 + i + 1 <= 32 tokens: blocks 9 and 4 suffice
    result = executor.Execute(decode);
    ASSERT_EQ(result.error_code(), 0) << result.error_message();
    ASSERT_EQ(result.outputs_size(), 1);
    EXPECT_EQ(result.num_tokens(), 1);
    tokens.push_back(result.outputs(0).token_id());
  }
  EXPECT_EQ(tokens, expected);
}

TEST_F(StepExecutorModelTest, TheForwardPassCountsTwoUnitsPerLayer) {
  auto gguf = common::GgufFile::Open(ModelPath());
  ASSERT_TRUE(gguf.ok()) << gguf.status();
  StepProgress progress;
  CpuForwardPassOptions options;
  options.num_threads = 1;
  options.num_kv_blocks = 4;
  options.block_size = kBlockSize;
  options.progress = &progress;
  auto forward_pass = CpuForwardPass::Create(**gguf, options);
  ASSERT_TRUE(forward_pass.ok()) << forward_pass.status();
  const int64_t num_layers = (*forward_pass)->config().num_layers;
  ModelStepBackend backend(std::move(*forward_pass));
  StepExecutorOptions executor_options;
  executor_options.progress = &progress;
  StepExecutor executor(backend, executor_options);
  uint64_t step_id = 0;
  loom::v1::StepPlan plan = Plan(step_id);
  *plan.add_added() = NewSequence(1, Prompt());
  Schedule(plan, 1, static_cast<int32_t>(Prompt().size()), true, {0, 1});
  ASSERT_EQ(executor.Execute(plan).error_code(), 0);
  EXPECT_EQ(progress.units_done(), static_cast<uint64_t>(2 + 2 * num_layers));
}

TEST_F(StepExecutorModelTest, RejectedPlanLeavesOtherSequencesRunning) {
  const std::vector<int32_t> prompt = Prompt();
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  const std::vector<int32_t> expected = Reference(prompt, 3, greedy);

  StepExecutor executor(*backend_);
  uint64_t step_id = 0;
  loom::v1::StepPlan prefill = Plan(step_id);
  *prefill.add_added() = NewSequence(1, prompt);
  *prefill.add_added() = NewSequence(2, {1, 2, 3});
  Schedule(prefill, 1, static_cast<int32_t>(prompt.size()), true, {0, 1});
  Schedule(prefill, 2, 3, true, {2});
  loom::v1::StepResult result = executor.Execute(prefill);
  ASSERT_EQ(result.error_code(), 0) << result.error_message();
  std::vector<int32_t> tokens = {result.outputs(0).token_id()};

  loom::v1::StepPlan bad = Plan(step_id);
  Schedule(bad, 2, 1, true, {kNumBlocks + 5});
  result = executor.Execute(bad);
  EXPECT_NE(result.error_code(), 0);
  EXPECT_EQ(result.outputs_size(), 0);

  for (int i = 0; i < 2; ++i) {
    loom::v1::StepPlan decode = Plan(step_id);
    Schedule(decode, 1, 1, true);
    result = executor.Execute(decode);
    ASSERT_EQ(result.error_code(), 0) << result.error_message();
    tokens.push_back(result.outputs(0).token_id());
  }
  EXPECT_EQ(tokens, expected);
}

TEST_F(StepExecutorModelTest, ScoresEachPromptPositionOnceAcrossChunks) {
  const std::vector<int32_t> prompt = Prompt();
  StepExecutor executor(*backend_);
  uint64_t step_id = 0;
  // Chunk 1 computes positions 0-11 (scored from token 5: positions 4-11), chunk 2 the
  // rest (positions 12-19 predict tokens 13-20; position 20 is sampled, not scored).
  loom::v1::StepPlan first = Plan(step_id);
  *first.add_added() = NewSequence(3, prompt);
  first.mutable_added(0)->set_score_prompt_from(5);
  Schedule(first, 3, 12, false, {0});
  loom::v1::StepResult result = executor.Execute(first);
  ASSERT_EQ(result.error_code(), 0) << result.error_message();
  ASSERT_EQ(result.prompt_logprobs_size(), 1);
  EXPECT_EQ(result.prompt_logprobs(0).seq_id(), 3u);
  EXPECT_EQ(result.prompt_logprobs(0).first_token(), 5);
  std::vector<double> scores(result.prompt_logprobs(0).logprobs().begin(),
                             result.prompt_logprobs(0).logprobs().end());
  EXPECT_EQ(scores.size(), 8u);

  loom::v1::StepPlan second = Plan(step_id);
  Schedule(second, 3, 9, true, {1});
  result = executor.Execute(second);
  ASSERT_EQ(result.error_code(), 0) << result.error_message();
  ASSERT_EQ(result.outputs_size(), 1);
  ASSERT_EQ(result.prompt_logprobs_size(), 1);
  EXPECT_EQ(result.prompt_logprobs(0).first_token(), 13);
  scores.insert(scores.end(), result.prompt_logprobs(0).logprobs().begin(),
                result.prompt_logprobs(0).logprobs().end());
  ASSERT_EQ(scores.size(), prompt.size() - 5);
  for (double logprob : scores) {
    EXPECT_LT(logprob, 0.0);
    EXPECT_GT(logprob, -40.0);
  }
  // A decode scores nothing.
  loom::v1::StepPlan decode = Plan(step_id);
  Schedule(decode, 3, 1, true);
  result = executor.Execute(decode);
  ASSERT_EQ(result.error_code(), 0) << result.error_message();
  EXPECT_EQ(result.prompt_logprobs_size(), 0);
}

TEST_F(StepExecutorModelTest, ScoresWithRanksAndTheMostLikelyTokens) {
  const std::vector<int32_t> prompt = Prompt();
  StepExecutor executor(*backend_);
  uint64_t step_id = 0;
  loom::v1::StepPlan plan = Plan(step_id);
  *plan.add_added() = NewSequence(4, prompt);
  plan.mutable_added(0)->set_score_prompt_from(1);
  plan.mutable_added(0)->set_score_prompt_top(3);
  Schedule(plan, 4, static_cast<int32_t>(prompt.size()), true, {0, 1});
  loom::v1::StepResult result = executor.Execute(plan);
  ASSERT_EQ(result.error_code(), 0) << result.error_message();
  ASSERT_EQ(result.prompt_logprobs_size(), 1);
  const loom::v1::PromptLogprobs& scored = result.prompt_logprobs(0);
  const int n = scored.logprobs_size();
  ASSERT_EQ(n, static_cast<int>(prompt.size()) - 1);
  ASSERT_EQ(scored.ranks_size(), n);
  ASSERT_EQ(scored.top_logprobs_size(), 3 * n);
  for (int i = 0; i < n; ++i) {
    const float best = scored.top_logprobs(3 * i).logprob();
    EXPECT_GE(best, scored.top_logprobs(3 * i + 1).logprob());
    EXPECT_GE(scored.top_logprobs(3 * i + 1).logprob(), scored.top_logprobs(3 * i + 2).logprob());
    EXPECT_LE(scored.logprobs(i), best + 1e-4);
    // The token is listed among the top 3 exactly when its rank says so, with its score.
    const int32_t token = prompt[i + 1];
    int listed = -1;
    for (int k = 0; k < 3; ++k) {
      if (scored.top_logprobs(3 * i + k).token_id() == token) listed = k;
    }
    EXPECT_EQ(listed >= 0, scored.ranks(i) <= 3) << i;
    if (listed >= 0) {
      EXPECT_EQ(scored.ranks(i), listed + 1) << i;
      EXPECT_NEAR(scored.top_logprobs(3 * i + listed).logprob(), scored.logprobs(i), 1e-4);
    }
  }
  // More alternatives than the API allows are refused when the sequence is added.
  loom::v1::StepPlan greedy = Plan(step_id);
  *greedy.add_added() = NewSequence(5, prompt);
  greedy.mutable_added(0)->set_score_prompt_from(1);
  greedy.mutable_added(0)->set_score_prompt_top(21);
  Schedule(greedy, 5, static_cast<int32_t>(prompt.size()), true, {2, 3});
  result = executor.Execute(greedy);
  EXPECT_NE(result.error_code(), 0);
  EXPECT_NE(result.error_message().find("score_prompt_top"), std::string::npos);
}

TEST_F(StepExecutorModelTest, PreemptedSequenceResumesWithTheSameSeededSamples) {
  const std::vector<int32_t> prompt = Prompt();
  SamplingParams sampling;
  sampling.temperature = 0.8f;
  sampling.seed = 1234;
  sampling.frequency_penalty = 0.5f;
  const std::vector<int32_t> expected = Reference(prompt, 4, sampling);
  ASSERT_EQ(expected.size(), 4u);

  auto new_sequence = [&](const std::vector<int32_t>& outputs) {
    loom::v1::NewSequence added = NewSequence(8, prompt, 0.8f);
    added.mutable_sampling()->set_seed(1234);
    added.mutable_sampling()->set_frequency_penalty(0.5f);
    added.mutable_output_token_ids()->Add(outputs.begin(), outputs.end());
    return added;
  };
  StepExecutor executor(*backend_);
  uint64_t step_id = 0;
  loom::v1::StepPlan prefill = Plan(step_id);
  *prefill.add_added() = new_sequence({});
  Schedule(prefill, 8, static_cast<int32_t>(prompt.size()), true, {10, 11});
  loom::v1::StepResult result = executor.Execute(prefill);
  ASSERT_EQ(result.error_code(), 0) << result.error_message();
  std::vector<int32_t> tokens = {result.outputs(0).token_id()};
  loom::v1::StepPlan decode = Plan(step_id);
  Schedule(decode, 8, 1, true);
  result = executor.Execute(decode);
  ASSERT_EQ(result.error_code(), 0) << result.error_message();
  tokens.push_back(result.outputs(0).token_id());

  // Preempted, then back with its two outputs: recomputed in other blocks.
  loom::v1::StepPlan preempt = Plan(step_id);
  preempt.add_preempted(8);
  ASSERT_EQ(executor.Execute(preempt).error_code(), 0);
  EXPECT_EQ(executor.num_sequences(), 0);
  loom::v1::StepPlan resume = Plan(step_id);
  *resume.add_added() = new_sequence(tokens);
  Schedule(resume, 8, static_cast<int32_t>(prompt.size() + tokens.size()), true, {20, 21});
  result = executor.Execute(resume);
  ASSERT_EQ(result.error_code(), 0) << result.error_message();
  tokens.push_back(result.outputs(0).token_id());
  decode = Plan(step_id);
  Schedule(decode, 8, 1, true);
  result = executor.Execute(decode);
  ASSERT_EQ(result.error_code(), 0) << result.error_message();
  tokens.push_back(result.outputs(0).token_id());
  EXPECT_EQ(tokens, expected);
}

TEST_F(StepExecutorModelTest, SequenceStartingFromCachedBlocksSamplesLikeAFullPrefill) {
  // Seeded sampling with penalties: the penalties count the prompt and the RNG is per
  // sequence, so starting at a cached offset must change nothing.
  const std::vector<int32_t> prompt = Prompt();  // 21 tokens: block 0 full, 5 in block 1
  SamplingParams sampling;
  sampling.temperature = 0.8f;
  sampling.seed = 77;
  sampling.presence_penalty = 0.7f;
  const std::vector<int32_t> expected = Reference(prompt, 3, sampling);
  ASSERT_EQ(expected.size(), 3u);
  auto new_sequence = [&](uint64_t seq_id, int32_t num_cached) {
    loom::v1::NewSequence added = NewSequence(seq_id, prompt, 0.8f);
    added.mutable_sampling()->set_seed(77);
    added.mutable_sampling()->set_presence_penalty(0.7f);
    added.set_num_cached_tokens(num_cached);
    return added;
  };

  StepExecutor executor(*backend_);
  uint64_t step_id = 0;
  // Sequence 1 computes the whole prompt into blocks 30 and 31.
  loom::v1::StepPlan first = Plan(step_id);
  *first.add_added() = new_sequence(1, 0);
  Schedule(first, 1, static_cast<int32_t>(prompt.size()), true, {30, 31});
  ASSERT_EQ(executor.Execute(first).error_code(), 0);
  // Sequence 2 shares block 30 (tokens 0-15) and computes only tokens 16-20 into block 40.
  loom::v1::StepPlan second = Plan(step_id);
  second.add_finished(1);
  *second.add_added() = new_sequence(2, 16);
  Schedule(second, 2, static_cast<int32_t>(prompt.size()) - 16, true, {30, 40});
  loom::v1::StepResult result = executor.Execute(second);
  ASSERT_EQ(result.error_code(), 0) << result.error_message();
  EXPECT_EQ(result.num_tokens(), 5);
  std::vector<int32_t> tokens = {result.outputs(0).token_id()};
  for (int i = 0; i < 2; ++i) {
    loom::v1::StepPlan decode = Plan(step_id);
    Schedule(decode, 2, 1, true);
    result = executor.Execute(decode);
    ASSERT_EQ(result.error_code(), 0) << result.error_message();
    tokens.push_back(result.outputs(0).token_id());
  }
  EXPECT_EQ(tokens, expected);
}

}  // namespace
}  // namespace loom::worker
