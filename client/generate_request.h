#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "client/chat.h"

namespace loom::client {

/// Sampling settings; every unset field takes the server's default (greedy decoding,
/// no penalties, no logprobs).
struct SamplingOptions {
  std::optional<float> temperature;         // >= 0; 0 is greedy
  std::optional<int32_t> top_k;             // 0: off
  std::optional<float> top_p;               // (0, 1]
  std::optional<float> min_p;               // [0, 1]
  std::optional<float> repetition_penalty;  // > 0; 1 is off
  std::optional<float> presence_penalty;    // [-2, 2]
  std::optional<float> frequency_penalty;   // [-2, 2]
  std::optional<uint64_t> seed;
  /// -1 or unset: none; 0: the chosen token's logprob; n: and the n most likely tokens.
  std::optional<int32_t> num_logprobs;
  /// (token id, bias in [-100, 100]) added to the token's logit (OpenAI's logit_bias).
  std::vector<std::pair<int32_t, float>> logit_bias;
  /// End-of-generation and stop tokens cannot end the output before this many tokens.
  std::optional<int32_t> min_tokens;
};

/// Structured output: the completion is constrained to a grammar's language.
struct OutputConstraint {
  /// "json_schema" (text: the schema), "json_object" (text empty), "regex", "choice"
  /// (text: a JSON array of strings) or "grammar" (GBNF, rule "root").
  std::string kind;
  std::string text;
};

/// One completion to generate. Exactly one of `text` and `token_ids` is the prompt:
/// `token_ids` when `use_token_ids` is true (an empty id list is then still a token prompt);
/// or, for a chat, `messages` (with `text` empty and `use_token_ids` false).
struct GenerateRequest {
  std::string text;  // tokenized by the coordinator, special tokens parsed
  std::vector<int32_t> token_ids;
  bool use_token_ids = false;
  SamplingOptions sampling;
  int32_t max_tokens = 0;         // 0: up to the context length
  std::vector<std::string> stop;  // stop strings; the matched text is not returned
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  int32_t priority = 0;    // lower runs first
  std::string request_id;  // empty: the coordinator assigns one
  std::string model;       // empty: the served model
  std::string cache_salt;  // prefix-cache isolation between tenants
  std::optional<OutputConstraint> constraint;  // unset: unconstrained
  bool include_stop_str_in_output = false;     // the matched stop string is returned too
  std::optional<bool> skip_special_tokens;     // unset: true (special tokens' text left out)
  // A chat instead of a prompt (see Client::Chat): the messages, the tools the model may
  // call, and which calls it must make.
  std::vector<ChatMessage> messages;
  std::vector<Tool> tools;
  ToolChoice tool_choice;
  std::optional<bool> parallel_tool_calls;  // unset: true
  // How the chat ends: the template's generation prompt (unset: true), or the last
  // message (a prefilled assistant reply) left open for the model to continue
  // (continue_final_message, with add_generation_prompt false).
  std::optional<bool> add_generation_prompt;
  bool continue_final_message = false;
  // Further variables of the chat template, a JSON object as text (vLLM's
  // chat_template_kwargs, e.g. R"({"enable_thinking": false})"), and OpenAI's
  // reasoning_effort ("minimal", "low", "medium", "high"; gpt-oss's template says it).
  std::string chat_template_kwargs;
  std::string reasoning_effort;

  /// A text prompt.
  static GenerateRequest FromText(std::string prompt, int32_t max_tokens) {
    GenerateRequest request;
    request.text = std::move(prompt);
    request.max_tokens = max_tokens;
    return request;
  }
  /// A token-id prompt.
  static GenerateRequest FromTokenIds(std::vector<int32_t> ids, int32_t max_tokens) {
    GenerateRequest request;
    request.token_ids = std::move(ids);
    request.use_token_ids = true;
    request.max_tokens = max_tokens;
    return request;
  }
};

}  // namespace loom::client
