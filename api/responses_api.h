#pragma once

// POST /v1/responses: OpenAI's Responses API, a documented subset, served through the chat
// completions path (the same rendering, sampling, structured output and errors).
//
// Taken: `input` (a string, or messages with string or input_text/output_text content),
// `instructions` (a system message first), `max_output_tokens`, `temperature`, `top_p`,
// `seed`, `user`, `metadata` (echoed), `text.format` (text, json_object, json_schema),
// `stream` (the response.* event sequence for one text message), and the sampling fields
// Loom's chat takes. Refused with a 400 naming the field: `tools`, `previous_response_id`,
// `conversation`, `background`, `prompt`, and input items other than messages. Nothing is
// stored: `store` is answered false.

#include "api/openai_service.h"
#include "httplib.h"

namespace loom::api {

class ResponsesApi {
 public:
  explicit ResponsesApi(OpenAiService& openai) : openai_(openai) {}

  void Create(const httplib::Request& request, httplib::Response& response);

 private:
  OpenAiService& openai_;
};

}  // namespace loom::api
