#pragma once

// POST /v1/responses: OpenAI's Responses API, a documented subset, served through the chat
// completions path (the same rendering, sampling, structured output and errors).
//
// Taken: `input` (a string, or messages with string or input_text/output_text content),
// `instructions` (a system message first), `max_output_tokens`, `temperature`, `top_p`,
// `seed`, `user`, `metadata` (echoed), `text.format` (text, json_object, json_schema),
// `stream` (the response.* event sequence: one text message, then one function_call item
// per call with response.function_call_arguments.delta/done), function `tools` (flat:
// {type, name, description, parameters}), `tool_choice`, `parallel_tool_calls`,
// `function_call` / `function_call_output` input items (rendered as the assistant's calls
// and tool messages), and the sampling fields Loom's chat takes. Refused with a 400 naming
// the field: `previous_response_id`, `conversation`, `background`, `prompt`, tools other
// than functions, and other input item types. Nothing is stored: `store` is answered false.

#include "api/http_message.h"
#include "api/http_responder.h"
#include "api/openai_service.h"

namespace loom::api {

class ResponsesApi {
 public:
  explicit ResponsesApi(OpenAiService& openai) : openai_(openai) {}

  void Create(const HttpRequest& request, std::shared_ptr<HttpResponder> responder);

 private:
  OpenAiService& openai_;
};

}  // namespace loom::api
