#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace loom::api {

/// vLLM's scoring APIs over embeddings (a decoder model pooled like POST /v1/embeddings):
/// a pair's score is the cosine similarity of the two texts' embeddings.
///
/// POST /v1/score (and /score): `text_1` a string or a list, `text_2` a string or a list;
/// one against many pairs the one with each, two lists of one length pair up in order.
struct ScoreRequest {
  std::string model;
  std::vector<std::string> texts;                // text_1's texts, then text_2's
  size_t text_1_count = 0;                       // how many of `texts` are text_1's
  std::vector<std::pair<size_t, size_t>> pairs;  // indices into `texts`, in answer order
};
absl::StatusOr<ScoreRequest> ParseScoreRequest(std::string_view body);

/// POST /v1/rerank (and /rerank; Jina's and Cohere's shape): `query`, `documents` (strings),
/// `top_n` (default all), `return_documents` (default true): documents ranked by their
/// score against the query, best first.
struct RerankRequest {
  std::string model;
  std::string query;
  std::vector<std::string> documents;
  size_t top_n = 0;
  bool return_documents = true;
};
absl::StatusOr<RerankRequest> ParseRerankRequest(std::string_view body);

/// The cosine similarity of two embeddings (unit vectors from the worker: their dot product,
/// computed in double and divided by the norms again so it stays in [-1, 1]).
double Cosine(const std::vector<float>& a, const std::vector<float>& b);

/// Response bodies: `scores` per pair (score), per document (rerank).
std::string ScoreResponseJson(const std::string& id, int64_t created, const std::string& model,
                              const std::vector<double>& scores, int64_t prompt_tokens);
std::string RerankResponseJson(const std::string& id, const std::string& model,
                               const RerankRequest& request, const std::vector<double>& scores,
                               int64_t prompt_tokens);

}  // namespace loom::api
