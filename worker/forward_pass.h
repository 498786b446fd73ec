#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "common/model_config.h"
#include "worker/step_batch.h"

namespace loom::worker {

/// A model's forward pass on one backend (the CPU ModelRunner, the CUDA runner): owns the
/// weights and the paged KV pool, runs one flattened step and returns the logits of the
/// step's sample rows on the host. ModelRunnerBackend samples from them. Not thread-safe:
/// one step at a time.
class ForwardPass {
 public:
  virtual ~ForwardPass() = default;

  /// The model's hyper-parameters.
  virtual const common::ModelConfig& config() const = 0;
  /// KV pool size in blocks.
  virtual int64_t num_kv_blocks() const = 0;
  /// Tokens per KV block.
  virtual int64_t block_size() const = 0;

  /// Runs one step: writes the batch's K/V into its slots and returns the logits of
  /// `batch.sample_rows`, [sample_rows.size(), vocab] into `logits`. InvalidArgument
  /// (nothing computed, nothing written) for a batch ValidateStepBatch rejects.
  virtual absl::Status Step(const StepBatch& batch, std::vector<float>& logits) = 0;
};

}  // namespace loom::worker
