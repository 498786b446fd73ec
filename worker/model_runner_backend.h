#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "worker/forward_pass.h"
#include "worker/step_backend.h"

namespace loom::worker {

/// The real backend: a ForwardPass (the CPU ModelRunner or the CUDA runner), then each
/// sampled row's logits through its sequence's SequenceSampler. Not thread-safe.
class ModelRunnerBackend : public StepBackend {
 public:
  /// `name` is what the worker registers as its backend ("cpu").
  ModelRunnerBackend(std::unique_ptr<ForwardPass> runner, std::string_view name = "cpu");

  std::string_view name() const override { return name_; }
  const common::ModelConfig& config() const override { return runner_->config(); }
  int64_t num_kv_blocks() const override { return runner_->num_kv_blocks(); }
  int64_t block_size() const override { return runner_->block_size(); }
  bool uses_samplers() const override { return true; }

  /// Forward pass and sampling; every row must carry a sampler.
  absl::Status Run(const StepBatch& batch, absl::Span<const SampleRow> rows,
                   std::vector<SampledToken>& tokens, std::vector<int32_t>& num_emitted,
                   BackendTimings& timings) override;

  ForwardPass& runner() const { return *runner_; }

 private:
  std::unique_ptr<ForwardPass> runner_;
  std::string name_;
  std::vector<float> logits_;  // [sample_rows, vocab], reused across steps
};

}  // namespace loom::worker
