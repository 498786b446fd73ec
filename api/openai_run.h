#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "api/openai_request.h"
#include "api/reasoning_parser.h"
#include "engine/request.h"
#include "nlohmann/json.hpp"

// What one OpenAI completion or chat request runs (api/openai_service places it,
// api/openai_answer answers it).
namespace loom::api {

// ordered_json keeps the keys in the order OpenAI writes them (id, object, created...).
using Json = nlohmann::ordered_json;

// Token strings are raw bytes and may split a UTF-8 character: replace, never throw.
inline std::string Dump(const Json& json) {
  return json.dump(-1, ' ', false, Json::error_handler_t::replace);
}

/// OpenAI's error body for `status` answered with `http_status`.
Json OpenAiErrorJson(const absl::Status& status, int http_status);

// One sample of one prompt: its loom Request and what has reached the client so far.
struct Choice {
  int index = 0;
  int prompt_index = 0;
  std::shared_ptr<engine::Request> request;
  std::string text;  // everything so far (non-streaming)
  Json logprobs;     // OpenAI logprobs object, accumulated; null when not asked
  int32_t completion_tokens = 0;
  loom::v1::FinishReason finish = loom::v1::FINISH_REASON_UNSPECIFIED;
  std::string error;
  int32_t cached_prompt_tokens = 0;  // from the final event
  // The prompt's scores, from the final event (echo with logprobs, prompt_logprobs).
  std::vector<std::optional<engine::PromptTokenLogprob>> prompt_logprobs;
  // n > 1: samples after the first wait for it (`leader`) to produce a token, by which
  // time the prompt's KV blocks are in the prefix cache and the samples share them
  // instead of each computing the prompt again. -1: placed at once.
  int leader = -1;
  bool placed = false;
  bool started = false;               // streaming: the first chunk (role, echo) went out
  std::string reply;                  // streaming with tools: the whole reply so far
  size_t streamed = 0;                // streaming with tools: bytes of `reply` sent as content
  size_t reasoning_streamed = 0;      // gpt-oss: bytes of its reasoning sent
  std::vector<std::string> call_ids;  // streaming with tools: calls sent so far
  std::vector<std::string> call_arguments_sent;  //   and their arguments sent
  int64_t text_offset = 0;  // completions logprobs: where the next token's text starts
  // Chat with --reasoning-parser: splits the streamed reply (whole replies are split at
  // the end, SplitReasoning). Null otherwise.
  std::shared_ptr<ReasoningStream> reasoning;
  absl::Time hold_until = absl::InfinitePast();  // its next output is not taken before
};

// The header naming a request (vLLM's, and most gateways' and tracers'): taken from the
// client when it sends one, answered on every completion response.
inline constexpr char kRequestIdHeader[] = "X-Request-Id";

// Everything one HTTP request runs: its choices, the client's connection, and the
// numbers its response reports.
struct Run {
  OpenAiRequest parsed;
  std::string id;          // "cmpl-" / "chatcmpl-" and the request id
  std::string request_id;  // X-Request-Id (answered in that header)
  int64_t created = 0;
  std::string model;
  std::vector<Choice> choices;
  // Chat with --reasoning-parser: whether the reply starts inside the thinking (the
  // rendered prompt opened it). Unset: no reasoning parser.
  std::optional<bool> reasoning_starts_inside;
  int32_t prompt_tokens = 0;
  std::function<absl::Status(const std::shared_ptr<engine::Request>&)> place;  // Cluster::Submit
  absl::Duration stream_interval;  // the least time between two outputs of a choice

  // Places the samples whose leader has produced output (or finished); a sample that
  // cannot be placed ends with an error event of its own.
  void PlaceFollowers() {
    for (Choice& choice : choices) {
      if (choice.placed) continue;
      const Choice& leader = choices[choice.leader];
      if (leader.completion_tokens == 0 && leader.finish == loom::v1::FINISH_REASON_UNSPECIFIED) {
        continue;
      }
      choice.placed = true;
      if (absl::Status placed = place(choice.request); !placed.ok()) {
        choice.request->Finish(loom::v1::FINISH_REASON_ERROR, std::string(placed.message()), "");
      }
    }
  }

  bool done() const {
    for (const Choice& choice : choices) {
      if (choice.finish == loom::v1::FINISH_REASON_UNSPECIFIED) return false;
    }
    return true;
  }
  void CancelAll() {
    for (Choice& choice : choices) {
      if (choice.request != nullptr && choice.placed) choice.request->Cancel();
    }
  }
  int32_t completion_tokens() const {
    int32_t total = 0;
    for (const Choice& choice : choices) total += choice.completion_tokens;
    return total;
  }
  Json Usage() const {
    Json usage;
    usage["prompt_tokens"] = prompt_tokens;
    usage["completion_tokens"] = completion_tokens();
    usage["total_tokens"] = prompt_tokens + completion_tokens();
    // Prompt tokens served from the prefix cache, once per prompt (its first sample's).
    int32_t cached = 0;
    std::vector<bool> counted(parsed.prompts.size(), false);
    for (const Choice& choice : choices) {
      if (counted[choice.prompt_index]) continue;
      counted[choice.prompt_index] = true;
      cached += choice.cached_prompt_tokens;
    }
    usage["prompt_tokens_details"] = {{"cached_tokens", cached}};
    return usage;
  }
};

}  // namespace loom::api
