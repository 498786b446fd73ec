#pragma once

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/grammar/grammar_spec.h"
#include "api/tool_call_parser.h"
#include "nlohmann/json.hpp"

namespace loom::api {

/// A client's `object[key]` as a name to compare: the string when it is one, `fallback`
/// when it is absent or null, and "<not a string>" (no valid name) for any other JSON
/// type, so comparisons fall into the caller's 400 (Json::value threw, a 500).
std::string NameField(const nlohmann::ordered_json& object, const char* key,
                      const char* fallback = "");

/// OpenAI's tool_choice.
enum class ToolChoice { kNone, kAuto, kRequired, kNamed };

/// The tool fields of a chat request (`tools`, `tool_choice`, `parallel_tool_calls`, and
/// the legacy `functions` / `function_call`, mapped onto them), checked.
struct ToolsRequest {
  /// [{"type": "function", "function": {"name", "description"?, "parameters"?}}], in the
  /// client's order; empty: no tools.
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();
  ToolChoice choice = ToolChoice::kNone;
  std::string named_function;  // kNamed: the function that must be called
  bool parallel = true;        // more than one call per reply allowed
  bool legacy = false;         // given as functions/function_call
  ToolCallFormat format = ToolCallFormat::kGeneric;
  bool template_renders_tools = false;  // else: the generic system prompt
  StringParameters string_parameters;   // the tools' string parameters, by function

  /// Tool calls are looked for in the reply (tools given and tool_choice not "none").
  bool active() const { return !tools.empty() && choice != ToolChoice::kNone; }
  /// The reply goes through the format's parser: tools are active, or the format splits
  /// every reply (gpt-oss's channels: reasoning, content and calls).
  bool parses_reply() const { return active() || format == ToolCallFormat::kGptOss; }
};

/// Parses the tool fields of `body` for a model whose chat template has `template_source`
/// ("" without a template). InvalidArgument naming the param (OpenAI payload) for
/// malformed tools, a tool_choice naming an unknown function, and `required` or a
/// named function without tools.
absl::StatusOr<ToolsRequest> ParseToolsRequest(const nlohmann::ordered_json& body,
                                               std::string_view template_source);

/// The template's `messages`: the client's messages with every field kept (assistant
/// `tool_calls` with their arguments parsed into objects, as Hugging Face templates
/// expect; `tool` messages with `tool_call_id`), content parts joined into text. For
/// templates that do not render tools (ToolsRequest::template_renders_tools false) with
/// tools active: the generic system prompt (GenericToolPrompt) is added to the first
/// system message (or one is inserted), assistant tool calls become their generic JSON
/// text and `tool` messages become user messages holding {"tool_response": ...}, as
/// llama.cpp's generic format does. InvalidArgument (param "messages") for bad shapes.
absl::StatusOr<nlohmann::ordered_json> TemplateMessages(const nlohmann::ordered_json& messages,
                                                        const ToolsRequest& tools);

/// The system prompt of the generic format: the tools' JSON and how to call them.
std::string GenericToolPrompt(const nlohmann::ordered_json& tools);

/// The grammar that makes the reply a valid call (tool_choice `required` or a named
/// function) in the request's format: a JSON Schema of the calls (generic, Llama 3) or
/// framed calls (Hermes, Mistral). For `auto`, free text until the reply starts a call in
/// that format (Hermes' <tool_call>, Mistral's [TOOL_CALLS], a generic or Llama 3 reply
/// that starts with '{'), the call then held to the schemas (kToolCalls with a trigger);
/// nullopt for `auto` in the pythonic, Qwen3-Coder and DeepSeek-V3 formats and for `none`.
std::optional<common::GrammarSpec> ToolCallConstraint(const ToolsRequest& tools);

}  // namespace loom::api
