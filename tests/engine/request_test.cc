#include "engine/request.h"

#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "common/formats/gguf_file.h"
#include "tests/common/tokenizer_test_util.h"
#include "gtest/gtest.h"

namespace loom::engine {
namespace {

OutputEvent Tokens(std::string text, std::vector<int32_t> ids, std::string replica = "") {
  OutputEvent event;
  event.text = std::move(text);
  event.token_ids = std::move(ids);
  event.replica_id = std::move(replica);
  return event;
}

TEST(OutputQueueTest, PopWaitsThenTimesOut) {
  OutputQueue queue;
  EXPECT_FALSE(queue.Pop(absl::Milliseconds(5)).has_value());
  queue.Push(Tokens("a", {1}, "r0"));
  std::optional<OutputEvent> event = queue.Pop(absl::Milliseconds(5));
  ASSERT_TRUE(event.has_value());
  EXPECT_EQ(event->text, "a");
  EXPECT_FALSE(queue.Pop(absl::Milliseconds(5)).has_value());
}

TEST(OutputQueueTest, PopMergesEverythingQueuedUpToTheFinalEvent) {
  OutputQueue queue;
  queue.Push(Tokens("The", {10}, "r1"));
  queue.Push(Tokens(" cap", {11}));
  OutputEvent last = Tokens("ital", {12});
  last.finish_reason = loom::v1::FINISH_REASON_LENGTH;
  queue.Push(std::move(last));
  std::optional<OutputEvent> event = queue.Pop(absl::Milliseconds(5));
  ASSERT_TRUE(event.has_value());
  EXPECT_EQ(event->text, "The capital");
  EXPECT_EQ(event->token_ids, (std::vector<int32_t>{10, 11, 12}));
  EXPECT_EQ(event->replica_id, "r1");  // later events carry none: the first one's stays
  EXPECT_EQ(event->finish_reason, loom::v1::FINISH_REASON_LENGTH);
  EXPECT_TRUE(event->final());
}

TEST(OutputQueueTest, PopHoldsTokensUntilTheHoldEndsThenDeliversThemTogether) {
  OutputQueue queue;
  const absl::Time hold_until = absl::Now() + absl::Milliseconds(200);
  queue.Push(Tokens("a", {1}, "r0"));
  queue.Push(Tokens("b", {2}));
  // Within the hold, a short wait finds nothing even though tokens are queued.
  EXPECT_FALSE(queue.Pop(absl::Milliseconds(20), hold_until).has_value());
  queue.Push(Tokens("c", {3}));
  const absl::Time start = absl::Now();
  std::optional<OutputEvent> event = queue.Pop(absl::Seconds(5), hold_until);
  ASSERT_TRUE(event.has_value());
  EXPECT_GE(absl::Now(), hold_until);
  EXPECT_LT(absl::Now() - start, absl::Seconds(4));
  EXPECT_EQ(event->text, "abc");
  EXPECT_EQ(event->token_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(event->replica_id, "r0");
  EXPECT_FALSE(event->final());
  EXPECT_FALSE(queue.Pop(absl::Milliseconds(5)).has_value());
}

TEST(OutputQueueTest, AFinalEventEndsTheHoldAtOnce) {
  OutputQueue queue;
  const absl::Time hold_until = absl::Now() + absl::Seconds(30);
  queue.Push(Tokens("a", {1}, "r0"));
  std::thread producer([&queue] {
    absl::SleepFor(absl::Milliseconds(20));
    OutputEvent last = Tokens("b", {2});
    last.finish_reason = loom::v1::FINISH_REASON_LENGTH;
    queue.Push(std::move(last));
  });
  const absl::Time start = absl::Now();
  std::optional<OutputEvent> event = queue.Pop(absl::Seconds(10), hold_until);
  producer.join();
  ASSERT_TRUE(event.has_value());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(event->text, "ab");
  EXPECT_EQ(event->token_ids, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(event->finish_reason, loom::v1::FINISH_REASON_LENGTH);
}

TEST(OutputQueueTest, APastHoldDeliversAtOnce) {
  OutputQueue queue;
  queue.Push(Tokens("a", {1}));
  std::optional<OutputEvent> event =
      queue.Pop(absl::Milliseconds(5), absl::Now() - absl::Milliseconds(1));
  ASSERT_TRUE(event.has_value());
  EXPECT_EQ(event->text, "a");
}

TEST(OutputQueueTest, NothingFollowsAFinalEvent) {
  OutputQueue queue;
  OutputEvent last = Tokens("a", {1});
  last.finish_reason = loom::v1::FINISH_REASON_ABORT;
  queue.Push(std::move(last));
  queue.Push(Tokens("late", {2}));
  std::optional<OutputEvent> event = queue.Pop(absl::Milliseconds(5));
  ASSERT_TRUE(event.has_value());
  EXPECT_EQ(event->text, "a");
  EXPECT_EQ(event->finish_reason, loom::v1::FINISH_REASON_ABORT);
  EXPECT_FALSE(queue.Pop(absl::Milliseconds(5)).has_value());
}

TEST(OutputQueueTest, TryPopTakesWhatIsThereAndOtherwiseArmsTheListenerOnce) {
  OutputQueue queue;
  int calls = 0;
  queue.SetListener([&calls] { ++calls; });
  EXPECT_FALSE(queue.TryPop().has_value());  // empty: armed for any event
  queue.Push(Tokens("a", {1}, "r0"));
  EXPECT_EQ(calls, 1);
  queue.Push(Tokens("b", {2}));  // not armed any more
  EXPECT_EQ(calls, 1);
  std::optional<OutputEvent> event = queue.TryPop();
  ASSERT_TRUE(event.has_value());
  EXPECT_EQ(event->text, "ab");
  EXPECT_EQ(event->token_ids, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(calls, 1);
}

TEST(OutputQueueTest, TryPopWhileHoldingWakesTheListenerOnlyForTheFinalEvent) {
  OutputQueue queue;
  int calls = 0;
  queue.SetListener([&calls] { ++calls; });
  const absl::Time hold_until = absl::Now() + absl::Seconds(30);
  queue.Push(Tokens("a", {1}));
  EXPECT_FALSE(queue.TryPop(hold_until).has_value());  // held
  queue.Push(Tokens("b", {2}));
  EXPECT_EQ(calls, 0);
  OutputEvent last = Tokens("c", {3});
  last.finish_reason = loom::v1::FINISH_REASON_STOP;
  queue.Push(std::move(last));
  EXPECT_EQ(calls, 1);
  std::optional<OutputEvent> event = queue.TryPop(hold_until);
  ASSERT_TRUE(event.has_value());
  EXPECT_EQ(event->text, "abc");
  EXPECT_TRUE(event->final());
}

TEST(OutputQueueTest, AClearedListenerIsNotCalled) {
  OutputQueue queue;
  int calls = 0;
  queue.SetListener([&calls] { ++calls; });
  EXPECT_FALSE(queue.TryPop().has_value());
  queue.SetListener(nullptr);
  queue.Push(Tokens("a", {1}));
  EXPECT_EQ(calls, 0);
  EXPECT_TRUE(queue.TryPop().has_value());
}

class RequestTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string path = common::testing::ModelPath();
    auto gguf = common::GgufFile::Open(path);
    ASSERT_TRUE(gguf.ok()) << gguf.status();
    tokenizer_ = common::Tokenizer::FromGguf(**gguf).value().release();
  }

  std::unique_ptr<Request> MakeRequest(RequestParams params) {
    return std::make_unique<Request>("req", 1, std::move(params), *tokenizer_,
                                     tokenizer_->EndOfGenerationIds());
  }

  // Feeds the tokens of `text` one by one; returns the merged client view.
  OutputEvent Feed(Request& request, const std::string& text) {
    for (int32_t id : tokenizer_->Encode(text, false, false)) {
      loom::v1::SequenceOutput output;
      output.set_token_id(id);
      if (request.OnToken(output, "r0")) break;
    }
    std::optional<OutputEvent> event = request.outputs().Pop(absl::Milliseconds(5));
    return event.value_or(OutputEvent{});
  }

  static common::Tokenizer* tokenizer_;
};

common::Tokenizer* RequestTest::tokenizer_ = nullptr;

TEST_F(RequestTest, MaxTokensEndsWithLengthAndAllText) {
  RequestParams params;
  params.max_tokens = 3;
  auto request = MakeRequest(params);
  const std::string text = " Paris is the capital of France";
  const std::vector<int32_t> ids = tokenizer_->Encode(text, false, false);
  ASSERT_GT(ids.size(), 3u);
  OutputEvent event = Feed(*request, text);
  EXPECT_EQ(event.finish_reason, loom::v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(event.token_ids, std::vector<int32_t>(ids.begin(), ids.begin() + 3));
  EXPECT_EQ(event.text, tokenizer_->Decode(event.token_ids, true).value());
  EXPECT_TRUE(request->finished());
  EXPECT_EQ(request->num_outputs(), 3);
}

// A constrained sequence's end token ends it even before min_tokens and with ignore_eos
// (the worker emits one only where the grammar's document is complete); an unconstrained
// one goes on.
TEST_F(RequestTest, AnEndTokenEndsAConstrainedSequenceBeforeMinTokensAndWithIgnoreEos) {
  const int32_t end = tokenizer_->EndOfGenerationIds().at(0);
  const int32_t word = tokenizer_->Encode(" yes", false, false).at(0);
  for (const bool ignore_eos : {false, true}) {
    for (const bool constrained : {false, true}) {
      RequestParams params;
      params.max_tokens = 10;
      params.ignore_eos = ignore_eos;
      params.sampling.set_min_tokens(ignore_eos ? 0 : 5);
      if (constrained) {
        params.sampling.mutable_grammar()->set_kind("regex");
        params.sampling.mutable_grammar()->set_text(" yes");
      }
      auto request = MakeRequest(params);
      for (const int32_t id : {word, end}) {
        loom::v1::SequenceOutput output;
        output.set_token_id(id);
        request->OnToken(output, "r0");
      }
      EXPECT_EQ(request->finished(), constrained)
          << "ignore_eos " << ignore_eos << ", constrained " << constrained;
      if (constrained) {
        std::optional<OutputEvent> event = request->outputs().Pop(absl::Milliseconds(5));
        ASSERT_TRUE(event.has_value());
        EXPECT_EQ(event->finish_reason, loom::v1::FINISH_REASON_STOP);
        EXPECT_EQ(event->text, " yes");
      }
    }
  }
}

// A worker that cannot go on (a grammar's dead end) reports it with its last token: the
// request ends with that error, the text before it stands and the token is not counted.
TEST_F(RequestTest, AWorkersDeadEndEndsTheRequestWithItsError) {
  RequestParams params;
  params.max_tokens = 10;
  auto request = MakeRequest(params);
  loom::v1::SequenceOutput output;
  const int32_t yes = tokenizer_->Encode(" yes", false, false).at(0);
  output.set_token_id(yes);
  EXPECT_FALSE(request->OnToken(output, "r0"));
  output.set_token_id(tokenizer_->EndOfGenerationIds().at(0));
  output.set_error_message("the grammar allows no token after this text (a dead end)");
  EXPECT_TRUE(request->OnToken(output, "r0"));
  EXPECT_TRUE(request->finished());
  EXPECT_EQ(request->num_outputs(), 1);
  // One event: the queue merges what was pushed up to the final one.
  const OutputEvent event = request->outputs().Pop(absl::Milliseconds(5)).value();
  EXPECT_TRUE(event.final());
  EXPECT_EQ(event.token_ids, std::vector<int32_t>{yes});  // not the forced end token
  EXPECT_EQ(event.finish_reason, loom::v1::FINISH_REASON_ERROR);
  EXPECT_EQ(event.error_message, "the grammar allows no token after this text (a dead end)");
}

TEST_F(RequestTest, StopStringCutsTheTextAndFinishesWithStop) {
  RequestParams params;
  params.max_tokens = 100;
  params.stop = {" capital"};
  auto request = MakeRequest(params);
  OutputEvent event = Feed(*request, " Paris is the capital of France");
  EXPECT_EQ(event.finish_reason, loom::v1::FINISH_REASON_STOP);
  EXPECT_EQ(event.text, " Paris is the");
}

TEST_F(RequestTest, FinishAfterOutputKeepsTheTextAndReportsTheReason) {
  RequestParams params;
  params.max_tokens = 100;
  auto request = MakeRequest(params);
  loom::v1::SequenceOutput output;
  output.set_token_id(tokenizer_->Encode(" Paris", false, false)[0]);
  EXPECT_FALSE(request->OnToken(output, "r0"));
  EXPECT_TRUE(request->produced_output());
  request->Finish(loom::v1::FINISH_REASON_ABORT, "cancelled", "r0");
  request->Finish(loom::v1::FINISH_REASON_ERROR, "ignored: already finished", "r0");
  std::optional<OutputEvent> event = request->outputs().Pop(absl::Milliseconds(5));
  ASSERT_TRUE(event.has_value());
  EXPECT_EQ(event->finish_reason, loom::v1::FINISH_REASON_ABORT);
  EXPECT_EQ(event->error_message, "cancelled");
  EXPECT_FALSE(request->outputs().Pop(absl::Milliseconds(5)).has_value());
}

TEST(OutputQueueTest, PopCarriesTheFinalEventsCachedPromptTokens) {
  OutputQueue queue;
  queue.Push(Tokens("a", {1}, "r0"));
  OutputEvent last = Tokens("b", {2});
  last.finish_reason = loom::v1::FINISH_REASON_STOP;
  last.cached_prompt_tokens = 48;
  queue.Push(std::move(last));
  std::optional<OutputEvent> event = queue.Pop(absl::Milliseconds(5));
  ASSERT_TRUE(event.has_value());
  EXPECT_EQ(event->cached_prompt_tokens, 48);
}

TEST_F(RequestTest, TheFinalEventReportsTheCachedPromptTokens) {
  RequestParams params;
  params.max_tokens = 2;
  auto request = MakeRequest(params);
  request->set_cached_prompt_tokens(32);
  OutputEvent event = Feed(*request, " Paris is the capital");
  EXPECT_TRUE(event.final());
  EXPECT_EQ(event.cached_prompt_tokens, 32);

  auto aborted = MakeRequest(params);
  aborted->set_cached_prompt_tokens(16);
  aborted->Finish(loom::v1::FINISH_REASON_ABORT, "cancelled", "r0");
  std::optional<OutputEvent> final_event = aborted->outputs().Pop(absl::Milliseconds(5));
  ASSERT_TRUE(final_event.has_value());
  EXPECT_EQ(final_event->cached_prompt_tokens, 16);
}

TEST_F(RequestTest, PromptBlockHashesAreComputedOncePerBlockSizeWithTheSalt) {
  RequestParams params;
  params.max_tokens = 1;
  params.prompt_ids = std::vector<int32_t>(40, 5);
  params.cache_salt = "tenant";
  auto request = MakeRequest(params);
  const std::vector<BlockHash> hashes = request->PromptBlockHashes("fp", 16);
  EXPECT_EQ(request->hashed_block_size(), 16);
  EXPECT_EQ(hashes, HashFullBlocks(PrefixHashSeed("fp", "tenant"), params.prompt_ids, 16));
  EXPECT_EQ(request->hash_seed(), PrefixHashSeed("fp", "tenant"));
  EXPECT_EQ(request->PromptBlockHashes("fp", 8).size(), 5u);
}

}  // namespace
}  // namespace loom::engine
