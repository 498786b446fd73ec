#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "client/chat.h"

namespace loom::client {

enum class FinishReason {
  kNone,    // not finished (every chunk but the last)
  kStop,    // EOS, a stop token or a stop string
  kLength,  // max_tokens or the context length
  kAbort,   // cancelled or the coordinator shut down
  kError,   // a worker failed after output had started (see error_message)
};

/// "stop", "length", "abort", "error" or "none".
std::string_view FinishReasonName(FinishReason reason);

/// The logprob of one generated token, with the most likely alternatives when asked for.
struct TokenLogprobs {
  int32_t token_id = 0;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;  // (token id, logprob), most likely first
};

struct Usage {
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;
  int32_t cached_prompt_tokens = 0;  // prompt tokens served from the prefix cache
};

/// One streamed message: the output since the previous chunk. The last chunk of a call
/// has `finish_reason` set and carries the usage.
struct GenerateChunk {
  std::string request_id;
  std::string text;  // complete UTF-8 only
  std::vector<int32_t> token_ids;
  std::vector<TokenLogprobs> logprobs;  // one per token id when logprobs were requested
  FinishReason finish_reason = FinishReason::kNone;
  std::string error_message;  // with kError
  Usage usage;                // on the last chunk
  std::string replica_id;     // on the first chunk
  // A chat with tools, last chunk: the calls parsed out of the whole reply, and the
  // reply's text outside them (`text` is the model's raw output).
  std::vector<ToolCall> tool_calls;
  std::string content;
  // A chat's reasoning, last chunk (gpt-oss's analysis channel, or the <think> part under
  // the server's --reasoning-parser); unset when there was none.
  std::optional<std::string> reasoning_content;
};

/// A whole completion: every chunk of a call joined.
struct Completion {
  std::string request_id;
  std::string text;
  std::vector<int32_t> token_ids;
  std::vector<TokenLogprobs> logprobs;
  FinishReason finish_reason = FinishReason::kNone;
  std::string error_message;
  Usage usage;
  std::string replica_id;
  int attempts = 0;  // calls made, retries of UNAVAILABLE included
  std::vector<ToolCall> tool_calls;  // a chat with tools: the calls the model made
  std::string content;               // a chat with tools: the reply's text outside them
  std::optional<std::string> reasoning_content;  // a chat's reasoning, when it had some

  /// Appends `chunk` (text, ids, logprobs; the final fields when it is the last).
  void Append(const GenerateChunk& chunk);
};

}  // namespace loom::client
