#include "api/responses_api.h"

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "api/openai_request.h"
#include "nlohmann/json.hpp"

namespace loom::api {
namespace {

using Json = nlohmann::ordered_json;

std::string NewId(const char* prefix) {
  static constexpr char kHex[] = "0123456789abcdef";
  thread_local std::mt19937_64 generator{std::random_device{}()};
  std::string id = prefix;
  for (int i = 0; i < 32; ++i) id += kHex[generator() % 16];
  return id;
}

// `object[key]` when it is a string, `fallback` when it is absent; an error naming `param`
// for anything else (Json::value would throw, and the client would see a 500).
absl::StatusOr<std::string> StringOr(const Json& object, const char* key, const char* fallback,
                                     const char* param) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return std::string(fallback);
  if (!it->is_string()) {
    return InvalidOpenAiParam(param, absl::StrFormat("'%s' of '%s' must be a string", key, param));
  }
  return it->get<std::string>();
}

// An input message's content: a string, or parts whose text is joined.
absl::StatusOr<std::string> MessageText(const Json& content) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) {
    return InvalidOpenAiParam("input", "a message's content must be a string or a list of parts");
  }
  std::string text;
  for (const Json& part : content) {
    const std::string type = part.is_object() ? NameField(part, "type") : "";
    if ((type != "input_text" && type != "output_text") || !part.contains("text") ||
        !part["text"].is_string()) {
      return InvalidOpenAiParam(
          "input", absl::StrFormat("content parts of type '%s' are not supported (input_text "
                                   "and output_text are)",
                                   type));
    }
    text += part["text"].get<std::string>();
  }
  return text;
}

// A function_call input item (the model's earlier call) or function_call_output (its
// result) as the chat messages a template renders: calls in one assistant message.
absl::Status AddToolItem(const Json& item, Json& messages) {
  const auto text = [&](const char* key) -> absl::StatusOr<std::string> {
    if (!item.contains(key) || !item[key].is_string()) {
      return InvalidOpenAiParam(
          "input", absl::StrFormat("a %s item needs a string '%s'", NameField(item, "type"), key));
    }
    return item[key].get<std::string>();
  };
  absl::StatusOr<std::string> call_id = text("call_id");
  if (!call_id.ok()) return call_id.status();
  if (NameField(item, "type") == "function_call_output") {
    absl::StatusOr<std::string> output = text("output");
    if (!output.ok()) return output.status();
    messages.push_back(Json{{"role", "tool"}, {"tool_call_id", *call_id}, {"content", *output}});
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> name = text("name");
  if (!name.ok()) return name.status();
  absl::StatusOr<std::string> arguments = text("arguments");
  if (!arguments.ok()) return arguments.status();
  const Json call{{"id", *call_id},
                  {"type", "function"},
                  {"function", {{"name", *name}, {"arguments", *arguments}}}};
  if (messages.empty() || messages.back().value("role", "") != "assistant" ||
      !messages.back().contains("tool_calls")) {
    messages.push_back(
        Json{{"role", "assistant"}, {"content", nullptr}, {"tool_calls", Json::array()}});
  }
  messages.back()["tool_calls"].push_back(call);
  return absl::OkStatus();
}

// Responses' flat function tools ({type, name, description, parameters}) and tool_choice
// as the chat completions fields.
absl::Status ChatTools(const Json& body, Json& chat) {
  if (auto tools = body.find("tools"); tools != body.end() && !tools->is_null()) {
    if (!tools->is_array()) return InvalidOpenAiParam("tools", "'tools' must be a list");
    Json out = Json::array();
    for (const Json& tool : *tools) {
      if (!tool.is_object() || !tool.contains("type") || tool["type"] != "function") {
        return InvalidOpenAiParam("tools", "only function tools are supported on /v1/responses");
      }
      Json function = Json::object();
      for (const char* key : {"name", "description", "parameters", "strict"}) {
        if (tool.contains(key)) function[key] = tool[key];
      }
      out.push_back(Json{{"type", "function"}, {"function", std::move(function)}});
    }
    if (!out.empty()) chat["tools"] = std::move(out);
  }
  if (auto choice = body.find("tool_choice"); choice != body.end() && !choice->is_null()) {
    if (choice->is_object() && choice->contains("type") && (*choice)["type"] == "function" &&
        choice->contains("name")) {
      chat["tool_choice"] = Json{{"type", "function"}, {"function", {{"name", (*choice)["name"]}}}};
    } else {
      chat["tool_choice"] = *choice;
    }
  }
  if (auto parallel = body.find("parallel_tool_calls"); parallel != body.end()) {
    chat["parallel_tool_calls"] = *parallel;
  }
  return absl::OkStatus();
}

// The chat completions body of a Responses request.
absl::StatusOr<Json> ChatBody(const Json& body) {
  for (const char* name : {"previous_response_id", "conversation", "prompt"}) {
    const auto it = body.find(name);
    if (it != body.end() && !it->is_null() && !(it->is_array() && it->empty())) {
      return InvalidOpenAiParam(
          name,
          absl::StrFormat("'%s' is not supported on /v1/responses (nothing is stored)", name));
    }
  }
  if (body.value("background", false) == true) {
    return InvalidOpenAiParam("background", "'background' responses are not supported");
  }
  Json messages = Json::array();
  if (auto it = body.find("instructions"); it != body.end() && !it->is_null()) {
    if (!it->is_string()) return InvalidOpenAiParam("instructions", "'instructions' must be a string");
    messages.push_back(Json{{"role", "system"}, {"content", *it}});
  }
  const auto input = body.find("input");
  if (input == body.end() || input->is_null()) {
    return InvalidOpenAiParam("input", "'input' is required");
  }
  if (input->is_string()) {
    messages.push_back(Json{{"role", "user"}, {"content", *input}});
  } else if (input->is_array() && !input->empty()) {
    for (const Json& item : *input) {
      const std::string type = item.is_object() ? NameField(item, "type", "message") : "";
      if (type == "function_call" || type == "function_call_output") {
        absl::Status added = AddToolItem(item, messages);
        if (!added.ok()) return added;
        continue;
      }
      if (type != "message" || !item.contains("role") || !item["role"].is_string() ||
          !item.contains("content")) {
        return InvalidOpenAiParam("input",
                                  "'input' items must be messages ({role, content}), "
                                  "function_call or function_call_output items");
      }
      absl::StatusOr<std::string> text = MessageText(item["content"]);
      if (!text.ok()) return text.status();
      const std::string role = item["role"].get<std::string>();
      messages.push_back(Json{{"role", role == "developer" ? "system" : role}, {"content", *text}});
    }
  } else {
    return InvalidOpenAiParam("input", "'input' must be a string or a non-empty list of messages");
  }
  Json chat = Json::object();
  chat["messages"] = std::move(messages);
  for (const char* name : {"model", "temperature", "top_p", "seed", "user", "stream", "top_k",
                           "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty",
                           "stop", "logit_bias", "priority", "cache_salt", "chat_template_kwargs"}) {
    if (auto it = body.find(name); it != body.end()) chat[name] = *it;
  }
  // reasoning: {effort} is the chat's reasoning_effort (the template's variable).
  if (auto it = body.find("reasoning"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) return InvalidOpenAiParam("reasoning", "'reasoning' must be an object");
    if (auto effort = it->find("effort"); effort != it->end() && !effort->is_null()) {
      chat["reasoning_effort"] = *effort;
    }
  }
  if (auto it = body.find("max_output_tokens"); it != body.end() && !it->is_null()) {
    if (!it->is_number_integer() || it->get<int64_t>() < 1) {
      return InvalidOpenAiParam("max_output_tokens",
                                "'max_output_tokens' must be an integer of at least 1");
    }
    chat["max_tokens"] = *it;
  }
  if (absl::Status tools = ChatTools(body, chat); !tools.ok()) return tools;
  if (auto text = body.find("text"); text != body.end() && !text->is_null()) {
    if (!text->is_object()) return InvalidOpenAiParam("text", "'text' must be an object");
    auto format = text->find("format");
    if (format != text->end() && !format->is_null() && !format->is_object()) {
      return InvalidOpenAiParam("text.format", "'text.format' must be an object");
    }
    if (format != text->end() && format->is_object()) {
      absl::StatusOr<std::string> type = StringOr(*format, "type", "text", "text.format");
      if (!type.ok()) return type.status();
      absl::StatusOr<std::string> name = StringOr(*format, "name", "response", "text.format");
      if (!name.ok()) return name.status();
      if (*type == "json_schema") {
        if (!format->contains("schema") || !(*format)["schema"].is_object()) {
          return InvalidOpenAiParam("text",
                                    "text.format of type json_schema needs a 'schema' object");
        }
        Json schema{{"name", *name}, {"schema", (*format)["schema"]}};
        if (format->contains("strict")) schema["strict"] = (*format)["strict"];
        chat["response_format"] = Json{{"type", "json_schema"}, {"json_schema", std::move(schema)}};
      } else if (*type == "json_object") {
        chat["response_format"] = Json{{"type", "json_object"}};
      } else if (*type != "text") {
        return InvalidOpenAiParam("text",
                                  absl::StrFormat("text.format type '%s' is not supported", *type));
      }
    }
  }
  if (chat.contains("stream") && chat["stream"] == true) {
    chat["stream_options"] = Json{{"include_usage", true}};
  }
  return chat;
}

// The response object around `output` (the message items), as OpenAI writes it.
Json ResponseObject(const std::string& id, int64_t created, const Json& request, const std::string& model,
                    const char* status, Json output, const Json& usage, const char* incomplete) {
  Json response;
  response["id"] = id;
  response["object"] = "response";
  response["created_at"] = created;
  response["status"] = status;
  response["error"] = nullptr;
  response["incomplete_details"] =
      incomplete != nullptr ? Json{{"reason", incomplete}} : Json(nullptr);
  response["instructions"] = request.value("instructions", Json());
  response["max_output_tokens"] = request.value("max_output_tokens", Json());
  response["model"] = model;
  response["output"] = std::move(output);
  response["parallel_tool_calls"] = request.value("parallel_tool_calls", Json(true));
  response["previous_response_id"] = nullptr;
  response["store"] = false;
  response["temperature"] = request.value("temperature", Json(1.0));
  response["text"] = request.value("text", Json{{"format", {{"type", "text"}}}});
  response["tool_choice"] = request.value("tool_choice", Json("auto"));
  response["tools"] = request.value("tools", Json::array());
  response["top_p"] = request.value("top_p", Json(1.0));
  response["truncation"] = "disabled";
  response["usage"] = usage;
  response["user"] = request.value("user", Json());
  response["metadata"] = request.value("metadata", Json::object());
  return response;
}

Json MessageItem(const std::string& id, const char* status, const Json& content) {
  return Json{{"type", "message"}, {"id", id}, {"status", status}, {"role", "assistant"},
              {"content", content}};
}

Json FunctionCallItem(const std::string& id, const std::string& call_id, const std::string& name,
                      const std::string& arguments, const char* status) {
  return Json{{"type", "function_call"}, {"id", id},        {"call_id", call_id}, {"name", name},
              {"arguments", arguments},  {"status", status}};
}

Json TextPart(const std::string& text) {
  return Json{{"type", "output_text"}, {"text", text}, {"annotations", Json::array()}};
}

// Chat completion usage as Responses usage.
Json Usage(const Json& chat_usage) {
  if (!chat_usage.is_object()) return nullptr;
  const int64_t input = chat_usage.value("prompt_tokens", 0);
  const int64_t output = chat_usage.value("completion_tokens", 0);
  int64_t cached = 0;
  if (auto details = chat_usage.find("prompt_tokens_details"); details != chat_usage.end()) {
    cached = details->value("cached_tokens", 0);
  }
  return Json{{"input_tokens", input},
              {"input_tokens_details", {{"cached_tokens", cached}}},
              {"output_tokens", output},
              {"output_tokens_details", {{"reasoning_tokens", 0}}},
              {"total_tokens", input + output}};
}

// Turns the chat completion stream into the Responses event sequence: a message item when
// text arrives, a function_call item per call, numbered in the order they open (the
// whole response's output: a message only with text, or when nothing else came).
class EventTranslator {
 public:
  EventTranslator(Json request, std::string model)
      : request_(std::move(request)),
        model_(std::move(model)),
        id_(NewId("resp_")),
        item_id_(NewId("msg_")),
        created_(absl::ToUnixSeconds(absl::Now())) {}

  // The events before any output.
  std::string Start() {
    Json in_progress = ResponseObject(id_, created_, request_, model_, "in_progress", Json::array(),
                                      nullptr, nullptr);
    std::string out = Event("response.created", Json{{"response", in_progress}});
    out += Event("response.in_progress", Json{{"response", in_progress}});
    return out;
  }

  // One chat SSE event ("data: {...}" or a comment) as Responses events.
  std::string Translate(const std::string& event) {
    if (event.rfind("data: ", 0) != 0) return event + "\n\n";  // keep-alive comments pass
    const std::string data = event.substr(6);
    if (data == "[DONE]") return Finish();
    const Json chunk = Json::parse(data, nullptr, /*allow_exceptions=*/false);
    if (!chunk.is_object()) return "";
    if (chunk.contains("error")) {
      failed_ = true;
      Json response = ResponseObject(id_, created_, request_, model_, "failed", Json::array(),
                                     nullptr, nullptr);
      response["error"] = {{"code", "server_error"},
                           {"message", chunk["error"].value("message", "the request failed")}};
      return Event("error", Json{{"code", "server_error"},
                                 {"message", chunk["error"].value("message", "")}, {"param", nullptr}}) +
             Event("response.failed", Json{{"response", response}});
    }
    if (chunk.contains("usage") && chunk["usage"].is_object()) usage_ = Usage(chunk["usage"]);
    std::string out;
    for (const Json& choice : chunk.value("choices", Json::array())) {
      const Json delta = choice.value("delta", Json::object());
      if (delta.contains("content") && delta["content"].is_string() &&
          !delta["content"].get<std::string>().empty()) {
        const std::string piece = delta["content"].get<std::string>();
        text_ += piece;
        out += OpenMessage();
        out += Event("response.output_text.delta", Json{{"item_id", item_id_},
                                                        {"output_index", message_index_},
                                                        {"content_index", 0},
                                                        {"delta", piece},
                                                        {"logprobs", Json::array()}});
      }
      for (const Json& part : delta.value("tool_calls", Json::array())) out += CallDelta(part);
      if (choice.contains("finish_reason") && choice["finish_reason"].is_string()) {
        finish_ = choice["finish_reason"].get<std::string>();
      }
    }
    return out;
  }

 private:
  // A call's first delta (its id and name) opens a function_call item (numbered in the order
  // items open);
  // argument deltas follow as response.function_call_arguments.delta.
  struct Call {
    std::string item_id, call_id, name, arguments;
    int output_index = 0;
  };

  // The message item's opening events, once.
  std::string OpenMessage() {
    if (message_index_ >= 0) return "";
    message_index_ = next_index_++;
    std::string out = Event("response.output_item.added",
                            Json{{"output_index", message_index_},
                                 {"item", MessageItem(item_id_, "in_progress", Json::array())}});
    out += Event("response.content_part.added", Json{{"item_id", item_id_},
                                                     {"output_index", message_index_},
                                                     {"content_index", 0},
                                                     {"part", TextPart("")}});
    return out;
  }

  std::string CallDelta(const Json& part) {
    const size_t index = part.value("index", size_t{0});
    std::string out;
    const Json function = part.value("function", Json::object());
    if (index >= calls_.size()) {
      calls_.resize(index + 1);
      Call& call = calls_[index];
      call.item_id = NewId("fc_");
      call.call_id = part.value("id", "");
      call.name = function.value("name", "");
      call.output_index = next_index_++;
      out += Event("response.output_item.added",
                   Json{{"output_index", call.output_index},
                        {"item", FunctionCallItem(call.item_id, call.call_id, call.name, "",
                                                  "in_progress")}});
    }
    Call& call = calls_[index];
    const std::string piece = function.value("arguments", "");
    if (!piece.empty()) {
      call.arguments += piece;
      out += Event(
          "response.function_call_arguments.delta",
          Json{{"item_id", call.item_id}, {"output_index", call.output_index}, {"delta", piece}});
    }
    return out;
  }

  std::string Finish() {
    if (failed_) return "";
    const bool cut = finish_ == "length";
    std::string out;
    // A reply with neither text nor calls is one empty message, as the whole response has.
    if (calls_.empty()) out += OpenMessage();
    std::vector<std::pair<int, Json>> items;  // (output index, item)
    if (message_index_ >= 0) {
      out += Event("response.output_text.done", Json{{"item_id", item_id_},
                                                     {"output_index", message_index_},
                                                     {"content_index", 0},
                                                     {"text", text_},
                                                     {"logprobs", Json::array()}});
      out += Event("response.content_part.done", Json{{"item_id", item_id_},
                                                      {"output_index", message_index_},
                                                      {"content_index", 0},
                                                      {"part", TextPart(text_)}});
      const Json item =
          MessageItem(item_id_, cut ? "incomplete" : "completed", Json::array({TextPart(text_)}));
      out += Event("response.output_item.done",
                   Json{{"output_index", message_index_}, {"item", item}});
      items.emplace_back(message_index_, item);
    }
    for (const Call& call : calls_) {
      out +=
          Event("response.function_call_arguments.done", Json{{"item_id", call.item_id},
                                                              {"output_index", call.output_index},
                                                              {"arguments", call.arguments}});
      const Json done = FunctionCallItem(call.item_id, call.call_id, call.name, call.arguments,
                                         cut ? "incomplete" : "completed");
      out += Event("response.output_item.done",
                   Json{{"output_index", call.output_index}, {"item", done}});
      items.emplace_back(call.output_index, done);
    }
    std::sort(items.begin(), items.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    Json output = Json::array();
    for (auto& [index, item] : items) output.push_back(std::move(item));
    const Json response =
        ResponseObject(id_, created_, request_, model_, cut ? "incomplete" : "completed",
                       std::move(output), usage_, cut ? "max_output_tokens" : nullptr);
    out += Event(cut ? "response.incomplete" : "response.completed", Json{{"response", response}});
    return out;
  }

  std::string Event(const char* type, Json fields) {
    Json event = Json::object();
    event["type"] = type;
    event["sequence_number"] = sequence_++;
    for (auto& [key, value] : fields.items()) event[key] = std::move(value);
    return absl::StrFormat("event: %s\ndata: %s\n\n", type,
                           event.dump(-1, ' ', false, Json::error_handler_t::replace));
  }

  const Json request_;
  const std::string model_;
  const std::string id_;
  const std::string item_id_;
  const int64_t created_;
  int64_t sequence_ = 0;
  std::string text_;
  std::string finish_;
  Json usage_;
  bool failed_ = false;
  int message_index_ = -1;  // the message item's output index once opened
  int next_index_ = 0;
  std::vector<Call> calls_;
};

// The chat completion's answer, translated into the Responses API's as it goes out:
// errors unchanged, a whole completion as one response object, a stream's chunks as the
// Responses events.
class ResponsesResponder final : public HttpResponder {
 public:
  ResponsesResponder(std::shared_ptr<HttpResponder> outer, Json request, const std::string& model)
      : outer_(std::move(outer)), request_(std::move(request)), translator_(request_, model) {}

  void Respond(HttpResponse answer) override {
    if (answer.status >= 400 || answer.body.empty()) return outer_->Respond(std::move(answer));
    const Json completion = Json::parse(answer.body, nullptr, /*allow_exceptions=*/false);
    const Json& choice = completion["choices"][0];
    const bool cut = choice.value("finish_reason", "") == "length";
    const Json content = choice["message"].value("content", Json(""));
    const Json calls = choice["message"].value("tool_calls", Json::array());
    Json output = Json::array();
    if (calls.empty() || (content.is_string() && !content.get<std::string>().empty())) {
      output.push_back(MessageItem(
          NewId("msg_"), cut ? "incomplete" : "completed",
          Json::array({TextPart(content.is_string() ? content.get<std::string>() : "")})));
    }
    for (const Json& call : calls) {
      output.push_back(FunctionCallItem(
          NewId("fc_"), call.value("id", ""), call["function"].value("name", ""),
          call["function"].value("arguments", ""), cut ? "incomplete" : "completed"));
    }
    const Json out = ResponseObject(
        NewId("resp_"), completion.value("created", int64_t{0}), request_,
        completion.value("model", ""), cut ? "incomplete" : "completed", std::move(output),
        Usage(completion["usage"]), cut ? "max_output_tokens" : nullptr);
    HttpResponse response;
    response.set_content(out.dump(-1, ' ', false, Json::error_handler_t::replace),
                         "application/json");
    outer_->Respond(std::move(response));
  }

  void StartStream(HttpResponse head) override {
    outer_->StartStream(std::move(head));
    outer_->Write(translator_.Start());
  }

  // The chat stream's events, each translated once whole (writes come from one thread at
  // a time: the answer's).
  bool Write(std::string data) override {
    pending_ += data;
    std::string events;
    for (size_t end = pending_.find("\n\n"); end != std::string::npos;
         end = pending_.find("\n\n")) {
      events += translator_.Translate(pending_.substr(0, end));
      pending_.erase(0, end + 2);
    }
    return events.empty() ? !outer_->Closed() : outer_->Write(std::move(events));
  }

  void End() override { outer_->End(); }
  bool Busy() const override { return outer_->Busy(); }
  bool Closed() const override { return outer_->Closed(); }
  void SetWakeup(std::function<void()> wakeup) override { outer_->SetWakeup(std::move(wakeup)); }

 private:
  const std::shared_ptr<HttpResponder> outer_;
  const Json request_;
  EventTranslator translator_;
  std::string pending_;
};

}  // namespace

void ResponsesApi::Create(const HttpRequest& request, std::shared_ptr<HttpResponder> responder) {
  auto refuse = [&responder](const absl::Status& status) {
    HttpResponse response;
    OpenAiService::WriteError(status, response);
    responder->Respond(std::move(response));
  };
  const Json body = Json::parse(request.body, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded() || !body.is_object()) {
    return refuse(InvalidOpenAiParam("", "the request body must be a JSON object"));
  }
  absl::StatusOr<Json> chat = ChatBody(body);
  if (!chat.ok()) return refuse(chat.status());
  HttpRequest inner = request;
  inner.body = chat->dump(-1, ' ', false, Json::error_handler_t::replace);
  openai_.ChatCompletions(
      inner, std::make_shared<ResponsesResponder>(std::move(responder), body, openai_.model().id));
}

}  // namespace loom::api
