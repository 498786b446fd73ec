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
                                     std::vector<SampledToken>& tokens,
                                     std::vector<int32_t>& num_emitted, BackendTimings& timings) {
  if (NumSampleRows(rows) != batch.sample_rows.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d sample rows but the samplers cover %d", batch.sample_rows.size(), NumSampleRows(rows)));
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
  tokens.reserve(batch.sample_rows.size());
  num_emitted.clear();
  num_emitted.reserve(rows.size());
  size_t logits_row = 0;
  for (const SampleRow& row : rows) {
    // Speculative verification: sample every position as a plain decode would (same
    // sampler, same random draws, same penalties), accepting drafts while they equal the
    // sampled token. For one-hot proposals this is exactly rejection sampling
    // (accept x with probability p(x), else draw from p without x), and the output is
    // token for token what the sequence would produce without speculation.
    const size_t drafts = row.draft_tokens.size();
    int32_t emitted = 0;
    for (size_t i = 0; i <= drafts; ++i) {
      tokens.push_back(row.sampler->Sample(logits_.data() + (logits_row + i) * vocab));
      ++emitted;
      if (i < drafts && tokens.back().token_id != row.draft_tokens[i]) break;
    }
    num_emitted.push_back(emitted);
    logits_row += drafts + 1;
  }
  timings.sample_seconds = SecondsSince(sample_start);
  return absl::OkStatus();
}

}  // namespace loom::worker
