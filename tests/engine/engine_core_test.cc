#include "engine/engine_core.h"

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/formats/gguf_file.h"
#include "tests/common/tokenizer_test_util.h"
#include "gtest/gtest.h"

namespace loom::engine {
namespace {

// The engine core as its drivers use it, with the worker's part played by the test: each
// sampled sequence of a plan gets the next token of a fixed text.
class EngineCoreTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto gguf = common::GgufFile::Open(common::testing::ModelPath());
    ASSERT_TRUE(gguf.ok()) << gguf.status();
    tokenizer_ = common::Tokenizer::FromGguf(**gguf).value().release();
  }

  void SetUp() override {
    SchedulerConfig config;
    config.block_size = 4;
    config.num_blocks = 32;
    config.max_num_batched_tokens = 8;  // prompts of 10 tokens take two chunked steps
    EngineCore::Hooks hooks;
    hooks.on_token = [this](Request& request, const loom::v1::SequenceOutput& output,
                            bool finished) {
      tokens_[request.seq_id()].push_back(output.token_id());
      if (finished) finished_by_token_.push_back(request.seq_id());
    };
    hooks.on_end = [this](Request& request) { ended_.push_back(request.seq_id()); };
    hooks.on_handoff = [this](std::shared_ptr<Request> request) {
      handed_off_.push_back(std::move(request));
    };
    engine_ = std::make_unique<EngineCore>(config, "r0", std::move(hooks));
  }

  std::shared_ptr<Request> MakeRequest(uint64_t seq_id, int32_t max_tokens) {
    RequestParams params;
    params.prompt_ids.assign(10, 0);
    for (int i = 0; i < 10; ++i) params.prompt_ids[i] = 100 + 10 * static_cast<int32_t>(seq_id) + i;
    params.max_tokens = max_tokens;
    params.ignore_eos = true;
    return std::make_shared<Request>("req-" + std::to_string(seq_id), seq_id, std::move(params),
                                     *tokenizer_, tokenizer_->EndOfGenerationIds());
  }

  // What a worker answers for `out`: one token per sampled sequence.
  static loom::v1::StepResult Answer(const SchedulerOutput& out, int32_t token) {
    loom::v1::StepResult result;
    for (const ScheduledWork& work : out.scheduled) {
      if (!work.sample) continue;
      loom::v1::SequenceOutput* output = result.add_outputs();
      output->set_seq_id(work.seq->seq_id);
      output->set_token_id(token);
    }
    result.set_num_tokens(out.num_decode_tokens + out.num_prefill_tokens);
    return result;
  }

  static common::Tokenizer* tokenizer_;
  std::unique_ptr<EngineCore> engine_;
  std::map<uint64_t, std::vector<int32_t>> tokens_;
  std::vector<uint64_t> finished_by_token_, ended_;
  std::vector<std::shared_ptr<Request>> handed_off_;
};

common::Tokenizer* EngineCoreTest::tokenizer_ = nullptr;

TEST_F(EngineCoreTest, RunsRequestsToMaxTokensThenFreesEveryBlock) {
  auto first = MakeRequest(1, 3);
  auto second = MakeRequest(2, 5);
  ASSERT_TRUE(engine_->Admit(first).ok());
  ASSERT_TRUE(engine_->Admit(second).ok());
  EXPECT_EQ(engine_->requests().size(), 2u);
  const int64_t free_before = engine_->scheduler().block_manager().num_free();

  SchedulerOutput out;
  StepRecord record;
  int steps = 0;
  while (engine_->Plan(out, record)) {
    ASSERT_LT(++steps, 50) << "the engine does not finish";
    EXPECT_EQ(record.num_tokens, out.num_decode_tokens + out.num_prefill_tokens);
    EXPECT_EQ(record.seq_ids.size(), out.scheduled.size());
    engine_->Apply(record, Answer(out, 28 + steps));
  }
  EXPECT_EQ(tokens_[1].size(), 3u);
  EXPECT_EQ(tokens_[2].size(), 5u);
  EXPECT_EQ(finished_by_token_, (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(ended_, (std::vector<uint64_t>{1, 2}));
  EXPECT_TRUE(first->finished());
  EXPECT_TRUE(second->finished());
  EXPECT_TRUE(engine_->requests().empty());
  EXPECT_FALSE(engine_->scheduler().has_work());
  EXPECT_EQ(engine_->scheduler().block_manager().num_free(), free_before);
  // The client's view: every token, then LENGTH.
  std::optional<OutputEvent> event = second->outputs().Pop(absl::Milliseconds(5));
  ASSERT_TRUE(event.has_value());
  EXPECT_EQ(event->token_ids, tokens_[2]);
  EXPECT_EQ(event->finish_reason, loom::v1::FINISH_REASON_LENGTH);
}

TEST_F(EngineCoreTest, AFailedStepEndsItsSequencesWithAnErrorAndFreesTheirBlocks) {
  auto request = MakeRequest(1, 8);
  ASSERT_TRUE(engine_->Admit(request).ok());
  const int64_t free_before = engine_->scheduler().block_manager().num_free();
  SchedulerOutput out;
  StepRecord record;
  ASSERT_TRUE(engine_->Plan(out, record));
  loom::v1::StepResult failed;
  failed.set_error_code(13);
  failed.set_error_message("device lost");
  engine_->Apply(record, failed);
  EXPECT_EQ(ended_, (std::vector<uint64_t>{1}));
  EXPECT_TRUE(finished_by_token_.empty());
  EXPECT_TRUE(engine_->requests().empty());
  std::optional<OutputEvent> event = request->outputs().Pop(absl::Milliseconds(5));
  ASSERT_TRUE(event.has_value());
  EXPECT_EQ(event->finish_reason, loom::v1::FINISH_REASON_ERROR);
  EXPECT_NE(event->error_message.find("device lost"), std::string::npos) << event->error_message;
  // The scheduler tells the worker to release the sequence, then holds nothing.
  while (engine_->Plan(out, record)) engine_->Apply(record, Answer(out, 30));
  EXPECT_EQ(engine_->scheduler().block_manager().num_free(), free_before);
}

TEST_F(EngineCoreTest, APrefillOnlyRequestIsHandedOffAfterItsFirstTokenWithItsPromptCached) {
  // Disaggregated serving's prefill side: the prompt (two chunked steps) and one token, then
  // the request leaves the core unfinished, its blocks free and its full prompt blocks
  // cached for the decode replica to fetch.
  auto request = MakeRequest(1, 6);
  auto one_token = MakeRequest(2, 1);  // finished by its first token: ended, not handed off
  ASSERT_TRUE(engine_->Admit(request, 0, /*prefill_only=*/true).ok());
  ASSERT_TRUE(engine_->Admit(one_token, 0, /*prefill_only=*/true).ok());
  const int64_t free_before = engine_->scheduler().block_manager().num_free();
  SchedulerOutput out;
  StepRecord record;
  int steps = 0;
  while (engine_->Plan(out, record)) {
    ASSERT_LT(++steps, 20);
    for (const ScheduledWork& work : out.scheduled) {
      // Nothing past the first token is ever scheduled.
      EXPECT_LE(work.seq->num_computed, 10) << "step " << steps;
    }
    engine_->Apply(record, Answer(out, 40));
  }
  ASSERT_EQ(handed_off_.size(), 1u);
  EXPECT_EQ(handed_off_[0], request);
  EXPECT_FALSE(request->finished());
  EXPECT_EQ(request->output_ids(), (std::vector<int32_t>{40}));
  EXPECT_EQ(ended_, (std::vector<uint64_t>{2}));
  EXPECT_TRUE(one_token->finished());
  EXPECT_TRUE(engine_->requests().empty());
  EXPECT_EQ(engine_->scheduler().block_manager().num_free(), free_before);
  // Both prompts' two full blocks are in the prefix cache.
  EXPECT_EQ(engine_->scheduler().block_manager().num_cached(), 4);
  // The client saw the first token, and no end.
  std::optional<OutputEvent> event = request->outputs().Pop(absl::Milliseconds(5));
  ASSERT_TRUE(event.has_value());
  EXPECT_EQ(event->token_ids, (std::vector<int32_t>{40}));
  EXPECT_FALSE(event->final());

  // The decode side: admitted again (with its output), it continues to max_tokens.
  ASSERT_TRUE(engine_->Admit(request).ok());
  while (engine_->Plan(out, record)) engine_->Apply(record, Answer(out, 41));
  EXPECT_TRUE(request->finished());
  EXPECT_EQ(request->output_ids().size(), 6u);
  EXPECT_EQ(handed_off_.size(), 1u);
}

TEST_F(EngineCoreTest, TakeAllHandsBackRequestsWithoutEndingThem) {
  auto first = MakeRequest(1, 4);
  auto second = MakeRequest(2, 4);
  ASSERT_TRUE(engine_->Admit(first).ok());
  ASSERT_TRUE(engine_->Admit(second).ok());
  SchedulerOutput out;
  StepRecord record;
  ASSERT_TRUE(engine_->Plan(out, record));
  std::vector<std::shared_ptr<Request>> taken = engine_->TakeAll();
  ASSERT_EQ(taken.size(), 2u);
  EXPECT_TRUE(ended_.empty());
  EXPECT_FALSE(first->finished());
  EXPECT_FALSE(second->finished());
  EXPECT_TRUE(engine_->requests().empty());
  EXPECT_FALSE(engine_->scheduler().has_work());
}

TEST_F(EngineCoreTest, EndCancelsARunningRequest) {
  auto request = MakeRequest(1, 8);
  ASSERT_TRUE(engine_->Admit(request).ok());
  SchedulerOutput out;
  StepRecord record;
  ASSERT_TRUE(engine_->Plan(out, record));
  engine_->Apply(record, Answer(out, 29));
  engine_->End(1, loom::v1::FINISH_REASON_ABORT, "cancelled");
  EXPECT_EQ(ended_, (std::vector<uint64_t>{1}));
  EXPECT_TRUE(request->finished());
  engine_->End(1, loom::v1::FINISH_REASON_ABORT, "again");  // unknown now: nothing happens
  EXPECT_EQ(ended_.size(), 1u);
}

}  // namespace
}  // namespace loom::engine
