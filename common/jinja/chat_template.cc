#include "common/jinja/chat_template.h"

#include <utility>

#include "common/jinja/jinja_interpreter.h"
#include "common/jinja/jinja_parser.h"
#include "common/status_macros.h"

namespace loom::common {

struct ChatTemplate::Impl {
  std::unique_ptr<jinja::Template> tmpl;
  std::string source;
};

ChatTemplate::ChatTemplate(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ChatTemplate::~ChatTemplate() = default;

const std::string& ChatTemplate::source() const { return impl_->source; }

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::Parse(std::string_view source) {
  auto impl = std::make_unique<Impl>();
  impl->source = std::string(source);
  LOOM_ASSIGN_OR_RETURN(impl->tmpl,
                        jinja::ParseTemplate(absl::string_view(source.data(), source.size())));
  return std::unique_ptr<ChatTemplate>(new ChatTemplate(std::move(impl)));
}

absl::StatusOr<std::string> ChatTemplate::Render(const ChatTemplateInputs& inputs) const {
  nlohmann::json context = nlohmann::json::object();
  if (inputs.extra_context.is_object()) context = inputs.extra_context;
  nlohmann::json messages = nlohmann::json::array();
  for (const ChatMessage& message : inputs.messages) {
    messages.push_back({{"role", message.role}, {"content", message.content}});
  }
  context["messages"] = std::move(messages);
  context["add_generation_prompt"] = inputs.add_generation_prompt;
  context["bos_token"] = inputs.bos_token;
  context["eos_token"] = inputs.eos_token;
  return RenderJson(context);
}

namespace {

template <typename Json>
absl::StatusOr<std::string> RenderContext(const jinja::Template& tmpl, const Json& context) {
  if (!context.is_object()) {
    return absl::InvalidArgumentError("chat template context must be a JSON object");
  }
  jinja::Value variables = jinja::Value::FromJson(context);
  return jinja::RenderTemplate(tmpl, variables.AsDict());
}

}  // namespace

absl::StatusOr<std::string> ChatTemplate::RenderJson(const nlohmann::json& context) const {
  return RenderContext(*impl_->tmpl, context);
}

absl::StatusOr<std::string> ChatTemplate::RenderJson(const nlohmann::ordered_json& context) const {
  return RenderContext(*impl_->tmpl, context);
}

}  // namespace loom::common
