#include "api/embeddings_api.h"

#include <cstdint>
#include <cstring>

#include "absl/strings/escaping.h"
#include "absl/strings/str_format.h"
#include "api/openai_request.h"
#include "nlohmann/json.hpp"

namespace loom::api {
namespace {

using Json = nlohmann::ordered_json;

// One input as a prompt of one output token.
loom::v1::GenerateRequest Prompt() {
  loom::v1::GenerateRequest prompt;
  prompt.set_max_tokens(1);
  return prompt;
}

absl::StatusOr<loom::v1::GenerateRequest> TokenPrompt(const Json& ids) {
  loom::v1::GenerateRequest prompt = Prompt();
  for (const Json& id : ids) {
    // Range-checked before the narrowing: 2^32 + 1 wrapped to token 1 and was embedded.
    if (!id.is_number_integer() || (id.is_number_unsigned() && id.get<uint64_t>() > INT32_MAX) ||
        (!id.is_number_unsigned() && (id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX))) {
      return InvalidOpenAiParam("input",
                                "a token list in 'input' must hold non-negative token ids");
    }
    prompt.mutable_token_ids()->add_ids(static_cast<int32_t>(id.get<int64_t>()));
  }
  if (ids.empty()) return InvalidOpenAiParam("input", "an input token list is empty");
  return prompt;
}

}  // namespace

absl::StatusOr<EmbeddingsRequest> ParseEmbeddingsRequest(std::string_view body,
                                                         int64_t hidden_size) {
  const Json json = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) {
    return InvalidOpenAiParam("", "the request body must be a JSON object");
  }
  EmbeddingsRequest out;
  auto model = json.find("model");
  if (model == json.end() || !model->is_string()) {
    return InvalidOpenAiParam("model", "'model' (a string) is required");
  }
  out.model = model->get<std::string>();
  if (auto format = json.find("encoding_format"); format != json.end() && !format->is_null()) {
    if (*format != "float" && *format != "base64") {
      return InvalidOpenAiParam("encoding_format",
                                "'encoding_format' must be \"float\" or \"base64\"");
    }
    out.base64 = *format == "base64";
  }
  if (auto dimensions = json.find("dimensions");
      dimensions != json.end() && !dimensions->is_null()) {
    if (!dimensions->is_number_integer() || dimensions->get<int64_t>() != hidden_size) {
      return InvalidOpenAiParam(
          "dimensions", absl::StrFormat("this model's embeddings have %d dimensions; 'dimensions' "
                                        "may only repeat that (no truncation)",
                                        hidden_size));
    }
  }
  auto input = json.find("input");
  if (input == json.end()) return InvalidOpenAiParam("input", "'input' is required");
  if (input->is_string()) {
    out.inputs.push_back(Prompt());
    out.inputs.back().set_text(input->get<std::string>());
  } else if (input->is_array() && !input->empty() && (*input)[0].is_number_integer()) {
    absl::StatusOr<loom::v1::GenerateRequest> prompt = TokenPrompt(*input);
    if (!prompt.ok()) return prompt.status();
    out.inputs.push_back(*std::move(prompt));
  } else if (input->is_array() && !input->empty()) {
    // A list of strings or a list of token lists, not both (OpenAI's and vLLM's shapes).
    const bool texts = (*input)[0].is_string();
    for (const Json& item : *input) {
      if (texts && item.is_string()) {
        out.inputs.push_back(Prompt());
        out.inputs.back().set_text(item.get<std::string>());
      } else if (!texts && item.is_array()) {
        absl::StatusOr<loom::v1::GenerateRequest> prompt = TokenPrompt(item);
        if (!prompt.ok()) return prompt.status();
        out.inputs.push_back(*std::move(prompt));
      } else {
        return InvalidOpenAiParam("input",
                                  "'input' must be a string, a list of strings, or token lists");
      }
    }
  } else {
    return InvalidOpenAiParam(
        "input", "'input' must be a non-empty string, list of strings, or token lists");
  }
  for (const loom::v1::GenerateRequest& prompt : out.inputs) {
    if (prompt.has_text() && prompt.text().empty()) {
      return InvalidOpenAiParam("input", "an input string is empty");
    }
  }
  return out;
}

std::string EmbeddingsResponseJson(const std::vector<std::vector<float>>& embeddings, bool base64,
                                   const std::string& model, int64_t prompt_tokens) {
  Json body;
  body["object"] = "list";
  body["data"] = Json::array();
  for (size_t i = 0; i < embeddings.size(); ++i) {
    Json item;
    item["object"] = "embedding";
    item["index"] = i;
    if (base64) {
      // OpenAI's encoding: the float32 array's bytes (little-endian), base64.
      std::string bytes(embeddings[i].size() * sizeof(float), '\0');
      std::memcpy(bytes.data(), embeddings[i].data(), bytes.size());
      item["embedding"] = absl::Base64Escape(bytes);
    } else {
      item["embedding"] = embeddings[i];
    }
    body["data"].push_back(std::move(item));
  }
  body["model"] = model;
  body["usage"] = {{"prompt_tokens", prompt_tokens}, {"total_tokens", prompt_tokens}};
  return body.dump();
}

}  // namespace loom::api
