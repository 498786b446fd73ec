#include "api/chat_request.h"

#include <cctype>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_format.h"
#include "api/openai_request.h"
#include "api/tool_call_text.h"
#include "common/grammar/grammar_spec.h"
#include "common/json_depth.h"
#include "common/status_macros.h"

namespace loom::api {
namespace {

using Json = nlohmann::ordered_json;

// The OpenAI body of the gRPC chat fields: {"tools", "tool_choice", "parallel_tool_calls"}.
absl::StatusOr<Json> ToolsBody(const loom::v1::GenerateRequest& request) {
  Json body = Json::object();
  if (request.tools_size() > 0) {
    Json tools = Json::array();
    for (int i = 0; i < request.tools_size(); ++i) {
      const loom::v1::Tool& tool = request.tools(i);
      Json function = Json::object();
      function["name"] = tool.name();
      if (!tool.description().empty()) function["description"] = tool.description();
      if (!tool.parameters().empty()) {
        if (absl::Status depth =
                common::CheckJsonNestingDepth(tool.parameters(), "a tool's parameters");
            !depth.ok()) {
          return InvalidOpenAiParam("tools", std::string(depth.message()));
        }
        Json parameters = Json::parse(tool.parameters(), nullptr, /*allow_exceptions=*/false);
        if (parameters.is_discarded()) {
          return InvalidOpenAiParam(
              "tools",
              absl::StrFormat("tools[%d] ('%s'): 'parameters' is not valid JSON", i, tool.name()));
        }
        function["parameters"] = std::move(parameters);
      }
      tools.push_back(Json{{"type", "function"}, {"function", std::move(function)}});
    }
    body["tools"] = std::move(tools);
  }
  const std::string& choice = request.tool_choice();
  const std::string& function = request.tool_choice_function();
  if (choice == "function" || (choice.empty() && !function.empty())) {
    if (function.empty()) {
      return InvalidOpenAiParam("tool_choice",
                                "tool_choice \"function\" needs tool_choice_function");
    }
    body["tool_choice"] = Json{{"type", "function"}, {"function", Json{{"name", function}}}};
  } else if (!function.empty()) {
    return InvalidOpenAiParam("tool_choice_function",
                              absl::StrFormat("tool_choice_function goes with "
                                              "tool_choice \"function\", not \"%s\"",
                                              choice));
  } else if (!choice.empty()) {
    body["tool_choice"] = choice;
  }
  if (request.has_parallel_tool_calls())
    body["parallel_tool_calls"] = request.parallel_tool_calls();
  return body;
}

Json MessagesJson(const loom::v1::GenerateRequest& request) {
  Json messages = Json::array();
  for (const loom::v1::ChatMessage& message : request.messages()) {
    Json out = Json::object();
    out["role"] = message.role();
    out["content"] = message.has_content() ? Json(message.content()) : Json(nullptr);
    if (!message.name().empty()) out["name"] = message.name();
    if (!message.tool_call_id().empty()) out["tool_call_id"] = message.tool_call_id();
    if (message.tool_calls_size() > 0) {
      Json calls = Json::array();
      for (const loom::v1::ToolCall& call : message.tool_calls()) {
        Json entry = Json::object();
        if (!call.id().empty()) entry["id"] = call.id();
        entry["type"] = "function";
        entry["function"] = Json{{"name", call.name()},
                                 {"arguments", call.arguments().empty() ? "{}" : call.arguments()}};
        calls.push_back(std::move(entry));
      }
      out["tool_calls"] = std::move(calls);
    }
    messages.push_back(std::move(out));
  }
  return messages;
}

// continue_final_message: the text the reply continues, the last message's content (a
// string, or its last text part).
absl::StatusOr<std::string> FinalMessageText(const Json& messages) {
  const Json& last = messages.back();
  const auto content = last.find("content");
  if (content != last.end() && content->is_string()) return content->get<std::string>();
  if (content != last.end() && content->is_array()) {
    for (auto part = content->rbegin(); part != content->rend(); ++part) {
      if (!part->is_object()) continue;
      const auto text = part->find("text");
      if (text != part->end() && text->is_string()) return text->get<std::string>();
    }
  }
  return InvalidOpenAiParam("continue_final_message",
                            "'continue_final_message' needs text in the last message to continue");
}

// The rendered chat up to the end of the last occurrence of the final message's text:
// with its trailing whitespace where the template kept it, without where it trimmed it.
absl::StatusOr<std::string> CutAfterFinalMessage(std::string rendered,
                                                 std::string_view final_text) {
  std::string_view kept = final_text;  // without leading whitespace
  while (!kept.empty() && IsBlank(kept.front())) kept.remove_prefix(1);
  const std::string_view stripped = TrimBlanks(final_text);  // nor trailing
  if (stripped.empty()) {
    return InvalidOpenAiParam(
        "continue_final_message",
        "'continue_final_message' needs text in the last message to continue (it is blank)");
  }
  const size_t at = rendered.rfind(stripped);
  if (at == std::string::npos) {
    return InvalidOpenAiParam(
        "continue_final_message",
        "'continue_final_message': the chat template does not keep the last message's text, "
        "so there is nothing to continue");
  }
  const bool kept_whole = std::string_view(rendered).substr(at, kept.size()) == kept;
  rendered.resize(at + (kept_whole ? kept.size() : stripped.size()));
  return rendered;
}

}  // namespace

absl::StatusOr<std::string> RenderChatPrompt(const Json& messages, const ToolsRequest& tools,
                                             const common::Tokenizer& tokenizer,
                                             const common::ChatTemplate& chat_template,
                                             const Json* template_kwargs,
                                             ChatRenderOptions options) {
  LOOM_ASSIGN_OR_RETURN(Json template_messages, TemplateMessages(messages, tools));
  Json context = Json::object();
  context["messages"] = std::move(template_messages);
  if (tools.template_renders_tools && !tools.tools.empty()) context["tools"] = tools.tools;
  context["bos_token"] = tokenizer.bos_id() >= 0
                             ? std::string(tokenizer.TokenText(tokenizer.bos_id()))
                             : std::string();
  context["eos_token"] = tokenizer.eos_id() >= 0
                             ? std::string(tokenizer.TokenText(tokenizer.eos_id()))
                             : std::string();
  if (template_kwargs != nullptr) {
    if (!template_kwargs->is_object()) {
      return InvalidOpenAiParam("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    }
    for (const auto& [key, value] : template_kwargs->items()) {
      if (key == "messages" || key == "tools") {
        return InvalidOpenAiParam(
            "chat_template_kwargs",
            absl::StrFormat("'chat_template_kwargs' cannot set '%s' (send it as the request's "
                            "own field)",
                            key));
      }
      // vLLM lets the kwargs override the request's own fields of these names.
      if (key == "add_generation_prompt" || key == "continue_final_message") {
        if (!value.is_boolean()) {
          return InvalidOpenAiParam(
              "chat_template_kwargs",
              absl::StrFormat("'chat_template_kwargs' sets '%s' to a non-boolean", key));
        }
        (key == "add_generation_prompt" ? options.add_generation_prompt
                                        : options.continue_final_message) = value.get<bool>();
        continue;
      }
      // What the request's own field refuses is refused here too, not let in by another
      // door.
      if (key == "documents" && !value.is_null() && !value.empty()) {
        return InvalidOpenAiParam(
            "chat_template_kwargs",
            absl::StrFormat("'chat_template_kwargs' cannot set '%s': it is not supported by "
                            "this server",
                            key));
      }
      context[key] = value;
    }
  }
  if (options.add_generation_prompt && options.continue_final_message) {
    return InvalidOpenAiParam("continue_final_message",
                              "'continue_final_message' needs 'add_generation_prompt': false (the "
                              "reply continues the last message instead of starting a new one)");
  }
  context["add_generation_prompt"] = options.add_generation_prompt;
  absl::StatusOr<std::string> rendered = chat_template.RenderJson(context);
  if (!rendered.ok()) {
    return InvalidOpenAiParam("messages",
                              absl::StrFormat("the chat template rejected the messages: %s",
                                              rendered.status().message()));
  }
  if (!options.continue_final_message) return rendered;
  LOOM_ASSIGN_OR_RETURN(std::string final_text, FinalMessageText(messages));
  return CutAfterFinalMessage(*std::move(rendered), final_text);
}

absl::StatusOr<std::optional<Json>> ChatTemplateVariables(
    const std::optional<std::string>& reasoning_effort, const Json* kwargs) {
  if (!reasoning_effort && kwargs == nullptr) return std::nullopt;
  if (reasoning_effort && *reasoning_effort != "minimal" && *reasoning_effort != "low" &&
      *reasoning_effort != "medium" && *reasoning_effort != "high") {
    return InvalidOpenAiParam("reasoning_effort",
                              absl::StrFormat("'reasoning_effort' is '%s' (one of minimal, low, "
                                              "medium, high)",
                                              *reasoning_effort));
  }
  if (kwargs != nullptr && !kwargs->is_object()) return *kwargs;  // refused by RenderChatPrompt
  Json merged = kwargs != nullptr ? *kwargs : Json::object();
  if (reasoning_effort && !merged.contains("reasoning_effort")) {
    merged["reasoning_effort"] = *reasoning_effort;
  }
  return merged;
}

std::vector<int32_t> EncodeChatPrompt(std::string_view rendered,
                                      const common::Tokenizer& tokenizer) {
  return tokenizer.Encode(rendered, /*add_special=*/false, /*parse_special=*/true);
}

absl::Status ApplyToolConstraint(const ToolsRequest& tools, const char* tools_param,
                                 const char* choice_param, loom::v1::GenerateRequest& request) {
  std::optional<common::GrammarSpec> constraint = ToolCallConstraint(tools);
  // tool_choice "auto" beside a response format: the format governs the reply.
  if (constraint && tools.choice == ToolChoice::kAuto &&
      !request.sampling().grammar().kind().empty()) {
    constraint.reset();
  }
  if (constraint) {
    if (!request.sampling().grammar().kind().empty()) {
      return InvalidOpenAiParam(choice_param,
                                absl::StrFormat("'%s' forces a tool call, which conflicts with "
                                                "the structured output constraint; give one",
                                                choice_param));
    }
    absl::StatusOr<std::shared_ptr<const common::Grammar>> compiled =
        common::SharedGrammarCache().Get(*constraint);
    if (!compiled.ok()) {
      return InvalidOpenAiParam(
          tools_param, absl::StrFormat("the tools' parameter schemas cannot be enforced: %s",
                                       compiled.status().message()));
    }
    request.mutable_sampling()->mutable_grammar()->set_kind(
        common::GrammarKindName(constraint->kind));
    request.mutable_sampling()->mutable_grammar()->set_text(constraint->text);
  }
  // Mistral's [TOOL_CALLS], Granite's <|tool_call|> and gpt-oss's channels are special tokens: the
  // parser needs them in the text.
  if (((tools.active() &&
        (tools.format == ToolCallFormat::kMistral || tools.format == ToolCallFormat::kGranite)) ||
       tools.format == ToolCallFormat::kGptOss) &&
      !request.has_skip_special_tokens()) {
    request.set_skip_special_tokens(false);
  }
  return absl::OkStatus();
}

bool HasChatFields(const loom::v1::GenerateRequest& request) {
  return request.messages_size() > 0 || request.tools_size() > 0 ||
         !request.tool_choice().empty() || !request.tool_choice_function().empty() ||
         request.has_parallel_tool_calls() || request.has_add_generation_prompt() ||
         request.continue_final_message() || !request.chat_template_kwargs().empty() ||
         !request.reasoning_effort().empty();
}

absl::StatusOr<ToolsRequest> PrepareChatRequest(loom::v1::GenerateRequest& request,
                                                const common::Tokenizer& tokenizer,
                                                const common::ChatTemplate* chat_template,
                                                std::string* rendered_out) {
  if (request.messages_size() == 0) {
    if (HasChatFields(request)) {
      return InvalidOpenAiParam(
          "messages",
          "tools, tool_choice, parallel_tool_calls, add_generation_prompt, "
          "continue_final_message, chat_template_kwargs and reasoning_effort need messages (a "
          "chat)");
    }
    return ToolsRequest{};
  }
  if (request.prompt_case() != loom::v1::GenerateRequest::PROMPT_NOT_SET) {
    return InvalidOpenAiParam(
        "messages", "give either messages (a chat) or a prompt (text or token_ids), not both");
  }
  if (chat_template == nullptr) {
    return absl::FailedPreconditionError(
        "this model has no usable chat template; send a prompt instead of messages");
  }
  LOOM_ASSIGN_OR_RETURN(Json body, ToolsBody(request));
  LOOM_ASSIGN_OR_RETURN(ToolsRequest tools, ParseToolsRequest(body, chat_template->source()));
  LOOM_RETURN_IF_ERROR(ApplyToolConstraint(tools, "tools", "tool_choice", request));
  ChatRenderOptions options;
  options.add_generation_prompt =
      !request.has_add_generation_prompt() || request.add_generation_prompt();
  options.continue_final_message = request.continue_final_message();
  std::optional<Json> kwargs;
  if (!request.chat_template_kwargs().empty()) {
    kwargs = Json::parse(request.chat_template_kwargs(), nullptr, /*allow_exceptions=*/false);
    if (kwargs->is_discarded()) {
      return InvalidOpenAiParam("chat_template_kwargs",
                                "'chat_template_kwargs' is not JSON (a JSON object as text)");
    }
  }
  LOOM_ASSIGN_OR_RETURN(
      std::optional<Json> variables,
      ChatTemplateVariables(request.reasoning_effort().empty()
                                ? std::nullopt
                                : std::optional<std::string>(request.reasoning_effort()),
                            kwargs ? &*kwargs : nullptr));
  LOOM_ASSIGN_OR_RETURN(std::string rendered,
                        RenderChatPrompt(MessagesJson(request), tools, tokenizer, *chat_template,
                                         variables ? &*variables : nullptr, options));
  const std::vector<int32_t> ids = EncodeChatPrompt(rendered, tokenizer);
  request.mutable_token_ids()->mutable_ids()->Add(ids.begin(), ids.end());
  if (rendered_out != nullptr) *rendered_out = std::move(rendered);
  request.clear_messages();
  request.clear_tools();
  request.clear_tool_choice();
  request.clear_tool_choice_function();
  request.clear_parallel_tool_calls();
  request.clear_add_generation_prompt();
  request.clear_continue_final_message();
  request.clear_chat_template_kwargs();
  request.clear_reasoning_effort();
  return tools;
}

ChatReply ParseChatReply(const ToolsRequest& tools, std::string_view text) {
  ChatReply out;
  ParsedReply parsed = ParseToolCalls(tools.format, text, tools.string_parameters);
  // gpt-oss without tools: its channels are split, no call is taken.
  if (tools.format == ToolCallFormat::kGptOss && !tools.active()) parsed.calls.clear();
  if (!tools.parallel && parsed.calls.size() > 1) parsed.calls.resize(1);
  out.content = parsed.content ? *parsed.content : std::string(text.substr(0, parsed.content_end));
  out.reasoning = std::move(parsed.reasoning);
  if (!parsed.calls.empty()) {
    while (!out.content.empty() && std::isspace(static_cast<unsigned char>(out.content.back()))) {
      out.content.pop_back();
    }
  }
  out.calls = std::move(parsed.calls);
  return out;
}

}  // namespace loom::api
