#include "api/score_api.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_format.h"
#include "api/openai_request.h"
#include "nlohmann/json.hpp"

namespace loom::api {
namespace {

using Json = nlohmann::ordered_json;

absl::StatusOr<Json> ParseObject(std::string_view body) {
  Json json = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) {
    return InvalidOpenAiParam("", "the request body must be a JSON object");
  }
  auto model = json.find("model");
  if (model == json.end() || !model->is_string()) {
    return InvalidOpenAiParam("model", "'model' (a string) is required");
  }
  return json;
}

// A non-empty string, or a non-empty list of non-empty strings, as a list.
absl::StatusOr<std::vector<std::string>> Texts(const Json& json, const char* name,
                                               bool list_allowed) {
  auto it = json.find(name);
  std::vector<std::string> out;
  if (it != json.end() && it->is_string()) {
    out.push_back(it->get<std::string>());
  } else if (list_allowed && it != json.end() && it->is_array()) {
    for (const Json& item : *it) {
      if (!item.is_string()) break;
      out.push_back(item.get<std::string>());
    }
    if (out.size() != it->size()) out.clear();
  }
  const bool empty_text =
      std::any_of(out.begin(), out.end(), [](const std::string& text) { return text.empty(); });
  if (out.empty() || empty_text) {
    return InvalidOpenAiParam(
        name, absl::StrFormat(list_allowed ? "'%s' must be a non-empty string or list of them"
                                           : "'%s' must be a non-empty string",
                              name));
  }
  return out;
}

}  // namespace

absl::StatusOr<ScoreRequest> ParseScoreRequest(std::string_view body) {
  absl::StatusOr<Json> json = ParseObject(body);
  if (!json.ok()) return json.status();
  absl::StatusOr<std::vector<std::string>> first = Texts(*json, "text_1", true);
  if (!first.ok()) return first.status();
  absl::StatusOr<std::vector<std::string>> second = Texts(*json, "text_2", true);
  if (!second.ok()) return second.status();
  if (first->size() > 1 && first->size() != second->size()) {
    return InvalidOpenAiParam(
        "text_2", absl::StrFormat("'text_1' has %d texts and 'text_2' %d: give one 'text_1' or "
                                  "lists of one length",
                                  first->size(), second->size()));
  }
  ScoreRequest out;
  out.model = (*json)["model"].get<std::string>();
  out.texts = *first;
  out.text_1_count = first->size();
  out.texts.insert(out.texts.end(), second->begin(), second->end());
  for (size_t i = 0; i < second->size(); ++i) {
    out.pairs.emplace_back(first->size() == 1 ? 0 : i, first->size() + i);
  }
  return out;
}

absl::StatusOr<RerankRequest> ParseRerankRequest(std::string_view body) {
  absl::StatusOr<Json> json = ParseObject(body);
  if (!json.ok()) return json.status();
  absl::StatusOr<std::vector<std::string>> query = Texts(*json, "query", false);
  if (!query.ok()) return query.status();
  absl::StatusOr<std::vector<std::string>> documents = Texts(*json, "documents", true);
  if (!documents.ok()) return documents.status();
  if (!(*json)["documents"].is_array()) {
    return InvalidOpenAiParam("documents", "'documents' must be a list of strings");
  }
  RerankRequest out;
  out.model = (*json)["model"].get<std::string>();
  out.query = query->front();
  out.documents = *std::move(documents);
  out.top_n = out.documents.size();
  if (auto top_n = json->find("top_n"); top_n != json->end() && !top_n->is_null()) {
    if (!top_n->is_number_integer() || top_n->get<int64_t>() < 1) {
      return InvalidOpenAiParam("top_n", "'top_n' must be a positive integer");
    }
    out.top_n = std::min<size_t>(out.top_n, top_n->get<size_t>());
  }
  if (auto documents_flag = json->find("return_documents");
      documents_flag != json->end() && !documents_flag->is_null()) {
    if (!documents_flag->is_boolean()) {
      return InvalidOpenAiParam("return_documents", "'return_documents' must be a boolean");
    }
    out.return_documents = documents_flag->get<bool>();
  }
  return out;
}

double Cosine(const std::vector<float>& a, const std::vector<float>& b) {
  double dot = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    dot += static_cast<double>(a[i]) * b[i];
    aa += static_cast<double>(a[i]) * a[i];
    bb += static_cast<double>(b[i]) * b[i];
  }
  return aa > 0 && bb > 0 ? std::clamp(dot / std::sqrt(aa * bb), -1.0, 1.0) : 0.0;
}

std::string ScoreResponseJson(const std::string& id, int64_t created, const std::string& model,
                              const std::vector<double>& scores, int64_t prompt_tokens) {
  Json body;
  body["id"] = id;
  body["object"] = "list";
  body["created"] = created;
  body["model"] = model;
  body["data"] = Json::array();
  for (size_t i = 0; i < scores.size(); ++i) {
    body["data"].push_back({{"index", i}, {"object", "score"}, {"score", scores[i]}});
  }
  body["usage"] = {{"prompt_tokens", prompt_tokens}, {"total_tokens", prompt_tokens}};
  return body.dump();
}

std::string RerankResponseJson(const std::string& id, const std::string& model,
                               const RerankRequest& request, const std::vector<double>& scores,
                               int64_t prompt_tokens) {
  std::vector<size_t> order(scores.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return scores[a] > scores[b]; });
  Json body;
  body["id"] = id;
  body["model"] = model;
  body["usage"] = {{"total_tokens", prompt_tokens}};
  body["results"] = Json::array();
  for (size_t r = 0; r < request.top_n && r < order.size(); ++r) {
    Json result;
    result["index"] = order[r];
    if (request.return_documents) result["document"] = {{"text", request.documents[order[r]]}};
    result["relevance_score"] = scores[order[r]];
    body["results"].push_back(std::move(result));
  }
  return body.dump();
}

}  // namespace loom::api
