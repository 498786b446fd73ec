#include "api/embedder.h"

#include <memory>
#include <optional>
#include <random>
#include <utility>

#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "engine/request_validation.h"

namespace loom::api {
namespace {

uint64_t RandomId() {
  thread_local std::mt19937_64 generator{std::random_device{}()};
  return generator();
}

// How often a wait looks at `cancelled`.
constexpr absl::Duration kCancelPoll = absl::Milliseconds(50);

}  // namespace

Embedder::Embedder(coordinator::Cluster& cluster, const common::ModelConfig& config,
                   const common::Tokenizer& tokenizer, coordinator::CoordinatorMetrics* metrics)
    : cluster_(cluster),
      config_(config),
      tokenizer_(tokenizer),
      eos_ids_(tokenizer.EndOfGenerationIds()),
      metrics_(metrics) {}

absl::StatusOr<EmbeddingBatch> Embedder::Embed(
    const std::vector<loom::v1::GenerateRequest>& inputs, const std::function<bool()>& cancelled,
    const std::function<std::string(size_t)>& input_name) {
  if (inputs.empty()) return absl::InvalidArgumentError("there must be at least one input");
  // A batch that can never fit the queues is a 400 before any input takes a slot.
  LOOM_RETURN_IF_ERROR(cluster_.CheckBatchFits(static_cast<int64_t>(inputs.size()), "inputs"));
  EmbeddingBatch result;
  std::vector<engine::RequestParams> params;
  for (size_t i = 0; i < inputs.size(); ++i) {
    loom::v1::GenerateRequest input;
    if (inputs[i].has_token_ids()) {
      *input.mutable_token_ids() = inputs[i].token_ids();
    } else {
      input.set_text(inputs[i].text());
    }
    absl::StatusOr<engine::RequestParams> one = engine::ValidateGenerateRequest(
        input, config_, tokenizer_, /*unset_temperature=*/0.0f, /*embed=*/true);
    if (!one.ok()) {
      if (inputs.size() == 1) return one.status();
      return absl::Status(
          one.status().code(),
          absl::StrFormat("%s: %s", input_name ? input_name(i) : absl::StrFormat("input %d", i),
                          one.status().message()));
    }
    result.input_tokens.push_back(static_cast<int64_t>(one->prompt_ids.size()));
    result.prompt_tokens += result.input_tokens.back();
    params.push_back(*std::move(one));
  }
  const uint64_t number = next_id_.fetch_add(1);
  std::vector<std::shared_ptr<engine::Request>> requests;
  const auto cancel_all = [&requests] {
    for (const auto& placed : requests) placed->Cancel();
  };
  for (size_t i = 0; i < params.size(); ++i) {
    auto placed = std::make_shared<engine::Request>(
        absl::StrFormat("embd-%016x%04x-%d", RandomId(), number & 0xffff, i), cluster_.NextSeqId(),
        std::move(params[i]), tokenizer_, eos_ids_);
    placed->set_metrics(metrics_);
    if (absl::Status submitted = cluster_.Submit(placed); !submitted.ok()) {
      if (metrics_ != nullptr) metrics_->RecordRejected(submitted);
      cancel_all();
      return submitted;
    }
    requests.push_back(std::move(placed));
  }
  // Each ends with one final event: the embedding, or the error that ended it.
  for (const auto& placed : requests) {
    std::optional<engine::OutputEvent> event;
    while (!event.has_value() || !event->final()) {
      if (cancelled != nullptr && cancelled()) {
        cancel_all();
        return absl::CancelledError("the embedding call was cancelled");
      }
      std::optional<engine::OutputEvent> next =
          placed->outputs().Pop(cancelled != nullptr ? kCancelPoll : absl::InfiniteDuration());
      if (next.has_value()) event = std::move(next);
    }
    if (event->finish_reason != loom::v1::FINISH_REASON_STOP || event->embedding.empty()) {
      cancel_all();
      return absl::UnavailableError(
          absl::StrFormat("the embedding could not be computed: %s", event->error_message));
    }
    result.vectors.push_back(std::move(event->embedding));
  }
  return result;
}

}  // namespace loom::api
