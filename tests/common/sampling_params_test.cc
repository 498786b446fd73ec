#include "common/sampling_params.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

namespace loom::common {
namespace {

// The one set of defaults: the struct's, what an empty proto converts to (the gRPC API's
// unset fields), and what the worker protocol carries for them, all equal to the values
// the API documents (greedy, filters and penalties off, no logprobs).
TEST(SamplingParamsTest, StructAndBothConversionsShareOneSetOfDefaults) {
  const SamplingParams defaults;
  EXPECT_EQ(defaults.temperature, 0.0f);  // greedy: loom.v1.SamplingParams documents it
  EXPECT_EQ(defaults.top_k, 0);
  EXPECT_EQ(defaults.top_p, 1.0f);
  EXPECT_EQ(defaults.min_p, 0.0f);
  EXPECT_EQ(defaults.repetition_penalty, 1.0f);
  EXPECT_EQ(defaults.presence_penalty, 0.0f);
  EXPECT_EQ(defaults.frequency_penalty, 0.0f);
  EXPECT_EQ(defaults.seed, 0u);
  EXPECT_EQ(defaults.num_logprobs, -1);
  EXPECT_TRUE(defaults.grammar_kind.empty());

  EXPECT_EQ(SamplingParamsFromProto(loom::v1::SamplingParams()), defaults);

  const loom::v1::SamplingParams wire = SamplingParamsToProto(defaults);
  ASSERT_TRUE(wire.has_temperature() && wire.has_top_k() && wire.has_top_p() &&
              wire.has_min_p() && wire.has_repetition_penalty() &&
              wire.has_presence_penalty() && wire.has_frequency_penalty() && wire.has_seed() &&
              wire.has_num_logprobs());
  EXPECT_FALSE(wire.has_grammar());
  EXPECT_EQ(wire.temperature(), defaults.temperature);
  EXPECT_EQ(wire.top_p(), defaults.top_p);
  EXPECT_EQ(wire.repetition_penalty(), defaults.repetition_penalty);
  EXPECT_EQ(wire.num_logprobs(), defaults.num_logprobs);
  EXPECT_TRUE(ValidateSamplingParams(defaults, 100).ok());
}

TEST(SamplingParamsTest, EveryFieldSurvivesBothRoundTrips) {
  SamplingParams params;
  params.temperature = 0.7f;
  params.top_k = 40;
  params.top_p = 0.9f;
  params.min_p = 0.05f;
  params.repetition_penalty = 1.2f;
  params.presence_penalty = -0.5f;
  params.frequency_penalty = 1.5f;
  params.seed = 0xfedcba9876543210ULL;  // above 2^63: the full uint64 range
  params.num_logprobs = 5;
  params.grammar_kind = "regex";
  params.grammar_text = "(ab)+";
  EXPECT_EQ(SamplingParamsFromProto(SamplingParamsToProto(params)), params);

  // Proto -> struct -> proto keeps a fully set proto as it was.
  const loom::v1::SamplingParams wire = SamplingParamsToProto(params);
  EXPECT_EQ(SamplingParamsToProto(SamplingParamsFromProto(wire)).SerializeAsString(),
            wire.SerializeAsString());
}

TEST(SamplingParamsTest, UnsetFieldsTakeDefaultsAndSetOnesKeepTheirValues) {
  loom::v1::SamplingParams partial;
  partial.set_temperature(0.0f);  // set to the default's value: still 0
  partial.set_top_p(0.5f);
  partial.set_seed(9);
  const SamplingParams params = SamplingParamsFromProto(partial);
  EXPECT_EQ(params.temperature, 0.0f);
  EXPECT_EQ(params.top_p, 0.5f);
  EXPECT_EQ(params.seed, 9u);
  EXPECT_EQ(params.top_k, SamplingParams().top_k);
  EXPECT_EQ(params.num_logprobs, SamplingParams().num_logprobs);
}

TEST(SamplingParamsTest, OutOfRangeValuesAreRefusedNamingTheParameterAndValue) {
  struct Case {
    const char* name;
    void (*set)(SamplingParams&);
    const char* expected;
  };
  const Case cases[] = {
      {"negative temperature", [](SamplingParams& p) { p.temperature = -1.0f; },
       "temperature must be finite and >= 0, got -1"},
      {"NaN temperature",
       [](SamplingParams& p) { p.temperature = std::numeric_limits<float>::quiet_NaN(); },
       "temperature"},
      {"infinite temperature",
       [](SamplingParams& p) { p.temperature = std::numeric_limits<float>::infinity(); },
       "temperature"},
      {"top_p 0", [](SamplingParams& p) { p.top_p = 0.0f; }, "top_p must be in (0, 1], got 0"},
      {"top_p above 1", [](SamplingParams& p) { p.top_p = 1.5f; }, "top_p must be in (0, 1], got 1.5"},
      {"min_p above 1", [](SamplingParams& p) { p.min_p = 2.0f; }, "min_p must be in [0, 1], got 2"},
      {"negative top_k", [](SamplingParams& p) { p.top_k = -3; }, "top_k must be >= 0"},
      {"zero repetition penalty", [](SamplingParams& p) { p.repetition_penalty = 0.0f; },
       "repetition_penalty must be finite and > 0, got 0"},
      {"presence penalty above 2", [](SamplingParams& p) { p.presence_penalty = 2.5f; },
       "presence_penalty must be in [-2, 2], got 2.5"},
      {"frequency penalty below -2", [](SamplingParams& p) { p.frequency_penalty = -3.0f; },
       "frequency_penalty must be in [-2, 2], got -3"},
      {"too many logprobs", [](SamplingParams& p) { p.num_logprobs = kMaxLogprobs + 1; },
       "logprobs must be between 0 and 20, got 21"},
      {"logprobs below -1", [](SamplingParams& p) { p.num_logprobs = -2; }, "logprobs"},
      {"unknown grammar kind", [](SamplingParams& p) { p.grammar_kind = "xml"; }, "xml"},
  };
  for (const Case& c : cases) {
    SamplingParams params;
    c.set(params);
    const absl::Status status = ValidateSamplingParams(params, 1000);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_NE(std::string(status.message()).find(c.expected), std::string::npos)
        << c.name << ": " << status.message();
  }
  // The logprobs limit is the vocabulary's size when that is smaller.
  SamplingParams params;
  params.num_logprobs = 5;
  EXPECT_FALSE(ValidateSamplingParams(params, 4).ok());
  EXPECT_TRUE(ValidateSamplingParams(params, 5).ok());
}

}  // namespace
}  // namespace loom::common
