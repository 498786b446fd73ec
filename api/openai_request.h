#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/jinja/chat_template.h"
#include "common/tokenizer/tokenizer.h"
#include "api/openai_tools.h"
#include "loom/v1/inference.pb.h"

namespace loom::api {

/// Which OpenAI endpoint a body was sent to.
enum class OpenAiEndpoint { kCompletions, kChatCompletions };

/// An OpenAI completions or chat-completions request, parsed and checked for everything
/// the OpenAI API itself defines (types, ranges, counts), as loom.v1.GenerateRequest
/// prompts that the gRPC API's validation (context length, vocabulary) then checks like
/// any other. OpenAI/vLLM fields Loom does not implement are refused (400 naming them)
/// unless given their no-op value; fields no API defines are ignored, as the reference
/// servers do.
struct OpenAiRequest {
  OpenAiEndpoint endpoint = OpenAiEndpoint::kCompletions;
  std::string model;
  // One GenerateRequest per prompt (a completions `prompt` may be a list); each is run
  // `n` times. Sampling fields the client left out stay unset (the gRPC defaults).
  std::vector<loom::v1::GenerateRequest> prompts;
  // The text to echo per prompt (completions with echo = true).
  std::vector<std::string> echo_texts;
  int32_t n = 1;
  bool stream = false;
  bool include_usage = false;   // stream_options.include_usage
  // vLLM's stream_options.continuous_usage_stats (with include_usage): every chunk carries
  // the usage so far, not only the last.
  bool continuous_usage = false;
  bool echo = false;
  // Completions: `logprobs` (top-n, 0..20). Chat: `logprobs: true` and `top_logprobs`.
  // -1: none.
  int32_t num_logprobs = -1;
  // vLLM's return_tokens_as_token_ids: logprobs name tokens "token_id:<id>".
  bool return_token_ids = false;
  // vLLM's prompt_logprobs (top-n per prompt token, 0..20); -1: none.
  int32_t prompt_logprobs = -1;
  bool seed_given = false;
  std::string user;
  // vLLM's request_id (a client's name for the request; the X-Request-Id header wins):
  // responses' ids and logs carry it. Empty: none given (the server makes one).
  std::string request_id;
  // Chat: tools, tool_choice, parallel_tool_calls (or the legacy functions/function_call).
  ToolsRequest tools;
};

/// Errors carry the OpenAI error's `param` as a payload of the status.
inline constexpr char kOpenAiParamPayload[] = "loom.openai.param";
/// InvalidArgument with `message`, naming `param` (the OpenAI error's `param`; "" for none).
absl::Status InvalidOpenAiParam(const std::string& param, const std::string& message);
/// The offending parameter of an InvalidArgument from ParseOpenAiRequest, "" if none.
std::string OpenAiErrorParam(const absl::Status& status);

/// Parses a JSON body. InvalidArgument (with the parameter named) for malformed JSON,
/// wrong types and values out of range; the chat template renders `messages` (its own
/// errors are InvalidArgument too). `chat_template` may be null: chat requests are then
/// InvalidArgument.
absl::StatusOr<OpenAiRequest> ParseOpenAiRequest(OpenAiEndpoint endpoint, const std::string& body,
                                                 const common::Tokenizer& tokenizer,
                                                 const common::ChatTemplate* chat_template);

}  // namespace loom::api
