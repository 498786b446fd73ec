#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/types/span.h"
#include "common/formats/model_config.h"
#include "model/device.h"
#include "worker/sampler.h"
#include "worker/step_batch.h"

namespace loom::worker {

/// What a forward pass that samples on its device needs per sample row of a step (one
/// token each, no speculative drafts): the row's sampling parameters, the index of the
/// token it decides in its sequence (the device's random draw is keyed by (seed, that
/// position), so a sequence's draws do not depend on its batch and a resumed sequence
/// draws what it would have), and its penalty entries in CSR form.
struct DeviceSampleRows {
  std::vector<SamplingParams> params;   // [rows]
  std::vector<int64_t> positions;       // [rows]
  std::vector<int32_t> penalty_indptr;  // [rows + 1]
  std::vector<int32_t> penalty_tokens;  // every token a row's penalties touch
  std::vector<int32_t> penalty_counts;  // how often each was generated
  // Sample rows whose logits come back too, in this order: the rows the host samples (top-n
  // logprobs, a grammar, logit_bias, a draft model's distributions) in a step whose other
  // rows the device samples. Their device tokens are not used.
  std::vector<int32_t> logits_rows;
  // A draft model's drafts with their distributions, for a sampler that samples: verified on
  // the device by rejection sampling (kernels/cpu/speculative_verify.h's semantics, the target
  // p each row's distribution as the device sampler draws from it). The sequence's k drafts
  // take the k + 1 consecutive sample rows from first_row (rows like any other: parameters,
  // positions, penalties); StepAndSample answers for them the tokens the verification emits:
  // the accepted drafts, then the correction (or, all accepted, the bonus token), then -1.
  // The drafts and q are the caller's (SampleRow's), valid for the StepAndSample call.
  struct DraftVerify {
    int32_t first_row = 0;
    absl::Span<const int32_t> drafts;     // k >= 1
    absl::Span<const float> draft_probs;  // [k, vocab]: the draft model's q at each
    std::vector<float> accept_uniforms;   // [k + 1] in [0, 1)
    std::vector<float> sample_uniforms;   // [k + 1] in [0, 1)
  };
  std::vector<DraftVerify> verifies;

  /// No rows (penalty_indptr back to {0}), the lists' memory kept for the next step.
  void Clear() {
    params.clear();
    positions.clear();
    penalty_indptr.assign(1, 0);
    penalty_tokens.clear();
    penalty_counts.clear();
    logits_rows.clear();
    verifies.clear();
  }
};

/// OK when `rows` describe `batch`'s sample rows (one entry each, a CSR of penalty entries
/// whose last offset is its length, logits rows among the sample rows); InvalidArgument
/// otherwise. What StepAndSample checks before it runs anything.
inline absl::Status ValidateDeviceSampleRows(const StepBatch& batch, const DeviceSampleRows& rows) {
  const size_t n = batch.sample_rows.size();
  const bool csr = rows.penalty_indptr.size() == n + 1 &&
                   rows.penalty_tokens.size() == rows.penalty_counts.size() &&
                   rows.penalty_indptr.front() == 0 &&
                   static_cast<size_t>(rows.penalty_indptr.back()) == rows.penalty_tokens.size();
  const bool logits_rows =
      std::all_of(rows.logits_rows.begin(), rows.logits_rows.end(),
                  [&](int32_t row) { return row >= 0 && static_cast<size_t>(row) < n; });
  const bool verifies = std::all_of(
      rows.verifies.begin(), rows.verifies.end(), [&](const DeviceSampleRows::DraftVerify& v) {
        const size_t k = v.drafts.size();
        return k >= 1 && v.first_row >= 0 && v.first_row + k < n &&
               v.accept_uniforms.size() == k + 1 && v.sample_uniforms.size() == k + 1;
      });
  if (rows.params.size() != n || rows.positions.size() != n || !csr || !logits_rows || !verifies) {
    return absl::InvalidArgumentError(
        absl::StrFormat("device sampling rows do not match the step's %d sample rows", n));
  }
  return absl::OkStatus();
}

/// How a forward pass ran its steps so far (the CUDA forward pass's decode graphs; zeros for a
/// forward pass without graphs). The worker exports them as metrics (docs/metrics.md).
struct ForwardPassStats {
  int64_t eager_steps = 0;              // every step not replayed from a graph
  int64_t graph_captures = 0;           // graphs captured (a bucket's second decode step)
  int64_t graph_replays = 0;            // steps run by replaying a captured graph
  int64_t graph_capture_failures = 0;   // captures that failed; their steps ran eagerly
  // A pipeline stage's time waiting on its neighbours inside steps: for the previous
  // stage's activations, or for the next stage to take its own (PipelineLink).
  double pipeline_wait_seconds = 0;
};

/// A model's forward pass on one backend (the CPU CpuForwardPass, the CUDA forward pass): owns the
/// weights and the paged KV pool, runs one flattened step and returns the logits of the
/// step's sample rows on the host. ModelStepBackend samples from them. Not thread-safe:
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

  /// Step, and `hidden` [sample rows, hidden size] <- each sample row's final hidden state
  /// after the final norm (the LM head's input): what an embedding pools. Unimplemented
  /// where the forward pass cannot return them.
  virtual bool returns_hidden() const { return false; }
  virtual absl::Status StepWithHidden(const StepBatch& batch, std::vector<float>& logits,
                                      std::vector<float>& hidden) {
    (void)batch, (void)logits, (void)hidden;
    return absl::UnimplementedError("this model runner cannot return hidden states (embeddings)");
  }
  /// False on a pipeline stage before the last: Step computes the stage's layers, passes
  /// the residual stream on and returns no logits (an empty `logits`).
  virtual bool returns_logits() const { return true; }
  /// A step with work that will not Step here (its plan failed on this worker): a pipeline
  /// stage still takes its predecessor's message and passes the failure on, so the stages
  /// stay aligned (PipelineLink). Nothing to do without pipeline parallelism.
  virtual void SkipStep(uint64_t step_id, const absl::Status& why) { (void)step_id, (void)why; }
  /// StepBackend::SetHalfLayerObserver. False where not supported (CUDA: a graph cannot
  /// call back to the host between layers).
  virtual bool SetHalfLayerObserver(std::function<void()> observer) {
    (void)observer;
    return false;
  }

  /// Whether StepAndSample is available: the CUDA forward pass samples where the logits are,
  /// so only token ids cross to the host.
  virtual bool samples_on_device() const { return false; }
  /// Step, then one token per sample row picked on the device with the rows' parameters
  /// (kernels/cuda/sampling's semantics: the CPU sampler's filters, its own random
  /// stream): tokens[i] and the raw log-softmax of each in logprobs[i]; `logits` gets the
  /// rows.logits_rows' logits ([logits_rows, vocab]).
  virtual absl::Status StepAndSample(const StepBatch& batch, const DeviceSampleRows& rows,
                                     std::vector<int32_t>& tokens, std::vector<float>& logprobs,
                                     std::vector<float>& logits) {
    (void)batch, (void)rows, (void)tokens, (void)logprobs, (void)logits;
    return absl::UnimplementedError("this forward pass does not sample on its device");
  }

  /// Counts of how steps ran so far.
  virtual ForwardPassStats stats() const { return {}; }
  /// The paged KV pool Step runs on (the host tier copies blocks in and out of it);
  /// nullptr where there is none to copy.
  virtual const model::KvCache* kv_pool() const { return nullptr; }
};

}  // namespace loom::worker
