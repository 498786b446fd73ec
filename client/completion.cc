#include "client/completion.h"

namespace loom::client {

std::string_view FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
    case FinishReason::kError:
      return "error";
    case FinishReason::kNone:
      break;
  }
  return "none";
}

void Completion::Append(const GenerateChunk& chunk) {
  if (request_id.empty()) request_id = chunk.request_id;
  if (replica_id.empty()) replica_id = chunk.replica_id;
  text += chunk.text;
  token_ids.insert(token_ids.end(), chunk.token_ids.begin(), chunk.token_ids.end());
  logprobs.insert(logprobs.end(), chunk.logprobs.begin(), chunk.logprobs.end());
  if (chunk.finish_reason != FinishReason::kNone) {
    finish_reason = chunk.finish_reason;
    error_message = chunk.error_message;
    usage = chunk.usage;
    tool_calls = chunk.tool_calls;
    content = chunk.content;
    reasoning_content = chunk.reasoning_content;
  }
}

}  // namespace loom::client
