#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/forward_pass.h"
#include "worker/step_backend.h"

namespace loom::worker {

/// The real backend: a ForwardPass (the CPU CpuForwardPass or the CUDA forward pass), then each
/// sampled row's logits through its sequence's SequenceSampler (or, where the forward
/// pass samples on its device and no row has drafts or wants top-n logprobs, one
/// StepAndSample call that returns only token ids); a draft model's sampled
/// proposals are verified by rejection sampling (kernels::cpu::SpeculativeVerify) with
/// uniforms from SequenceSampler::PositionUniform. Not thread-safe.
class ModelStepBackend : public StepBackend {
 public:
  /// `name` is what the worker registers as its backend ("cpu").
  ModelStepBackend(std::unique_ptr<ForwardPass> forward_pass, std::string_view name = "cpu");

  std::string_view name() const override { return name_; }
  const common::ModelConfig& config() const override { return forward_pass_->config(); }
  int64_t num_kv_blocks() const override { return forward_pass_->num_kv_blocks(); }
  int64_t block_size() const override { return forward_pass_->block_size(); }
  ForwardPassStats forward_pass_stats() const override { return forward_pass_->stats(); }
  const model::KvCache* kv_pool() const override { return forward_pass_->kv_pool(); }
  // A pipeline stage before the last samples nothing: it has no samplers.
  bool uses_samplers() const override { return forward_pass_->returns_logits(); }
  bool samples() const override { return forward_pass_->returns_logits(); }
  bool SetHalfLayerObserver(std::function<void()> observer) override {
    return forward_pass_->SetHalfLayerObserver(std::move(observer));
  }
  void SkipStep(uint64_t step_id, const absl::Status& why) override {
    forward_pass_->SkipStep(step_id, why);
  }

  /// Forward pass and sampling; every row must carry a sampler, and draft_probs, where
  /// given, one row of the vocabulary per draft.
  absl::Status Run(const StepBatch& batch, absl::Span<const SampleRow> rows,
                   std::vector<SampledToken>& tokens, std::vector<int32_t>& num_emitted,
                   BackendTimings& timings) override;
  /// Run, plus the log-probability of each scored row's target from the host logits
  /// (scoring steps never sample on the device).
  absl::Status RunAndScore(const StepBatch& batch, absl::Span<const SampleRow> rows,
                           const ScoreRequest& score, std::vector<SampledToken>& tokens,
                           std::vector<int32_t>& num_emitted, PromptScores& scores,
                           BackendTimings& timings) override;

  ForwardPass& forward_pass() const { return *forward_pass_; }

 private:
  // Samples `row` on the host from `logits` (its drafts + 1 rows of the vocabulary), the
  // row's first sample row being batch.sample_rows[sample_row]: appends the emitted tokens
  // (recorded in the sampler) and returns their count.
  absl::StatusOr<int32_t> SampleOnHost(const StepBatch& batch, const SampleRow& row,
                                       const float* logits, size_t sample_row,
                                       std::vector<SampledToken>& tokens);
  // Rejection sampling of `row`'s drafts against its target rows `logits`: as SampleOnHost.
  absl::StatusOr<int32_t> VerifyDraftDistributions(const StepBatch& batch, const SampleRow& row,
                                                   const float* logits, size_t sample_row,
                                                   std::vector<SampledToken>& tokens);

  // InvalidArgument unless `rows` and `score` cover the batch's sample rows, each row
  // with a sampler and its drafts' distributions.
  absl::Status CheckRows(const StepBatch& batch, absl::Span<const SampleRow> rows,
                         const ScoreRequest& score) const;
  // Whether `row` can be sampled on the device (one token a position, no top-n logprobs,
  // no grammar or logit adjustments, no draft distributions with a non-greedy sampler).
  static bool SamplesOnDevice(const SampleRow& row);
  // Whether the device verifies `row`'s drafts: a draft model's distributions under a sampler
  // that samples, wanting no logprobs (DeviceSampleRows::verifies).
  static bool VerifiesOnDevice(const SampleRow& row);
  static bool OnDevice(const SampleRow& row) {
    return SamplesOnDevice(row) || VerifiesOnDevice(row);
  }
  // Run for a forward pass that samples on its device: only token ids come back, and the
  // logits of the rows the host samples. Each row is sampled where it would be alone, so
  // a seeded request's tokens never depend on what else its step carries.
  absl::Status RunOnDevice(const StepBatch& batch, absl::Span<const SampleRow> rows,
                           std::vector<SampledToken>& tokens, std::vector<int32_t>& num_emitted,
                           BackendTimings& timings);

  std::unique_ptr<ForwardPass> forward_pass_;
  std::string name_;
  std::vector<float> logits_;  // [sample_rows, vocab], reused across steps
  std::vector<float> hidden_;  // [sample_rows, hidden]: steps with embedding rows
  std::vector<int32_t> top_ids_;  // ScoreRow's scratch
  // One scored row's answer appended to `scores` (RunAndScore).
  void ScoreRow(const float* row, int64_t vocab, int32_t target, int32_t top,
                PromptScores& scores);
  DeviceSampleRows device_rows_;         // RunOnDevice's inputs, reused
  std::vector<int32_t> device_tokens_;   // RunOnDevice's outputs
  std::vector<float> device_logprobs_;
  std::vector<float> host_logits_;  // RunOnDevice: the host-sampled rows' logits
  // Scratch of VerifyDraftDistributions, for one row of k drafts:
  std::vector<float> target_probs_;     // [k + 1, vocab]
  std::vector<float> accept_uniforms_;  // [k + 1]
  std::vector<float> sample_uniforms_;  // [k + 1]
};

}  // namespace loom::worker
