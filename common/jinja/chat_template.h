#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace loom::common {

/// One OpenAI-style chat message.
struct ChatMessage {
  std::string role;  // "system", "user", "assistant", ...
  std::string content;
};

struct ChatTemplateInputs {
  std::vector<ChatMessage> messages;
  bool add_generation_prompt = true;
  std::string bos_token;
  std::string eos_token;
  /// Extra variables passed to the template (e.g. "tools", "date_string").
  nlohmann::json extra_context = nlohmann::json::object();
};

/// A model's Jinja chat template (`tokenizer.chat_template`), parsed once and rendered
/// by Loom's own interpreter for the Jinja subset chat templates use. Renders
/// byte-identical to Python's jinja2 as Hugging Face configures it (trim_blocks,
/// lstrip_blocks). Constructs outside the subset are a parse or render error, never
/// wrong text. Immutable after Parse; Render is thread-safe.
class ChatTemplate {
 public:
  /// InvalidArgument with line and column for syntax errors or unsupported constructs.
  static absl::StatusOr<std::unique_ptr<ChatTemplate>> Parse(std::string_view source);
  ~ChatTemplate();

  /// Renders with `messages`, `add_generation_prompt`, `bos_token`, `eos_token`.
  /// InvalidArgument for `raise_exception(...)` in the template (its message) and
  /// for runtime errors (undefined operations, type errors).
  absl::StatusOr<std::string> Render(const ChatTemplateInputs& inputs) const;

  /// Renders with an arbitrary context object (the messages may carry extra fields).
  /// nlohmann::json keeps object keys sorted, so `tojson` and `.items()` see them in
  /// alphabetical order; pass ordered_json to keep the client's order, as Python does.
  absl::StatusOr<std::string> RenderJson(const nlohmann::json& context) const;
  absl::StatusOr<std::string> RenderJson(const nlohmann::ordered_json& context) const;

  /// The template's Jinja source as parsed (to tell which tool-call format it speaks).
  const std::string& source() const;

 private:
  struct Impl;
  explicit ChatTemplate(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace loom::common
