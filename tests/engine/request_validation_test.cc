#include "engine/request_validation.h"

#include <cstdlib>
#include <memory>
#include <string>

#include "common/formats/gguf_file.h"
#include "common/sampling_params.h"
#include "tests/common/tokenizer_test_util.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::engine {
namespace {

using ::testing::HasSubstr;

class RequestValidationTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // LOOM_MODEL_PATH, else the checkout's models/ (found from this file's path).
    const std::string path = common::testing::ModelPath();
    auto gguf = common::GgufFile::Open(path);
    ASSERT_TRUE(gguf.ok()) << gguf.status();
    gguf_ = std::move(gguf).value().release();
    config_ = new common::ModelConfig(*common::ModelConfigFromGguf(*gguf_));
    tokenizer_ = common::Tokenizer::FromGguf(*gguf_).value().release();
  }

  absl::StatusOr<RequestParams> Validate(const loom::v1::GenerateRequest& request) {
    return ValidateGenerateRequest(request, *config_, *tokenizer_);
  }

  static common::GgufFile* gguf_;
  static common::ModelConfig* config_;
  static common::Tokenizer* tokenizer_;
};

common::GgufFile* RequestValidationTest::gguf_ = nullptr;
common::ModelConfig* RequestValidationTest::config_ = nullptr;
common::Tokenizer* RequestValidationTest::tokenizer_ = nullptr;

TEST_F(RequestValidationTest, UnsetSamplingMeansGreedyAndMaxTokensFillsTheContext) {
  loom::v1::GenerateRequest request;
  request.set_text("The capital of France is");
  auto params = Validate(request);
  ASSERT_TRUE(params.ok()) << params.status();
  EXPECT_EQ(params->prompt_ids, tokenizer_->Encode("The capital of France is", true, true));
  EXPECT_EQ(params->sampling.temperature(), 0.0f);
  EXPECT_EQ(params->sampling.top_p(), 1.0f);
  EXPECT_EQ(params->sampling.repetition_penalty(), 1.0f);
  EXPECT_EQ(params->sampling.num_logprobs(), -1);
  EXPECT_EQ(params->max_tokens + static_cast<int64_t>(params->prompt_ids.size()),
            config_->context_length);
}

// The coordinator, the workers (SamplingParamsFromProto) and the in-process engine
// (common::SamplingParams{}) agree on every default: the wire carries the struct's.
TEST_F(RequestValidationTest, UnsetSamplingBecomesTheSharedDefaultsWithEveryFieldSet) {
  loom::v1::GenerateRequest request;
  request.set_text("Hello");
  auto params = Validate(request);
  ASSERT_TRUE(params.ok()) << params.status();
  EXPECT_EQ(params->sampling.SerializeAsString(),
            common::SamplingParamsToProto(common::SamplingParams()).SerializeAsString());
  EXPECT_EQ(common::SamplingParamsFromProto(params->sampling), common::SamplingParams());
  EXPECT_TRUE(params->sampling.has_temperature() && params->sampling.has_seed());

  request.mutable_sampling()->set_top_p(1.5f);
  auto refused = Validate(request);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("top_p must be in (0, 1], got 1.5"));
}

TEST_F(RequestValidationTest, CarriesTheCacheSalt) {
  loom::v1::GenerateRequest request;
  request.set_text("Hello");
  request.set_cache_salt("tenant-7");
  auto params = Validate(request);
  ASSERT_TRUE(params.ok()) << params.status();
  EXPECT_EQ(params->cache_salt, "tenant-7");
}

TEST_F(RequestValidationTest, RejectsAnEmptyPrompt) {
  loom::v1::GenerateRequest request;
  request.set_text("");
  EXPECT_THAT(Validate(request).status().message(), HasSubstr("empty"));
  request.mutable_token_ids();
  EXPECT_EQ(Validate(request).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(RequestValidationTest, RejectsTokenIdsOutsideTheVocabulary) {
  loom::v1::GenerateRequest request;
  request.mutable_token_ids()->add_ids(1);
  request.mutable_token_ids()->add_ids(static_cast<int32_t>(config_->vocab_size));
  auto params = Validate(request);
  EXPECT_EQ(params.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(params.status().message(), HasSubstr(std::to_string(config_->vocab_size)));
}

TEST_F(RequestValidationTest, RejectsPromptPlusMaxTokensPastTheContext) {
  loom::v1::GenerateRequest request;
  request.set_text("hello");
  request.set_max_tokens(static_cast<int32_t>(config_->context_length));
  EXPECT_THAT(Validate(request).status().message(), HasSubstr("context length"));
  request.set_max_tokens(-1);
  EXPECT_EQ(Validate(request).status().code(), absl::StatusCode::kInvalidArgument);
}

// A prompt that fills the context leaves no room for a generated token, but an embedding
// generates none: it may fill the context, not pass it.
TEST_F(RequestValidationTest, AnEmbeddingMayFillTheContextAndNoMore) {
  loom::v1::GenerateRequest request;
  request.mutable_token_ids()->mutable_ids()->Resize(static_cast<int>(config_->context_length), 5);
  EXPECT_THAT(Validate(request).status().message(), HasSubstr("room for at least one"));
  absl::StatusOr<RequestParams> embed =
      ValidateGenerateRequest(request, *config_, *tokenizer_, 0.0f, /*embed=*/true);
  ASSERT_TRUE(embed.ok()) << embed.status();
  EXPECT_TRUE(embed->embed);
  EXPECT_EQ(embed->max_tokens, 1);
  EXPECT_EQ(embed->prompt_ids.size(), static_cast<size_t>(config_->context_length));
  request.mutable_token_ids()->add_ids(5);
  EXPECT_EQ(
      ValidateGenerateRequest(request, *config_, *tokenizer_, 0.0f, /*embed=*/true).status().code(),
      absl::StatusCode::kInvalidArgument);
}

TEST_F(RequestValidationTest, RejectsSamplingParametersOutOfRange) {
  loom::v1::GenerateRequest request;
  request.set_text("hello");
  request.mutable_sampling()->set_top_p(0.0f);
  EXPECT_THAT(Validate(request).status().message(), HasSubstr("top_p"));
  request.mutable_sampling()->clear_top_p();
  request.mutable_sampling()->set_temperature(-1.0f);
  EXPECT_THAT(Validate(request).status().message(), HasSubstr("temperature"));
}

// generation_config.json's defaults fill what the request leaves unset; what it sets
// stays; the API's default (gRPC: greedy, OpenAI: 1) applies only where neither does.
TEST_F(RequestValidationTest, ModelSamplingDefaultsFillOnlyUnsetFields) {
  common::ModelConfig config = *config_;
  config.sampling_defaults.temperature = 0.7f;
  config.sampling_defaults.top_k = 20;
  config.sampling_defaults.top_p = 0.8f;
  config.sampling_defaults.repetition_penalty = 1.05f;
  loom::v1::GenerateRequest request;
  request.set_text("hello");
  request.mutable_sampling()->set_top_p(0.5f);
  absl::StatusOr<RequestParams> params = ValidateGenerateRequest(request, config, *tokenizer_);
  ASSERT_TRUE(params.ok()) << params.status();
  EXPECT_FLOAT_EQ(params->sampling.temperature(), 0.7f);
  EXPECT_EQ(params->sampling.top_k(), 20);
  EXPECT_FLOAT_EQ(params->sampling.top_p(), 0.5f);  // the request's
  EXPECT_FLOAT_EQ(params->sampling.repetition_penalty(), 1.05f);
  EXPECT_FLOAT_EQ(params->sampling.min_p(), 0.0f);  // no model default: the API's

  request.mutable_sampling()->set_temperature(0.0f);
  params = ValidateGenerateRequest(request, config, *tokenizer_);
  ASSERT_TRUE(params.ok()) << params.status();
  EXPECT_FLOAT_EQ(params->sampling.temperature(), 0.0f);

  // Without model defaults the API's: greedy for gRPC, `unset_temperature` for OpenAI.
  request.mutable_sampling()->clear_temperature();
  params = ValidateGenerateRequest(request, *config_, *tokenizer_);
  ASSERT_TRUE(params.ok()) << params.status();
  EXPECT_FLOAT_EQ(params->sampling.temperature(), 0.0f);
  params = ValidateGenerateRequest(request, *config_, *tokenizer_, /*unset_temperature=*/1.0f);
  ASSERT_TRUE(params.ok()) << params.status();
  EXPECT_FLOAT_EQ(params->sampling.temperature(), 1.0f);
}

TEST_F(RequestValidationTest, RejectsStopTokenIdsOutsideTheVocabulary) {
  loom::v1::GenerateRequest request;
  request.set_text("hello");
  request.add_stop_token_ids(-3);
  EXPECT_THAT(Validate(request).status().message(), HasSubstr("stop_token_ids"));
}

TEST_F(RequestValidationTest, StopStringsHaveNoCountLimitButABoundedTotalLength) {
  loom::v1::GenerateRequest request;
  request.set_text("hello");
  for (int i = 0; i < 100; ++i) request.add_stop(absl::StrCat("stop ", i));
  absl::StatusOr<RequestParams> many = Validate(request);
  ASSERT_TRUE(many.ok()) << many.status();
  EXPECT_EQ(many->stop.size(), 100u);
  request.add_stop(std::string(kMaxStopStringBytes, 'x'));
  EXPECT_THAT(Validate(request).status().message(), HasSubstr("at most 8192"));
}

}  // namespace
}  // namespace loom::engine
