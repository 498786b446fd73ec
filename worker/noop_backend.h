#pragma once

#include <string_view>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "worker/step_backend.h"

namespace loom::worker {

/// A backend that does no math, for measuring the coordinator's overhead: it validates
/// the batch like the real one, then answers each sampled row at once with
/// (seq_id * 31 + position) % vocab (position: where the new token goes), stepping past
/// `excluded_ids` (the model's end-of-generation ids, so sequences run to their
/// length limit). Logprobs are 0 with no alternatives. Needs the model's config only,
/// not its weights. Not thread-safe.
class NoopBackend : public StepBackend {
 public:
  NoopBackend(common::ModelConfig config, int64_t num_kv_blocks, int64_t block_size,
              std::vector<int32_t> excluded_ids);

  std::string_view name() const override { return "noop"; }
  const common::ModelConfig& config() const override { return config_; }
  int64_t num_kv_blocks() const override { return num_kv_blocks_; }
  int64_t block_size() const override { return block_size_; }
  bool uses_samplers() const override { return false; }

  /// Validates the batch and picks the deterministic tokens; ignores the samplers.
  absl::Status Run(const StepBatch& batch, absl::Span<const SampleRow> rows,
                   std::vector<SampledToken>& tokens, std::vector<int32_t>& num_emitted,
                   BackendTimings& timings) override;

  /// The token NoopBackend picks for `seq_id` at `position`.
  int32_t TokenFor(uint64_t seq_id, int64_t position) const;

 private:
  common::ModelConfig config_;
  int64_t num_kv_blocks_;
  int64_t block_size_;
  absl::flat_hash_set<int32_t> excluded_ids_;
};

}  // namespace loom::worker
