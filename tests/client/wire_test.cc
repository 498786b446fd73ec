#include "client/wire.h"

#include "gtest/gtest.h"

namespace loom::client {
namespace {

TEST(WireTest, TextRequestCarriesOnlyTheSamplingFieldsThatAreSet) {
  GenerateRequest request = GenerateRequest::FromText("Hello", 7);
  request.sampling.temperature = 0.5f;
  request.sampling.num_logprobs = 2;
  request.stop = {"\n"};
  request.priority = -1;
  const loom::v1::GenerateRequest wire = ToWire(request);
  EXPECT_EQ(wire.prompt_case(), loom::v1::GenerateRequest::kText);
  EXPECT_EQ(wire.text(), "Hello");
  EXPECT_EQ(wire.max_tokens(), 7);
  EXPECT_TRUE(wire.sampling().has_temperature());
  EXPECT_FLOAT_EQ(wire.sampling().temperature(), 0.5f);
  EXPECT_EQ(wire.sampling().num_logprobs(), 2);
  EXPECT_FALSE(wire.sampling().has_top_p());
  EXPECT_FALSE(wire.sampling().has_seed());
  ASSERT_EQ(wire.stop_size(), 1);
  EXPECT_EQ(wire.priority(), -1);
}

TEST(WireTest, ConstraintLogitBiasMinTokensAndOutputOptionsReachTheWire) {
  GenerateRequest request = GenerateRequest::FromText("Pick:", 8);
  request.sampling.logit_bias = {{42, -100.0f}, {7, 2.5f}};
  request.sampling.min_tokens = 3;
  request.constraint = OutputConstraint{"choice", R"(["left","right"])"};
  request.include_stop_str_in_output = true;
  request.skip_special_tokens = false;
  const loom::v1::GenerateRequest wire = ToWire(request);
  ASSERT_EQ(wire.sampling().logit_bias_size(), 2);
  EXPECT_FLOAT_EQ(wire.sampling().logit_bias().at(42), -100.0f);
  EXPECT_FLOAT_EQ(wire.sampling().logit_bias().at(7), 2.5f);
  EXPECT_EQ(wire.sampling().min_tokens(), 3);
  EXPECT_EQ(wire.sampling().grammar().kind(), "choice");
  EXPECT_EQ(wire.sampling().grammar().text(), R"(["left","right"])");
  EXPECT_TRUE(wire.include_stop_str_in_output());
  ASSERT_TRUE(wire.has_skip_special_tokens());
  EXPECT_FALSE(wire.skip_special_tokens());
  // Unset: the server's defaults.
  const loom::v1::GenerateRequest plain = ToWire(GenerateRequest::FromText("x", 1));
  EXPECT_FALSE(plain.sampling().has_min_tokens());
  EXPECT_FALSE(plain.has_skip_special_tokens());
  EXPECT_TRUE(plain.sampling().grammar().kind().empty());
}

TEST(WireTest, ChatEndingReachesTheWireOnlyWhenSet) {
  GenerateRequest request;
  request.messages = {ChatMessage::Of("user", "Name a color."),
                      ChatMessage::Of("assistant", "The color is")};
  EXPECT_FALSE(ToWire(request).has_add_generation_prompt());  // unset: the server's true
  EXPECT_FALSE(ToWire(request).continue_final_message());
  request.add_generation_prompt = false;
  request.continue_final_message = true;
  const loom::v1::GenerateRequest wire = ToWire(request);
  ASSERT_TRUE(wire.has_add_generation_prompt());
  EXPECT_FALSE(wire.add_generation_prompt());
  EXPECT_TRUE(wire.continue_final_message());
  EXPECT_TRUE(wire.chat_template_kwargs().empty() && wire.reasoning_effort().empty());
  request.chat_template_kwargs = R"({"enable_thinking": false})";
  request.reasoning_effort = "high";
  EXPECT_EQ(ToWire(request).chat_template_kwargs(), request.chat_template_kwargs);
  EXPECT_EQ(ToWire(request).reasoning_effort(), "high");
}

TEST(WireTest, EmptyTokenIdListStillSelectsTheTokenPrompt) {
  const loom::v1::GenerateRequest wire = ToWire(GenerateRequest::FromTokenIds({}, 4));
  EXPECT_EQ(wire.prompt_case(), loom::v1::GenerateRequest::kTokenIds);
  EXPECT_EQ(wire.token_ids().ids_size(), 0);
}

TEST(WireTest, ChunksJoinIntoACompletionWithTheLastChunksUsage) {
  loom::v1::GenerateResponse first;
  first.set_request_id("req-1");
  first.set_replica_id("r0");
  first.set_text("Hel");
  first.add_token_ids(10);
  loom::v1::SequenceOutput* logprob = first.add_logprobs();
  logprob->set_token_id(10);
  logprob->set_logprob(-0.25f);
  logprob->add_top_logprobs()->set_token_id(10);
  loom::v1::GenerateResponse last;
  last.set_text("lo");
  last.add_token_ids(11);
  last.set_finish_reason(loom::v1::FINISH_REASON_LENGTH);
  last.set_prompt_tokens(3);
  last.set_completion_tokens(2);
  last.set_cached_prompt_tokens(1);
  last.set_content("lo");
  last.set_reasoning_content("thinking");

  Completion completion;
  const GenerateChunk first_chunk = FromWire(first);
  EXPECT_EQ(first_chunk.finish_reason, FinishReason::kNone);
  EXPECT_FALSE(first_chunk.reasoning_content.has_value());
  completion.Append(first_chunk);
  completion.Append(FromWire(last));
  EXPECT_EQ(completion.text, "Hello");
  EXPECT_EQ(completion.token_ids, (std::vector<int32_t>{10, 11}));
  EXPECT_EQ(completion.request_id, "req-1");
  EXPECT_EQ(completion.replica_id, "r0");
  EXPECT_EQ(completion.finish_reason, FinishReason::kLength);
  EXPECT_EQ(completion.usage.prompt_tokens, 3);
  EXPECT_EQ(completion.usage.completion_tokens, 2);
  EXPECT_EQ(completion.usage.cached_prompt_tokens, 1);
  EXPECT_EQ(completion.content, "lo");
  EXPECT_EQ(completion.reasoning_content, "thinking");
  ASSERT_EQ(completion.logprobs.size(), 1u);
  EXPECT_FLOAT_EQ(completion.logprobs[0].logprob, -0.25f);
  EXPECT_EQ(completion.logprobs[0].top.size(), 1u);
}

TEST(WireTest, GrpcStatusKeepsCodeAndMessage) {
  const absl::Status status =
      FromGrpcStatus(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "queue full"));
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(status.message(), "queue full");
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());
}

}  // namespace
}  // namespace loom::client
