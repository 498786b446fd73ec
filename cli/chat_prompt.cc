#include "cli/chat_prompt.h"

#include "absl/strings/str_format.h"
#include "common/formats/gguf_file.h"
#include "common/formats/hf_model.h"
#include "common/tokenizer/tokenizer.h"

namespace loom::cli {

absl::StatusOr<std::unique_ptr<ChatPrompt>> ChatPrompt::FromGguf(const std::string& path) {
  absl::StatusOr<std::unique_ptr<common::GgufFile>> gguf = common::OpenModelFile(path);
  if (!gguf.ok()) return gguf.status();
  absl::StatusOr<std::string_view> source = (*gguf)->GetString("tokenizer.chat_template");
  if (!source.ok()) {
    return absl::NotFoundError(absl::StrFormat("%s has no tokenizer.chat_template", path));
  }
  absl::StatusOr<std::unique_ptr<common::ChatTemplate>> chat_template =
      common::ChatTemplate::Parse(*source);
  if (!chat_template.ok()) return chat_template.status();
  absl::StatusOr<std::unique_ptr<common::Tokenizer>> tokenizer =
      common::Tokenizer::FromGguf(**gguf);
  if (!tokenizer.ok()) return tokenizer.status();
  std::unique_ptr<ChatPrompt> prompt(new ChatPrompt());
  prompt->chat_template_ = *std::move(chat_template);
  const common::Tokenizer& tok = **tokenizer;
  if (tok.bos_id() >= 0) prompt->bos_token = std::string(tok.TokenText(tok.bos_id()));
  if (tok.eos_id() >= 0) prompt->eos_token = std::string(tok.TokenText(tok.eos_id()));
  return prompt;
}

std::unique_ptr<ChatPrompt> ChatPrompt::Transcript() {
  return std::unique_ptr<ChatPrompt>(new ChatPrompt());
}

absl::StatusOr<std::string> ChatPrompt::Render(
    const std::vector<common::ChatMessage>& messages) const {
  if (chat_template_ != nullptr) {
    common::ChatTemplateInputs inputs;
    inputs.messages = messages;
    inputs.add_generation_prompt = true;
    inputs.bos_token = bos_token;
    inputs.eos_token = eos_token;
    return chat_template_->Render(inputs);
  }
  std::string text;
  for (const common::ChatMessage& message : messages) {
    const char* speaker = message.role == "system"      ? "System"
                          : message.role == "assistant" ? "Assistant"
                                                        : "User";
    absl::StrAppendFormat(&text, "%s: %s\n", speaker, message.content);
  }
  text += "Assistant:";
  return text;
}

std::vector<std::string> ChatPrompt::StopStrings() const {
  if (chat_template_ != nullptr) return {};  // the template's end-of-turn token is EOS
  return {"\nUser:"};
}

}  // namespace loom::cli
