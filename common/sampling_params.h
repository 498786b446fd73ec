#pragma once

// How one sequence picks its next token: the one definition of the sampling parameters,
// their defaults, their valid ranges and the protocol's limits, shared by the coordinator
// (client requests), the workers (the step protocol) and the in-process engine.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "loom/v1/worker.pb.h"

namespace loom::common {

/// Most draft tokens one speculative step may ask for (ScheduledSequence, the
/// `--speculative-tokens` flag and a request's num_speculative_tokens).
inline constexpr int32_t kMaxSpeculativeTokens = 16;
/// Most alternatives per token a request may ask logprobs for (OpenAI's limit).
inline constexpr int32_t kMaxLogprobs = 20;

/// The parameters of one sequence's sampling (OpenAI / vLLM semantics). The defaults are
/// those of Loom's gRPC API (loom.v1.SamplingParams, where an unset field takes them):
/// greedy decoding. The OpenAI-compatible HTTP API applies OpenAI's own default
/// temperature (1) before converting (api/openai_request.cc).
struct SamplingParams {
  float temperature = 0.0f;         // >= 0; 0: greedy (argmax, lowest id on ties)
  int32_t top_k = 0;                // >= 0; 0: off
  float top_p = 1.0f;               // (0, 1]
  float min_p = 0.0f;               // [0, 1]: drop tokens below min_p * max probability
  float repetition_penalty = 1.0f;  // > 0; HF style over prompt and output tokens; 1: off
  float presence_penalty = 0.0f;    // [-2, 2]; OpenAI style over output tokens
  float frequency_penalty = 0.0f;   // [-2, 2]; OpenAI style over output tokens
  uint64_t seed = 0;                // with the same seed, the same tokens, whatever the batch
  int32_t num_logprobs = -1;        // -1: none; 0: the chosen token's; n: and the top n
  // Structured output: a GrammarKindName ("json_schema", "regex", ...) and its text;
  // an empty kind: unconstrained.
  std::string grammar_kind;
  std::string grammar_text;
  // (token id, bias) added to the logit before everything else; ids distinct and in the
  // vocabulary, biases in [-100, 100] (OpenAI's logit_bias). Sorted by id.
  std::vector<std::pair<int32_t, float>> logit_bias;
  // While fewer than min_tokens outputs exist, min_tokens_suppressed_ids cannot be
  // sampled (the end-of-generation and stop tokens; vLLM's min_tokens).
  int32_t min_tokens = 0;
  std::vector<int32_t> min_tokens_suppressed_ids;

  bool operator==(const SamplingParams&) const = default;
};

/// OK when every parameter is in range (and num_logprobs at most min(kMaxLogprobs,
/// vocab_size)); otherwise InvalidArgument naming the parameter, its range and its value.
/// The grammar's kind must be a known one; whether its text compiles is checked where it
/// is compiled. Thread-safe.
absl::Status ValidateSamplingParams(const SamplingParams& params, int64_t vocab_size);

/// The parameters a proto carries; an unset field takes its default (SamplingParams{}).
/// Used for the client API (unset means default) and the worker protocol alike.
SamplingParams SamplingParamsFromProto(const loom::v1::SamplingParams& proto);

/// The proto with every field set (the worker protocol requires it); the grammar only
/// when there is one. SamplingParamsFromProto(SamplingParamsToProto(p)) == p.
loom::v1::SamplingParams SamplingParamsToProto(const SamplingParams& params);

}  // namespace loom::common
