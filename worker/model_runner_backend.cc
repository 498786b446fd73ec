#include "worker/model_runner_backend.h"

#include <chrono>
#include <string>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace loom::worker {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

ModelRunnerBackend::ModelRunnerBackend(std::unique_ptr<ForwardPass> runner, std::string_view name)
    : runner_(std::move(runner)), name_(name) {}

absl::Status ModelRunnerBackend::Run(const StepBatch& batch, absl::Span<const SampleRow> rows,
                                     std::vector<SampledToken>& tokens, BackendTimings& timings) {
  if (rows.size() != batch.sample_rows.size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%d sample rows but %d samplers", batch.sample_rows.size(), rows.size()));
  }
  for (const SampleRow& row : rows) {
    if (row.sampler == nullptr) {
      return absl::InvalidArgumentError(absl::StrFormat("sequence %d has no sampler", row.seq_id));
    }
  }
  const auto start = std::chrono::steady_clock::now();
  LOOM_RETURN_IF_ERROR(runner_->Step(batch, logits_));
  timings.execute_seconds = SecondsSince(start);

  const auto sample_start = std::chrono::steady_clock::now();
  const int64_t vocab = runner_->config().vocab_size;
  tokens.clear();
  tokens.reserve(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    tokens.push_back(rows[i].sampler->Sample(logits_.data() + i * vocab));
  }
  timings.sample_seconds = SecondsSince(sample_start);
  return absl::OkStatus();
}

}  // namespace loom::worker
