#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/model_config.h"
#include "worker/sampler.h"
#include "worker/step_batch.h"

namespace loom::worker {

/// One row of a step whose next token is picked: which sequence it belongs to and that
/// sequence's sampler (nullptr when the backend does not use samplers).
struct SampleRow {
  uint64_t seq_id = 0;
  SequenceSampler* sampler = nullptr;
};

/// Where one step's time went, in seconds.
struct BackendTimings {
  double execute_seconds = 0;  // the forward pass
  double sample_seconds = 0;   // picking the tokens
};

/// What executes a step for the StepExecutor: runs the forward pass over a flattened
/// batch and picks one token per sampled row. "Run and sample" is one call so that a
/// backend that does no math (noop) never materializes logits. Implementations are not
/// thread-safe: the executor calls them one step at a time.
class StepBackend {
 public:
  virtual ~StepBackend() = default;

  /// The name the worker registers with: "cpu", "noop", ...
  virtual std::string_view name() const = 0;
  /// The model's hyper-parameters (vocab size and context length bound the plans).
  virtual const common::ModelConfig& config() const = 0;
  /// KV pool size in blocks; block ids of a step are in [0, num_kv_blocks()).
  virtual int64_t num_kv_blocks() const = 0;
  /// Tokens per KV block.
  virtual int64_t block_size() const = 0;
  /// False when Run ignores SampleRow::sampler: the executor then creates no samplers.
  virtual bool uses_samplers() const = 0;

  /// Runs `batch` and writes one token per entry of `batch.sample_rows` into `tokens`
  /// (`rows[i]` describes sample row i). InvalidArgument for a batch ValidateStepBatch
  /// rejects; on any error no sampler has been touched.
  virtual absl::Status Run(const StepBatch& batch, absl::Span<const SampleRow> rows,
                           std::vector<SampledToken>& tokens, BackendTimings& timings) = 0;
};

}  // namespace loom::worker
