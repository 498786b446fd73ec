#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "api/xml_tool_calls.h"

namespace loom::api {

/// How a model writes tool calls, chosen from its chat template's source.
enum class ToolCallFormat {
  /// Templates without tool support (the default SmolLM2's): Loom renders the tools into
  /// a system prompt and the model answers with one JSON object
  ///   {"tool_calls": [{"name": "...", "arguments": {...}}]}
  /// (also accepted: {"tool_call": {...}} and a bare {"name": ..., "arguments": ...}).
  kGeneric,
  /// Hermes / Qwen2.5 / Qwen3: <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>,
  /// once per call, after optional content.
  kHermes,
  /// Llama 3.1 / 3.2: the whole reply is {"name": ..., "parameters": {...}} (optionally
  /// after <|python_tag|>; several calls separated by ';').
  kLlama3Json,
  /// Mistral: [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...] after optional content.
  kMistral,
  /// IBM Granite 3.x: Mistral's list after <|tool_call|> instead.
  kGranite,
  /// Llama 3.2 / Llama 4 pythonic: the whole reply is [name(key=value, ...), ...] with
  /// Python literals as values.
  kPythonic,
  /// Qwen3-Coder: <tool_call><function=NAME><parameter=KEY>value</parameter>...</function>
  /// </tool_call> after optional content; a value that reads as JSON (a number, true,
  /// an object...) is that value, anything else a string.
  kQwen3Coder,
  /// GLM-4.5 / 4.6: <tool_call>NAME\n<arg_key>KEY</arg_key>\n<arg_value>VALUE</arg_value>...
  /// </tool_call> after optional content (GLM-4.7: the same without the newlines); values
  /// as Qwen3-Coder's.
  kGlm45,
  /// DeepSeek-V3: <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
  /// ```json {...} ```<｜tool▁call▁end｜>... after optional content; V3.1's
  /// <｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜> too.
  kDeepSeekV3,
  /// gpt-oss (OpenAI harmony): channels in special tokens; a message to functions.NAME is
  /// a call, "analysis" is reasoning, "final" the answer (api/harmony_reply.h).
  kGptOss,
};

/// "generic", "hermes", "llama3_json", "mistral", "granite", "pythonic", "qwen3_coder",
/// "glm45", "deepseek_v3", "gpt_oss" (vLLM's --tool-call-parser names).
const char* ToolCallFormatName(ToolCallFormat format);

/// The format `template_source` (a Jinja chat template) speaks: Qwen3-Coder when it writes
/// <function=, GLM-4.5 when it writes <arg_key>, DeepSeek-V3 for <｜tool▁calls▁begin｜>, Hermes for
/// <tool_call>, Mistral for [TOOL_CALLS], pythonic for the [func_name1(...)] example Llama's
/// pythonic templates give, Llama 3 JSON for <|python_tag|> or an ipython role; anything else
/// (including templates that never mention tools) is kGeneric.
ToolCallFormat ToolCallFormatOf(std::string_view template_source);

/// True when the template renders `tools` itself (it mentions them); otherwise Loom adds
/// the generic system prompt and rewrites tool messages (see openai_tools.h).
bool TemplateRendersTools(std::string_view template_source);

/// One call parsed out of the model's text.
struct ParsedToolCall {
  std::string name;
  std::string arguments;  // JSON text (an object), as OpenAI's function.arguments
};

/// The model's reply split into content and calls.
struct ParsedReply {
  /// The content is text[0, content_end) (all of it when there are no calls), unless
  /// `content` is set (gpt-oss: the final channel, not a prefix of the text).
  size_t content_end = 0;
  std::vector<ParsedToolCall> calls;
  std::optional<std::string> content;
  std::optional<std::string> reasoning;  // gpt-oss: the analysis channel
};

/// Parses the complete reply `text` in `format`. Text that is not a well-formed call of
/// the format (malformed JSON, no name) is content: no calls, content_end = size.
/// `string_parameters`: the tools' string parameters, for the formats whose values are bare
/// text (Qwen3-Coder, GLM-4.5; see xml_tool_calls.h).
ParsedReply ParseToolCalls(ToolCallFormat format, std::string_view text,
                           const StringParameters& string_parameters = {});

/// The marker before the JSON list of calls of the list formats: Mistral's [TOOL_CALLS],
/// Granite's <|tool_call|> (kMistral, kGranite; "" for the others).
std::string_view CallListMarker(ToolCallFormat format);

/// Streaming: how many leading bytes of the reply so far, `text`, are content for sure
/// (they cannot become part of a tool call, whatever follows). The rest is held back
/// until more text or the end decides. Monotonic in `text`'s growth.
size_t StreamableContent(ToolCallFormat format, std::string_view text);

/// A fresh call id: "call_" and 24 random letters and digits. Thread-safe.
std::string NewToolCallId();

}  // namespace loom::api
