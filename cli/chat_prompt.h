#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/jinja/chat_template.h"

namespace loom::cli {

/// How `loom chat` turns a conversation into a prompt: the model's own chat template
/// (`tokenizer.chat_template` of its GGUF file, rendered by common::ChatTemplate as the
/// coordinator renders it) or, without one, a plain "User:/Assistant:" transcript. The
/// gRPC API takes text or token ids, not messages, so the client renders. Immutable.
class ChatPrompt {
 public:
  /// The template of the GGUF file at `path`; NotFound when it has none.
  static absl::StatusOr<std::unique_ptr<ChatPrompt>> FromGguf(const std::string& path);
  /// The plain transcript (for models without a template, or no local model file).
  static std::unique_ptr<ChatPrompt> Transcript();

  /// The prompt for `messages`, ending where the assistant's reply begins.
  absl::StatusOr<std::string> Render(const std::vector<common::ChatMessage>& messages) const;
  /// Stop strings the prompt format needs (the transcript's next "User:" turn).
  std::vector<std::string> StopStrings() const;
  bool uses_template() const { return chat_template_ != nullptr; }

 private:
  ChatPrompt() = default;
  std::unique_ptr<common::ChatTemplate> chat_template_;  // null: the transcript
  std::string bos_token;
  std::string eos_token;
};

}  // namespace loom::cli
