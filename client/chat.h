#pragma once

// Chat with tools over gRPC (loom.v1.GenerateRequest.messages): the conversation is
// rendered by the served model's chat template, as /v1/chat/completions renders it.

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace loom::client {

/// A function call: made by the model (Completion::tool_calls) or given back in an
/// assistant ChatMessage.
struct ToolCall {
  std::string id;  // "call_...", assigned by the coordinator
  std::string name;
  std::string arguments;  // JSON text of an object
};

/// One chat message, OpenAI's fields.
struct ChatMessage {
  std::string role;                    // "system", "user", "assistant", "tool"
  std::optional<std::string> content;  // unset: null (an assistant message with only calls)
  std::string name;                    // optional
  std::string tool_call_id;            // role "tool": the call it answers
  std::vector<ToolCall> tool_calls;    // role "assistant": the calls it made

  static ChatMessage Of(std::string role, std::string content) {
    ChatMessage message;
    message.role = std::move(role);
    message.content = std::move(content);
    return message;
  }
};

/// A function the model may call.
struct Tool {
  std::string name;
  std::string description;  // optional
  std::string parameters;   // JSON Schema of the arguments as JSON text; "": none
};

/// Which calls the model must make; "required" and a named function are enforced by the
/// server's grammar engine (the reply is then a valid call of the tools' schemas).
struct ToolChoice {
  std::string mode;      // "" or "auto" (default), "none", "required", "function"
  std::string function;  // mode "function": the function that must be called

  static ToolChoice Auto() { return {"auto", ""}; }
  static ToolChoice None() { return {"none", ""}; }
  static ToolChoice Required() { return {"required", ""}; }
  static ToolChoice Function(std::string name) { return {"function", std::move(name)}; }
};

}  // namespace loom::client
