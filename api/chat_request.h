#pragma once

// A chat (messages, tools, tool_choice) as a GenerateRequest: the one place where both
// /v1/chat/completions and the gRPC API (GenerateRequest.messages) render a conversation
// with the model's chat template, constrain required / named tool calls with the grammar
// engine, and parse the model's reply back into tool calls.

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "api/openai_tools.h"
#include "api/tool_call_parser.h"
#include "common/jinja/chat_template.h"
#include "common/tokenizer/tokenizer.h"
#include "loom/v1/inference.pb.h"
#include "nlohmann/json.hpp"

namespace loom::api {

/// How a rendered chat ends (vLLM's request fields of these names): the template's
/// generation prompt after the last message (the default), nothing after it
/// (`add_generation_prompt` false), or the last message's text left open for the model to
/// continue (`continue_final_message`: the client prefilled the start of the reply; the
/// prompt is cut right after that text, as transformers' apply_chat_template cuts it).
struct ChatRenderOptions {
  bool add_generation_prompt = true;
  bool continue_final_message = false;
};

/// The prompt text of `messages` (OpenAI-shaped; see TemplateMessages) and `tools`,
/// rendered by `chat_template` and ended as `options` say. `template_kwargs` (vLLM's
/// `chat_template_kwargs`, e.g. Qwen3's `enable_thinking`), when given, are further
/// variables of the template; they may override the two options (as in vLLM), not the
/// messages or tools. InvalidArgument (param "messages", "continue_final_message" or
/// "chat_template_kwargs") for bad messages, kwargs, both options true, a final message
/// the template does not keep, or a template error.
absl::StatusOr<std::string> RenderChatPrompt(
    const nlohmann::ordered_json& messages, const ToolsRequest& tools,
    const common::Tokenizer& tokenizer, const common::ChatTemplate& chat_template,
    const nlohmann::ordered_json* template_kwargs = nullptr, ChatRenderOptions options = {});

/// The template's variables beyond the messages: `reasoning_effort` (OpenAI's field: gpt-oss's
/// harmony template says it in its system message, "Reasoning: high"), then `kwargs` (vLLM's
/// chat_template_kwargs) over it (vLLM's precedence); null when neither is given.
/// InvalidArgument (param "reasoning_effort") for an effort other than minimal, low, medium
/// or high; kwargs that are not an object come back as they are, for RenderChatPrompt to
/// refuse.
absl::StatusOr<std::optional<nlohmann::ordered_json>> ChatTemplateVariables(
    const std::optional<std::string>& reasoning_effort, const nlohmann::ordered_json* kwargs);

/// The token ids of a rendered chat prompt (the template writes BOS itself; its special
/// tokens are parsed).
std::vector<int32_t> EncodeChatPrompt(std::string_view rendered,
                                      const common::Tokenizer& tokenizer);

/// tool_choice `required` or a named function: sets `request`'s grammar to a valid call
/// (InvalidArgument naming the schema construct the grammar engine cannot compile, param
/// `tools_param`, or naming `choice_param` when the request already has a constraint).
/// Mistral's format keeps special tokens in the text (its [TOOL_CALLS] is one).
absl::Status ApplyToolConstraint(const ToolsRequest& tools, const char* tools_param,
                                 const char* choice_param, loom::v1::GenerateRequest& request);

/// Whether `request` has any of the chat fields (messages, tools, tool_choice,
/// parallel_tool_calls, add_generation_prompt, continue_final_message,
/// chat_template_kwargs, reasoning_effort): PrepareChatRequest has work to do, or an error
/// to give.
bool HasChatFields(const loom::v1::GenerateRequest& request);

/// The gRPC API's chat: turns `request`'s messages, tools, tool_choice and
/// parallel_tool_calls into the token-id prompt (and the grammar, see ApplyToolConstraint),
/// exactly as the same OpenAI chat request would be (add_generation_prompt,
/// continue_final_message, chat_template_kwargs and reasoning_effort included); the chat
/// fields are cleared. Returns the tools, to parse the reply with. InvalidArgument for
/// messages together with a prompt, chat fields without messages, malformed tools
/// (parameters that are not JSON), kwargs or messages, and FailedPrecondition when
/// `chat_template` is null (the model has none). `rendered` (optional) receives the prompt's
/// text.
absl::StatusOr<ToolsRequest> PrepareChatRequest(loom::v1::GenerateRequest& request,
                                                const common::Tokenizer& tokenizer,
                                                const common::ChatTemplate* chat_template,
                                                std::string* rendered = nullptr);

/// A finished reply split into content (trailing whitespace before calls dropped) and
/// the calls in `tools`' format, cut to one when parallel calls are off.
struct ChatReply {
  std::string content;
  std::vector<ParsedToolCall> calls;
  std::optional<std::string> reasoning;  // gpt-oss: the analysis channel
};
ChatReply ParseChatReply(const ToolsRequest& tools, std::string_view text);

}  // namespace loom::api
