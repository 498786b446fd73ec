#include "api/openai_logprobs.h"

#include <string>

namespace loom::api {
namespace {

using Json = nlohmann::ordered_json;

// The completions API's empty parallel arrays.
Json CompletionLogprobs() {
  Json logprobs;
  logprobs["tokens"] = Json::array();
  logprobs["token_logprobs"] = Json::array();
  logprobs["top_logprobs"] = Json::array();
  logprobs["text_offset"] = Json::array();
  return logprobs;
}

}  // namespace

std::string LogprobToken(const common::Tokenizer& tokenizer, int32_t token_id, bool as_token_ids) {
  return as_token_ids ? "token_id:" + std::to_string(token_id) : tokenizer.TokenBytes(token_id);
}

void AppendLogprobs(bool chat, const common::Tokenizer& tokenizer,
                    const loom::v1::SequenceOutput& output, Json& logprobs, int64_t& text_offset,
                    bool as_token_ids) {
  auto bytes_of = [](const std::string& text) {
    Json bytes = Json::array();
    for (unsigned char c : text) bytes.push_back(static_cast<int>(c));
    return bytes;
  };
  const std::string text = tokenizer.TokenBytes(output.token_id());
  const std::string token = as_token_ids ? LogprobToken(tokenizer, output.token_id(), true) : text;
  if (chat) {
    if (logprobs.is_null()) logprobs["content"] = Json::array();
    Json entry;
    entry["token"] = token;
    entry["logprob"] = output.logprob();
    entry["bytes"] = bytes_of(token);
    entry["top_logprobs"] = Json::array();
    for (const loom::v1::TokenLogprob& top : output.top_logprobs()) {
      const std::string name = LogprobToken(tokenizer, top.token_id(), as_token_ids);
      Json alternative;
      alternative["token"] = name;
      alternative["logprob"] = top.logprob();
      alternative["bytes"] = bytes_of(name);
      entry["top_logprobs"].push_back(std::move(alternative));
    }
    logprobs["content"].push_back(std::move(entry));
    return;
  }
  if (logprobs.is_null()) {
    logprobs["tokens"] = Json::array();
    logprobs["token_logprobs"] = Json::array();
    logprobs["top_logprobs"] = Json::array();
    logprobs["text_offset"] = Json::array();
  }
  logprobs["tokens"].push_back(token);
  logprobs["token_logprobs"].push_back(output.logprob());
  Json top = Json::object();
  for (const loom::v1::TokenLogprob& alternative : output.top_logprobs()) {
    top[LogprobToken(tokenizer, alternative.token_id(), as_token_ids)] = alternative.logprob();
  }
  logprobs["top_logprobs"].push_back(std::move(top));
  logprobs["text_offset"].push_back(text_offset);
  text_offset += static_cast<int64_t>(text.size());
}

Json EchoLogprobs(const std::vector<int32_t>& prompt_ids,
                  const std::vector<std::optional<engine::PromptTokenLogprob>>& scores, int top,
                  const common::Tokenizer& tokenizer, const Json& generated, bool as_token_ids) {
  Json logprobs = CompletionLogprobs();
  int64_t offset = 0;
  for (size_t i = 0; i < prompt_ids.size(); ++i) {
    const std::string text = tokenizer.TokenBytes(prompt_ids[i]);
    const std::optional<engine::PromptTokenLogprob>* score =
        i > 0 && i < scores.size() && scores[i] ? &scores[i] : nullptr;
    logprobs["tokens"].push_back(LogprobToken(tokenizer, prompt_ids[i], as_token_ids));
    logprobs["token_logprobs"].push_back(score ? Json((*score)->logprob) : Json(nullptr));
    if (score == nullptr) {
      logprobs["top_logprobs"].push_back(nullptr);
    } else {
      Json alternatives = Json::object();
      for (size_t k = 0; k < (*score)->top.size() && static_cast<int>(k) < top; ++k) {
        alternatives[LogprobToken(tokenizer, (*score)->top[k].token_id(), as_token_ids)] =
            (*score)->top[k].logprob();
      }
      logprobs["top_logprobs"].push_back(std::move(alternatives));
    }
    logprobs["text_offset"].push_back(offset);
    offset += static_cast<int64_t>(text.size());
  }
  if (generated.is_object()) {
    for (const char* field : {"tokens", "token_logprobs", "top_logprobs"}) {
      for (const Json& value : generated[field]) logprobs[field].push_back(value);
    }
    for (const Json& value : generated["text_offset"]) {
      logprobs["text_offset"].push_back(value.get<int64_t>() + offset);
    }
  }
  return logprobs;
}

Json PromptLogprobs(const std::vector<int32_t>& prompt_ids,
                    const std::vector<std::optional<engine::PromptTokenLogprob>>& scores, int top,
                    const common::Tokenizer& tokenizer) {
  Json out = Json::array();
  for (size_t i = 0; i < prompt_ids.size(); ++i) {
    if (i == 0 || i >= scores.size() || !scores[i]) {
      out.push_back(nullptr);
      continue;
    }
    const engine::PromptTokenLogprob& score = *scores[i];
    Json entry = Json::object();
    entry[std::to_string(prompt_ids[i])] = {{"logprob", score.logprob},
                                            {"rank", score.rank},
                                            {"decoded_token", tokenizer.TokenBytes(prompt_ids[i])}};
    for (size_t k = 0; k < score.top.size() && static_cast<int>(k) < top; ++k) {
      const std::string id = std::to_string(score.top[k].token_id());
      if (entry.contains(id)) continue;
      entry[id] = {{"logprob", score.top[k].logprob()},
                   {"rank", static_cast<int>(k) + 1},
                   {"decoded_token", tokenizer.TokenBytes(score.top[k].token_id())}};
    }
    out.push_back(std::move(entry));
  }
  return out;
}

}  // namespace loom::api
