#include "api/openai_tools.h"

#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "api/openai_request.h"
#include "api/xml_tool_calls.h"
#include "common/json_depth.h"

namespace loom::api {

std::string NameField(const nlohmann::ordered_json& object, const char* key, const char* fallback) {
  if (!object.is_object()) return "<not a string>";
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return fallback;
  return it->is_string() ? it->get<std::string>() : "<not a string>";
}
namespace {

using Json = nlohmann::ordered_json;

const Json* Field(const Json& object, const char* name) {
  auto it = object.find(name);
  return it == object.end() || it->is_null() ? nullptr : &*it;
}

std::string Dump(const Json& value) {
  return value.dump(-1, ' ', false, Json::error_handler_t::replace);
}

// One function definition ({"name", "description"?, "parameters"?}), checked.
absl::Status CheckFunction(const Json& function, const std::string& param) {
  if (!function.is_object()) {
    return InvalidOpenAiParam(param, absl::StrFormat("'%s' must hold function objects", param));
  }
  const Json* name = Field(function, "name");
  if (name == nullptr || !name->is_string() || name->get<std::string>().empty()) {
    return InvalidOpenAiParam(
        param, absl::StrFormat("each function in '%s' needs a non-empty 'name'", param));
  }
  if (const Json* parameters = Field(function, "parameters");
      parameters != nullptr && !parameters->is_object()) {
    return InvalidOpenAiParam(
        param, absl::StrFormat("the parameters of function '%s' must be a JSON Schema object",
                               name->get<std::string>()));
  }
  if (const Json* description = Field(function, "description");
      description != nullptr && !description->is_string()) {
    return InvalidOpenAiParam(param,
                              absl::StrFormat("the description of function '%s' must be a string",
                                              name->get<std::string>()));
  }
  return absl::OkStatus();
}

// A choice naming one function ({"name": ...} inside `holder`).
absl::StatusOr<std::string> NamedFunction(const Json& function, const std::string& param) {
  const Json* name = function.is_object() ? Field(function, "name") : nullptr;
  if (name == nullptr || !name->is_string() || name->get<std::string>().empty()) {
    return InvalidOpenAiParam(param, absl::StrFormat("'%s' must name a function", param));
  }
  return name->get<std::string>();
}

std::string ContentText(const Json& content) {
  if (content.is_string()) return content.get<std::string>();
  std::string text;
  for (const Json& part : content) text += part["text"].get<std::string>();
  return text;
}

absl::Status CheckContent(const Json& message) {
  const Json* content = Field(message, "content");
  if (content == nullptr || content->is_string()) return absl::OkStatus();
  if (!content->is_array()) {
    return InvalidOpenAiParam("messages",
                              "a message's 'content' must be a string or a list of parts");
  }
  for (const Json& part : *content) {
    const std::string type = NameField(part, "type", "<none>");
    if (type != "text") {
      // Image and audio parts: a multimodal checkpoint is served as its text model.
      return InvalidOpenAiParam(
          "messages", absl::StrCat("content parts of type '", type.substr(0, 64),
                                   "' are not supported (only 'text': Loom serves text models, "
                                   "a multimodal checkpoint's without its vision tower)"));
    }
    if (!part.contains("text") || !part["text"].is_string()) {
      return InvalidOpenAiParam("messages", "a content part of type 'text' needs a 'text' string");
    }
  }
  return absl::OkStatus();
}

// A call's arguments as a JSON value: the parsed object when the string holds one (what
// Hugging Face templates render with tojson), else the string itself.
Json ArgumentsValue(const Json& arguments) {
  if (!arguments.is_string()) return arguments;
  const std::string& text = arguments.get_ref<const std::string&>();
  if (common::JsonNestingDepth(text) > common::kMaxJsonNestingDepth) return arguments;
  Json parsed = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  return parsed.is_discarded() ? arguments : parsed;
}

Json FunctionSummary(const Json& tool) {
  const Json& function = tool["function"];
  Json summary = Json::object();
  summary["name"] = function["name"];
  if (const Json* description = Field(function, "description"))
    summary["description"] = *description;
  const Json* parameters = Field(function, "parameters");
  summary["parameters"] = parameters != nullptr
                              ? *parameters
                              : Json{{"type", "object"}, {"properties", Json::object()}};
  return summary;
}

// A parameter schema that only admits strings: {"type": "string"}, or a list of types of
// which "string" is the only one besides "null".
bool StringTyped(const Json& schema) {
  const Json* type = schema.is_object() ? Field(schema, "type") : nullptr;
  if (type == nullptr) return false;
  if (type->is_string()) return *type == "string";
  if (!type->is_array()) return false;
  bool string = false;
  for (const Json& member : *type) {
    if (member == "string") {
      string = true;
    } else if (member != "null") {
      return false;
    }
  }
  return string;
}

// The string parameters of the request's tools (see xml_tool_calls.h), by function.
StringParameters StringParametersOf(const Json& tools) {
  StringParameters out;
  for (const Json& tool : tools) {
    const Json& function = tool["function"];
    const Json* parameters = Field(function, "parameters");
    const Json* properties = parameters != nullptr && parameters->is_object()
                                 ? Field(*parameters, "properties")
                                 : nullptr;
    if (properties == nullptr || !properties->is_object()) continue;
    for (const auto& [key, schema] : properties->items()) {
      if (StringTyped(schema)) out[function["name"].get<std::string>()].insert(key);
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<ToolsRequest> ParseToolsRequest(const Json& body, std::string_view template_source) {
  ToolsRequest out;
  out.format = ToolCallFormatOf(template_source);
  out.template_renders_tools = !template_source.empty() && TemplateRendersTools(template_source);
  const Json* tools = Field(body, "tools");
  const Json* functions = Field(body, "functions");
  if (tools != nullptr && functions != nullptr) {
    return InvalidOpenAiParam("functions", "give 'tools' or the legacy 'functions', not both");
  }
  absl::flat_hash_set<std::string> names;
  if (tools != nullptr) {
    if (!tools->is_array()) return InvalidOpenAiParam("tools", "'tools' must be a list of tools");
    for (const Json& tool : *tools) {
      if (!tool.is_object() || NameField(tool, "type") != "function" ||
          Field(tool, "function") == nullptr) {
        return InvalidOpenAiParam(
            "tools", "each tool must be {\"type\": \"function\", \"function\": {...}}");
      }
      if (absl::Status s = CheckFunction(tool["function"], "tools"); !s.ok()) return s;
      const std::string name = tool["function"]["name"].get<std::string>();
      if (!names.insert(name).second) {
        return InvalidOpenAiParam("tools", absl::StrFormat("two tools are named '%s'", name));
      }
      out.tools.push_back(Json{{"type", "function"}, {"function", tool["function"]}});
    }
  } else if (functions != nullptr) {
    if (!functions->is_array())
      return InvalidOpenAiParam("functions", "'functions' must be a list of functions");
    for (const Json& function : *functions) {
      if (absl::Status s = CheckFunction(function, "functions"); !s.ok()) return s;
      const std::string name = function["name"].get<std::string>();
      if (!names.insert(name).second) {
        return InvalidOpenAiParam("functions",
                                  absl::StrFormat("two functions are named '%s'", name));
      }
      out.tools.push_back(Json{{"type", "function"}, {"function", function}});
    }
    out.legacy = true;
  }
  out.choice = out.tools.empty() ? ToolChoice::kNone : ToolChoice::kAuto;
  out.string_parameters = StringParametersOf(out.tools);

  const char* choice_param = out.legacy ? "function_call" : "tool_choice";
  const Json* choice = Field(body, choice_param);
  if (!out.legacy && choice == nullptr && Field(body, "function_call") != nullptr) {
    return InvalidOpenAiParam(
        "function_call", "'function_call' goes with the legacy 'functions'; use 'tool_choice'");
  }
  if (choice != nullptr) {
    if (choice->is_string()) {
      const std::string mode = choice->get<std::string>();
      if (mode == "none") {
        out.choice = ToolChoice::kNone;
      } else if (mode == "auto") {
        out.choice = out.tools.empty() ? ToolChoice::kNone : ToolChoice::kAuto;
      } else if (mode == "required" && !out.legacy) {
        out.choice = ToolChoice::kRequired;
      } else {
        return InvalidOpenAiParam(
            choice_param,
            absl::StrFormat("'%s' must be %s or a named function, got '%s'", choice_param,
                            out.legacy ? "\"none\", \"auto\"" : "\"none\", \"auto\", \"required\"",
                            mode));
      }
    } else if (choice->is_object()) {
      absl::StatusOr<std::string> name;
      if (out.legacy) {
        name = NamedFunction(*choice, choice_param);
      } else {
        if (NameField(*choice, "type") != "function" || Field(*choice, "function") == nullptr) {
          return InvalidOpenAiParam(
              choice_param,
              "a named 'tool_choice' is {\"type\": \"function\", \"function\": {\"name\": ...}}");
        }
        name = NamedFunction((*choice)["function"], choice_param);
      }
      if (!name.ok()) return name.status();
      if (!names.contains(*name)) {
        return InvalidOpenAiParam(
            choice_param,
            absl::StrFormat("'%s' names the function '%s', which is not among the tools",
                            choice_param, *name));
      }
      out.choice = ToolChoice::kNamed;
      out.named_function = *name;
    } else {
      return InvalidOpenAiParam(
          choice_param, absl::StrFormat("'%s' must be a string or an object", choice_param));
    }
    if ((out.choice == ToolChoice::kRequired) && out.tools.empty()) {
      return InvalidOpenAiParam(choice_param, "'tool_choice' \"required\" needs 'tools'");
    }
  }
  if (const Json* parallel = Field(body, "parallel_tool_calls")) {
    if (!parallel->is_boolean())
      return InvalidOpenAiParam("parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
    out.parallel = parallel->get<bool>();
  }
  // The legacy API returns one function_call.
  if (out.legacy) out.parallel = false;
  // A forced call in a format the grammar engine cannot write (not JSON, or its function
  // name outside the JSON) is constrained to, and parsed as, the generic JSON form.
  const bool forced = out.choice == ToolChoice::kRequired || out.choice == ToolChoice::kNamed;
  if (forced &&
      (out.format == ToolCallFormat::kPythonic || out.format == ToolCallFormat::kQwen3Coder ||
       out.format == ToolCallFormat::kGlm45 || out.format == ToolCallFormat::kDeepSeekV3 ||
       out.format == ToolCallFormat::kGptOss)) {
    out.format = ToolCallFormat::kGeneric;
  }
  return out;
}

std::string GenericToolPrompt(const Json& tools) {
  Json summaries = Json::array();
  for (const Json& tool : tools) summaries.push_back(FunctionSummary(tool));
  return "You can call the following tools, given as their name, description and the JSON "
         "Schema of their arguments:\n" +
         Dump(summaries) +
         "\nTo call tools, reply with nothing but a JSON object of this form:\n"
         "{\"tool_calls\": [{\"name\": \"<the tool's name>\", \"arguments\": {<its arguments>}}]}\n"
         "Otherwise, reply to the user in plain text.";
}

absl::StatusOr<Json> TemplateMessages(const Json& messages, const ToolsRequest& tools) {
  Json out = Json::array();
  const bool rewrite = !tools.template_renders_tools;
  // Call id -> function name, for the generic tool responses.
  std::vector<std::pair<std::string, std::string>> call_names;
  for (const Json& message : messages) {
    if (!message.is_object())
      return InvalidOpenAiParam("messages", "each message must be an object");
    const Json* role = Field(message, "role");
    if (role == nullptr || !role->is_string() || role->get<std::string>().empty()) {
      return InvalidOpenAiParam("messages", "each message needs a 'role'");
    }
    if (absl::Status s = CheckContent(message); !s.ok()) return s;
    Json copy = message;
    const Json* content = Field(message, "content");
    const Json* calls = Field(message, "tool_calls");
    if (content != nullptr) {
      copy["content"] = ContentText(*content);
    } else if (calls == nullptr) {
      copy["content"] = "";
    }
    if (calls != nullptr) {
      if (!calls->is_array())
        return InvalidOpenAiParam("messages", "a message's 'tool_calls' must be a list");
      Json parsed_calls = Json::array();
      for (const Json& call : *calls) {
        const Json* function = call.is_object() ? Field(call, "function") : nullptr;
        const Json* name =
            function != nullptr && function->is_object() ? Field(*function, "name") : nullptr;
        if (name == nullptr || !name->is_string()) {
          return InvalidOpenAiParam("messages", "each tool call needs a 'function' with a 'name'");
        }
        const Json* arguments = Field(*function, "arguments");
        if (arguments != nullptr && !arguments->is_string() && !arguments->is_object()) {
          return InvalidOpenAiParam("messages", "a tool call's 'arguments' must be a JSON string");
        }
        Json parsed = call;
        parsed["function"]["arguments"] =
            arguments == nullptr ? Json::object() : ArgumentsValue(*arguments);
        if (const Json* id = Field(call, "id"); id != nullptr && id->is_string()) {
          call_names.emplace_back(id->get<std::string>(), name->get<std::string>());
        }
        parsed_calls.push_back(std::move(parsed));
      }
      copy["tool_calls"] = parsed_calls;
      if (rewrite) {
        // The generic format: the calls as the JSON the model is asked to write.
        Json generic = Json::array();
        for (const Json& call : parsed_calls) {
          generic.push_back(Json{{"name", call["function"]["name"]},
                                 {"arguments", call["function"]["arguments"]}});
        }
        std::string text = content != nullptr ? copy["content"].get<std::string>() : "";
        if (!text.empty()) text += "\n";
        copy["content"] = text + Dump(Json{{"tool_calls", generic}});
        copy.erase("tool_calls");
      }
    }
    if (rewrite && role->get<std::string>() == "tool") {
      Json response = Json::object();
      std::string id;
      if (const Json* call_id = Field(message, "tool_call_id");
          call_id != nullptr && call_id->is_string()) {
        id = call_id->get<std::string>();
        response["tool_call_id"] = id;
      }
      for (const auto& [known_id, name] : call_names) {
        if (known_id == id) response["name"] = name;
      }
      if (const Json* name = Field(message, "name"); name != nullptr && name->is_string()) {
        response["name"] = *name;
      }
      response["content"] = copy["content"];
      copy = Json{{"role", "user"}, {"content", Dump(Json{{"tool_response", response}})}};
    }
    out.push_back(std::move(copy));
  }
  if (rewrite && tools.active()) {
    const std::string prompt = GenericToolPrompt(tools.tools);
    if (!out.empty() && out[0]["role"] == "system") {
      const std::string system =
          out[0]["content"].is_string() ? out[0]["content"].get<std::string>() : "";
      out[0]["content"] = system.empty() ? prompt : system + "\n\n" + prompt;
    } else {
      out.insert(out.begin(), Json{{"role", "system"}, {"content", prompt}});
    }
  }
  return out;
}

namespace {

// tool_choice "auto" in a format that writes calls as tags around bare text: free text until
// <tool_call>, then calls in the chat template's layout, each value held to its parameter's
// schema (common/grammar/tool_call_grammar.h's "xml"). The tags are the parser's
// (xml_tool_calls.h), laid out with the templates' newlines: one after the wrapper, the name,
// the key and the value, and around a value without its own opening tag (Qwen3-Coder's).
// GLM-4.7 leaves out the newlines GLM-4.5 writes, so they are optional there.
common::GrammarSpec XmlAutoConstraint(const ToolsRequest& tools) {
  const bool glm = tools.format == ToolCallFormat::kGlm45;
  const XmlCallSyntax& syntax = glm ? kGlm45Syntax : kQwen3CoderSyntax;
  const std::string wrapper(syntax.wrapper), value_open(syntax.value_open);
  auto text = [](std::string_view tag) { return std::string(tag); };
  Json list = Json::array();
  for (const Json& tool : tools.tools) {
    const Json summary = FunctionSummary(tool);
    list.push_back(Json{{"name", summary["name"]}, {"parameters", summary["parameters"]}});
  }
  const Json xml{{"name_end", text(syntax.name_end) + "\n"},
                 {"key_begin", text(syntax.key_open)},
                 {"key_end", text(syntax.key_close) + "\n" + value_open},
                 {"value_end", (value_open.empty() ? "\n" : "") + text(syntax.value_close) + "\n"},
                 {"optional_newlines", glm},
                 {"tools", list}};
  const Json spec{
      {"begin", wrapper.empty() ? text(syntax.open) : wrapper + "\n" + text(syntax.open)},
      {"end", wrapper.empty() ? text(syntax.close)
                              : text(syntax.close) + "\n" + text(markers::kHermesClose)},
      {"separator", "\n"},
      {"repeat", tools.parallel},
      {"xml", xml},
      {"trigger", text(markers::kHermesOpen)},
      {"trigger_at", "anywhere"}};
  return common::GrammarSpec{common::GrammarKind::kToolCalls, Dump(spec)};
}

}  // namespace

std::optional<common::GrammarSpec> ToolCallConstraint(const ToolsRequest& tools) {
  const bool automatic = tools.choice == ToolChoice::kAuto && tools.active();
  if (tools.choice != ToolChoice::kRequired && tools.choice != ToolChoice::kNamed && !automatic)
    return std::nullopt;
  // "auto": the reply is free until it starts a call in the template's own format, which
  // is then held to the tools' schemas (the trigger approach): Qwen3-Coder's and GLM-4.5's
  // tags with typed values too. Pythonic, DeepSeek-V3 and gpt-oss calls stay unconstrained.
  const char* trigger = nullptr;
  const char* trigger_at = "anywhere";
  if (automatic) {
    switch (tools.format) {
      case ToolCallFormat::kHermes:
        trigger = "<tool_call>";
        break;
      case ToolCallFormat::kMistral:
        trigger = "[TOOL_CALLS]";
        break;
      case ToolCallFormat::kGranite:
        trigger = "<|tool_call|>";
        break;
      case ToolCallFormat::kGeneric:
      case ToolCallFormat::kLlama3Json:
        trigger = "{";  // these replies are a call when they are a JSON object
        trigger_at = "start";
        break;
      case ToolCallFormat::kQwen3Coder:
      case ToolCallFormat::kGlm45:
        return XmlAutoConstraint(tools);
      case ToolCallFormat::kPythonic:
      case ToolCallFormat::kDeepSeekV3:
      case ToolCallFormat::kGptOss:
        return std::nullopt;
    }
  }
  const char* arguments_key =
      tools.format == ToolCallFormat::kLlama3Json ? "parameters" : "arguments";
  Json alternatives = Json::array();
  for (const Json& tool : tools.tools) {
    const Json summary = FunctionSummary(tool);
    if (tools.choice == ToolChoice::kNamed && summary["name"] != tools.named_function) continue;
    Json properties = Json::object();
    properties["name"] = Json{{"const", summary["name"]}};
    properties[arguments_key] = summary["parameters"];
    alternatives.push_back(Json{{"type", "object"},
                                {"properties", properties},
                                {"required", Json::array({"name", arguments_key})},
                                {"additionalProperties", false}});
  }
  const Json call = alternatives.size() == 1 ? alternatives[0] : Json{{"anyOf", alternatives}};
  Json list{{"type", "array"}, {"items", call}, {"minItems", 1}};
  if (!tools.parallel) list["maxItems"] = 1;
  switch (tools.format) {
    case ToolCallFormat::kPythonic:  // forced calls in these are generic (ParseToolsRequest)
    case ToolCallFormat::kQwen3Coder:
    case ToolCallFormat::kGlm45:
    case ToolCallFormat::kDeepSeekV3:
    case ToolCallFormat::kGptOss:
    case ToolCallFormat::kGeneric: {
      const Json schema{{"type", "object"},
                        {"properties", Json{{"tool_calls", list}}},
                        {"required", Json::array({"tool_calls"})},
                        {"additionalProperties", false}};
      if (automatic) {
        return common::GrammarSpec{
            common::GrammarKind::kToolCalls,
            Dump(Json{{"schema", schema}, {"trigger", trigger}, {"trigger_at", trigger_at}})};
      }
      return common::GrammarSpec{common::GrammarKind::kJsonSchema, Dump(schema)};
    }
    case ToolCallFormat::kLlama3Json:
      if (automatic) {
        return common::GrammarSpec{
            common::GrammarKind::kToolCalls,
            Dump(Json{{"schema", call}, {"trigger", trigger}, {"trigger_at", trigger_at}})};
      }
      return common::GrammarSpec{common::GrammarKind::kJsonSchema, Dump(call)};
    case ToolCallFormat::kHermes: {
      Json spec{{"schema", call},
                {"begin", "<tool_call>\n"},
                {"end", "\n</tool_call>"},
                {"separator", "\n"},
                {"repeat", tools.parallel}};
      if (automatic) spec["trigger"] = trigger, spec["trigger_at"] = trigger_at;
      return common::GrammarSpec{common::GrammarKind::kToolCalls, Dump(spec)};
    }
    case ToolCallFormat::kMistral:
    case ToolCallFormat::kGranite: {
      Json spec{{"schema", list}, {"begin", std::string(CallListMarker(tools.format))}};
      if (automatic) spec["trigger"] = trigger, spec["trigger_at"] = trigger_at;
      return common::GrammarSpec{common::GrammarKind::kToolCalls, Dump(spec)};
    }
  }
  return std::nullopt;
}

}  // namespace loom::api
