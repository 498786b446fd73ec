#include "api/pooling_service.h"

#include <random>
#include <utility>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "api/embeddings_api.h"
#include "api/openai_request.h"
#include "api/openai_service.h"
#include "api/score_api.h"

namespace loom::api {
namespace {

uint64_t RandomId() {
  thread_local std::mt19937_64 generator{std::random_device{}()};
  return generator();
}

}  // namespace

PoolingService::PoolingService(coordinator::Cluster& cluster, const ServedModel& model,
                               const common::ModelConfig& config,
                               const common::Tokenizer& tokenizer,
                               coordinator::CoordinatorMetrics* metrics)
    : model_(model), config_(config), embedder_(cluster, config, tokenizer, metrics) {}

absl::Status PoolingService::CheckModel(const std::string& model) const {
  if (model_.Matches(model)) return absl::OkStatus();
  return absl::NotFoundError(
      absl::StrFormat("the model '%s' does not exist; this server serves '%s'", model, model_.id));
}

void PoolingService::Embeddings(const HttpRequest& request, HttpResponse& response,
                                const std::function<bool()>& cancelled) {
  absl::StatusOr<EmbeddingsRequest> parsed =
      ParseEmbeddingsRequest(request.body, config_.hidden_size);
  if (!parsed.ok()) return OpenAiService::WriteError(parsed.status(), response);
  if (absl::Status model = CheckModel(parsed->model); !model.ok()) {
    return OpenAiService::WriteError(model, response);
  }
  absl::StatusOr<EmbeddingBatch> embeddings = embedder_.Embed(parsed->inputs, cancelled);
  if (!embeddings.ok()) {
    absl::Status status = embeddings.status();
    // An input the model cannot take (empty, too long, ids outside the vocabulary).
    if (absl::IsInvalidArgument(status) && OpenAiErrorParam(status).empty()) {
      status = InvalidOpenAiParam("input", std::string(status.message()));
    }
    return OpenAiService::WriteError(status, response);
  }
  response.set_content(EmbeddingsResponseJson(embeddings->vectors, parsed->base64, model_.id,
                                              embeddings->prompt_tokens),
                       "application/json");
}

namespace {

// Text prompts of one output token each.
std::vector<loom::v1::GenerateRequest> TextPrompts(const std::vector<std::string>& texts) {
  std::vector<loom::v1::GenerateRequest> prompts(texts.size());
  for (size_t i = 0; i < texts.size(); ++i) {
    prompts[i].set_text(texts[i]);
    prompts[i].set_max_tokens(1);
  }
  return prompts;
}

}  // namespace

void PoolingService::Score(const HttpRequest& request, HttpResponse& response,
                           const std::function<bool()>& cancelled) {
  absl::StatusOr<ScoreRequest> parsed = ParseScoreRequest(request.body);
  if (!parsed.ok()) return OpenAiService::WriteError(parsed.status(), response);
  if (absl::Status model = CheckModel(parsed->model); !model.ok()) {
    return OpenAiService::WriteError(model, response);
  }
  // The texts are text_1's, then text_2's: an error names the list and the position in it.
  const size_t first = parsed->text_1_count;
  absl::StatusOr<EmbeddingBatch> embeddings =
      embedder_.Embed(TextPrompts(parsed->texts), cancelled, [first](size_t i) {
        return i < first ? absl::StrFormat("text_1[%d]", i)
                         : absl::StrFormat("text_2[%d]", i - first);
      });
  if (!embeddings.ok()) return OpenAiService::WriteError(embeddings.status(), response);
  std::vector<double> scores;
  for (const auto& [a, b] : parsed->pairs)
    scores.push_back(Cosine(embeddings->vectors[a], embeddings->vectors[b]));
  response.set_content(ScoreResponseJson(absl::StrFormat("score-%016x", RandomId()),
                                         absl::ToUnixSeconds(absl::Now()), model_.id, scores,
                                         embeddings->prompt_tokens),
                       "application/json");
}

void PoolingService::Rerank(const HttpRequest& request, HttpResponse& response,
                            const std::function<bool()>& cancelled) {
  absl::StatusOr<RerankRequest> parsed = ParseRerankRequest(request.body);
  if (!parsed.ok()) return OpenAiService::WriteError(parsed.status(), response);
  if (absl::Status model = CheckModel(parsed->model); !model.ok()) {
    return OpenAiService::WriteError(model, response);
  }
  std::vector<std::string> texts = {parsed->query};
  texts.insert(texts.end(), parsed->documents.begin(), parsed->documents.end());
  absl::StatusOr<EmbeddingBatch> embeddings =
      embedder_.Embed(TextPrompts(texts), cancelled, [](size_t i) {
        return i == 0 ? std::string("query") : absl::StrFormat("documents[%d]", i - 1);
      });
  if (!embeddings.ok()) return OpenAiService::WriteError(embeddings.status(), response);
  std::vector<double> scores;
  for (size_t d = 1; d < embeddings->vectors.size(); ++d) {
    scores.push_back(Cosine(embeddings->vectors[0], embeddings->vectors[d]));
  }
  response.set_content(RerankResponseJson(absl::StrFormat("rerank-%016x", RandomId()), model_.id,
                                          *parsed, scores, embeddings->prompt_tokens),
                       "application/json");
}

}  // namespace loom::api
