#include "worker/noop_backend.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace loom::worker {

NoopBackend::NoopBackend(common::ModelConfig config, int64_t num_kv_blocks, int64_t block_size,
                         std::vector<int32_t> excluded_ids)
    : config_(std::move(config)),
      num_kv_blocks_(num_kv_blocks),
      block_size_(block_size),
      excluded_ids_(excluded_ids.begin(), excluded_ids.end()) {}

int32_t NoopBackend::TokenFor(uint64_t seq_id, int64_t position) const {
  const uint64_t vocab = static_cast<uint64_t>(config_.vocab_size);
  uint64_t token = (seq_id * 31 + static_cast<uint64_t>(position)) % vocab;
  // Bounded: at most one full turn around the vocabulary.
  for (uint64_t tries = 0; tries < vocab && excluded_ids_.contains(static_cast<int32_t>(token));
       ++tries) {
    token = (token + 1) % vocab;
  }
  return static_cast<int32_t>(token);
}

absl::Status NoopBackend::Run(const StepBatch& batch, absl::Span<const SampleRow> rows,
                              std::vector<SampledToken>& tokens,
                              std::vector<int32_t>& num_emitted, BackendTimings& timings) {
  LOOM_RETURN_IF_ERROR(ValidateStepBatch(batch, config_.vocab_size, config_.context_length,
                                         num_kv_blocks_, block_size_));
  if (NumSampleRows(rows) != batch.sample_rows.size()) {
    return absl::InvalidArgumentError(absl::StrFormat("%d sample rows but the rows cover %d",
                                                      batch.sample_rows.size(), NumSampleRows(rows)));
  }
  // One token per row: the noop backend accepts no drafts.
  tokens.resize(rows.size());
  num_emitted.assign(rows.size(), 1);
  size_t sample_row = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const int64_t position = int64_t{batch.positions[batch.sample_rows[sample_row]]} + 1;
    tokens[i].token_id = TokenFor(rows[i].seq_id, position);
    tokens[i].logprob = 0.0f;
    tokens[i].top_logprobs.clear();
    // An embedding row: a unit vector that still tells sequences apart (no math).
    tokens[i].embedding.clear();
    if (rows[i].embed) {
      tokens[i].embedding.assign(static_cast<size_t>(std::max<int64_t>(config_.hidden_size, 1)),
                                 0.0f);
      tokens[i].embedding[rows[i].seq_id % tokens[i].embedding.size()] = 1.0f;
    }
    sample_row += 1 + rows[i].draft_tokens.size();
  }
  timings.execute_seconds = 0;
  timings.sample_seconds = 0;
  return absl::OkStatus();
}

}  // namespace loom::worker
