#include "api/pooling_service.h"

#include <optional>
#include <random>
#include <utility>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "api/embeddings_api.h"
#include "api/openai_service.h"
#include "api/score_api.h"
#include "engine/request_validation.h"

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
    : cluster_(cluster),
      model_(model),
      config_(config),
      tokenizer_(tokenizer),
      eos_ids_(tokenizer.EndOfGenerationIds()),
      metrics_(metrics) {}

absl::StatusOr<std::vector<std::vector<float>>> PoolingService::Embed(
    const std::vector<loom::v1::GenerateRequest>& inputs, int64_t& prompt_tokens) {
  // Validate every input before placing any, so a bad one leaves nothing running.
  std::vector<engine::RequestParams> params;
  prompt_tokens = 0;
  for (const loom::v1::GenerateRequest& input : inputs) {
    absl::StatusOr<engine::RequestParams> one =
        engine::ValidateGenerateRequest(input, config_, tokenizer_, /*default_temperature=*/0.0f);
    if (!one.ok()) return one.status();
    one->embed = true;
    one->max_tokens = 1;
    prompt_tokens += static_cast<int64_t>(one->prompt_ids.size());
    params.push_back(*std::move(one));
  }
  const uint64_t number = next_id_.fetch_add(1);
  std::vector<std::shared_ptr<engine::Request>> requests;
  for (size_t i = 0; i < params.size(); ++i) {
    auto placed = std::make_shared<engine::Request>(
        absl::StrFormat("embd-%016x%04x-%d", RandomId(), number & 0xffff, i), cluster_.NextSeqId(),
        std::move(params[i]), tokenizer_, eos_ids_);
    placed->set_metrics(metrics_);
    if (absl::Status submitted = cluster_.Submit(placed); !submitted.ok()) {
      if (metrics_ != nullptr) metrics_->RecordRejected(submitted);
      for (const auto& earlier : requests) earlier->Cancel();
      return submitted;
    }
    requests.push_back(std::move(placed));
  }
  // Each ends with one final event: the embedding, or the error that ended it (a lost
  // replica, a model runner without hidden states).
  std::vector<std::vector<float>> embeddings;
  for (const auto& placed : requests) {
    std::optional<engine::OutputEvent> event;
    while (!event.has_value() || !event->final()) {
      std::optional<engine::OutputEvent> next = placed->outputs().Pop(absl::InfiniteDuration());
      if (next.has_value()) event = std::move(next);
    }
    if (event->finish_reason != loom::v1::FINISH_REASON_STOP || event->embedding.empty()) {
      for (const auto& other : requests) other->Cancel();
      return absl::UnavailableError(
          absl::StrFormat("the embedding could not be computed: %s", event->error_message));
    }
    embeddings.push_back(std::move(event->embedding));
  }
  return embeddings;
}

absl::Status PoolingService::CheckModel(const std::string& model) const {
  if (model_.Matches(model)) return absl::OkStatus();
  return absl::NotFoundError(
      absl::StrFormat("the model '%s' does not exist; this server serves '%s'", model, model_.id));
}

void PoolingService::Embeddings(const httplib::Request& request, httplib::Response& response) {
  absl::StatusOr<EmbeddingsRequest> parsed =
      ParseEmbeddingsRequest(request.body, config_.hidden_size);
  if (!parsed.ok()) return OpenAiService::WriteError(parsed.status(), response);
  if (absl::Status model = CheckModel(parsed->model); !model.ok()) {
    return OpenAiService::WriteError(model, response);
  }
  int64_t prompt_tokens = 0;
  absl::StatusOr<std::vector<std::vector<float>>> embeddings = Embed(parsed->inputs, prompt_tokens);
  if (!embeddings.ok()) return OpenAiService::WriteError(embeddings.status(), response);
  response.set_content(
      EmbeddingsResponseJson(*embeddings, parsed->base64, model_.id, prompt_tokens),
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

void PoolingService::Score(const httplib::Request& request, httplib::Response& response) {
  absl::StatusOr<ScoreRequest> parsed = ParseScoreRequest(request.body);
  if (!parsed.ok()) return OpenAiService::WriteError(parsed.status(), response);
  if (absl::Status model = CheckModel(parsed->model); !model.ok()) {
    return OpenAiService::WriteError(model, response);
  }
  int64_t prompt_tokens = 0;
  absl::StatusOr<std::vector<std::vector<float>>> embeddings =
      Embed(TextPrompts(parsed->texts), prompt_tokens);
  if (!embeddings.ok()) return OpenAiService::WriteError(embeddings.status(), response);
  std::vector<double> scores;
  for (const auto& [a, b] : parsed->pairs)
    scores.push_back(Cosine((*embeddings)[a], (*embeddings)[b]));
  response.set_content(
      ScoreResponseJson(absl::StrFormat("score-%016x", RandomId()),
                        absl::ToUnixSeconds(absl::Now()), model_.id, scores, prompt_tokens),
      "application/json");
}

void PoolingService::Rerank(const httplib::Request& request, httplib::Response& response) {
  absl::StatusOr<RerankRequest> parsed = ParseRerankRequest(request.body);
  if (!parsed.ok()) return OpenAiService::WriteError(parsed.status(), response);
  if (absl::Status model = CheckModel(parsed->model); !model.ok()) {
    return OpenAiService::WriteError(model, response);
  }
  std::vector<std::string> texts = {parsed->query};
  texts.insert(texts.end(), parsed->documents.begin(), parsed->documents.end());
  int64_t prompt_tokens = 0;
  absl::StatusOr<std::vector<std::vector<float>>> embeddings =
      Embed(TextPrompts(texts), prompt_tokens);
  if (!embeddings.ok()) return OpenAiService::WriteError(embeddings.status(), response);
  std::vector<double> scores;
  for (size_t d = 1; d < embeddings->size(); ++d) {
    scores.push_back(Cosine((*embeddings)[0], (*embeddings)[d]));
  }
  response.set_content(RerankResponseJson(absl::StrFormat("rerank-%016x", RandomId()), model_.id,
                                          *parsed, scores, prompt_tokens),
                       "application/json");
}

}  // namespace loom::api
