// OpenAiService's /tokenize and /detokenize (vLLM's endpoints): token ids of a text and
// the text of token ids, with the served model's tokenizer.
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "api/openai_request.h"
#include "api/openai_service.h"
#include "nlohmann/json.hpp"

namespace loom::api {
namespace {

using Json = nlohmann::ordered_json;

}  // namespace

void OpenAiService::Tokenize(const HttpRequest& request, HttpResponse& response) {
  const Json body = Json::parse(request.body, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded() || !body.is_object()) {
    WriteError(InvalidOpenAiParam("", "the request body must be a JSON object"), response);
    return;
  }
  bool add_special = true;
  if (auto it = body.find("add_special_tokens"); it != body.end() && !it->is_null()) {
    if (!it->is_boolean()) {
      WriteError(InvalidOpenAiParam("add_special_tokens", "'add_special_tokens' must be a boolean"),
                 response);
      return;
    }
    add_special = it->get<bool>();
  }
  if (body.contains("messages") && body.contains("prompt")) {
    WriteError(InvalidOpenAiParam("prompt", "give 'prompt' or 'messages', not both"), response);
    return;
  }
  std::vector<int32_t> ids;
  if (body.contains("messages")) {
    // Rendered exactly as /v1/chat/completions renders them.
    absl::StatusOr<OpenAiRequest> parsed = ParseOpenAiRequest(
        OpenAiEndpoint::kChatCompletions, request.body, tokenizer_, chat_template_);
    if (!parsed.ok()) {
      WriteError(parsed.status(), response);
      return;
    }
    const auto& prompt_ids = parsed->prompts[0].token_ids().ids();
    ids.assign(prompt_ids.begin(), prompt_ids.end());
  } else if (auto it = body.find("prompt"); it != body.end() && it->is_string()) {
    ids = tokenizer_.Encode(it->get<std::string>(), add_special, /*parse_special=*/true);
  } else {
    WriteError(InvalidOpenAiParam("prompt", "'prompt' (a string) or 'messages' is required"),
               response);
    return;
  }
  Json out;
  out["count"] = ids.size();
  out["max_model_len"] = config_.context_length;
  out["tokens"] = ids;
  response.set_content(out.dump(-1, ' ', false, Json::error_handler_t::replace),
                       "application/json");
}

void OpenAiService::Detokenize(const HttpRequest& request, HttpResponse& response) {
  const Json body = Json::parse(request.body, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded() || !body.is_object()) {
    WriteError(InvalidOpenAiParam("", "the request body must be a JSON object"), response);
    return;
  }
  auto it = body.find("tokens");
  if (it == body.end() || !it->is_array()) {
    WriteError(InvalidOpenAiParam("tokens", "'tokens' must be a list of token ids"), response);
    return;
  }
  std::vector<int32_t> ids;
  for (const Json& id : *it) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
        id.get<int64_t>() >= config_.vocab_size) {
      WriteError(InvalidOpenAiParam("tokens", absl::StrFormat("'tokens' must hold ids in [0, %d)",
                                                              config_.vocab_size)),
                 response);
      return;
    }
    ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
  }
  absl::StatusOr<std::string> text = tokenizer_.Decode(ids, /*skip_special=*/false);
  if (!text.ok()) {
    WriteError(InvalidOpenAiParam("tokens", std::string(text.status().message())), response);
    return;
  }
  Json out;
  out["prompt"] = *text;
  response.set_content(out.dump(-1, ' ', false, Json::error_handler_t::replace),
                       "application/json");
}

}  // namespace loom::api
