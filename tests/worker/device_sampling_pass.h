#pragma once

// A forward pass that "samples on its device" the way the CUDA forward pass is asked to, for
// the tests of its callers (ModelStepBackend, DraftProposer) on a machine without a GPU.

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "common/status_macros.h"
#include "kernels/cpu/speculative_verify.h"
#include "worker/cpu_forward_pass.h"
#include "worker/forward_pass.h"
#include "worker/sampler.h"

namespace loom::worker::test_util {

/// Runs the real CPU forward pass and picks each row's greedy token itself, after the
/// row's penalty entries as the device sampler applies them (the repetition penalty, then
/// presence + frequency x count), lowest id on ties; the logprob is a fixed -0.5. Verifies
/// rows.verifies as the device does: each row's distribution (SequenceSampler::Distribution
/// of the penalized row under the row's filters), then kernels::cpu::SpeculativeVerify with
/// the given uniforms, the emitted tokens written over the sequence's rows. Records what its
/// caller handed it. Stands in for the GPU, which this machine lacks (the CUDA forward pass's
/// own StepAndSample is tested against the CPU in cuda_forward_pass_test).
class DeviceSamplingPass : public ForwardPass {
 public:
  explicit DeviceSamplingPass(std::unique_ptr<CpuForwardPass> forward_pass)
      : forward_pass_(std::move(forward_pass)) {}
  const common::ModelConfig& config() const override { return forward_pass_->config(); }
  int64_t num_kv_blocks() const override { return forward_pass_->num_kv_blocks(); }
  int64_t block_size() const override { return forward_pass_->block_size(); }
  absl::Status Step(const StepBatch& batch, std::vector<float>& logits) override {
    ++host_steps;
    return forward_pass_->Step(batch, logits);
  }
  bool samples_on_device() const override { return true; }
  absl::Status StepAndSample(const StepBatch& batch, const DeviceSampleRows& rows,
                             std::vector<int32_t>& tokens, std::vector<float>& logprobs,
                             std::vector<float>& host_logits) override {
    ++device_steps;
    last_rows = rows;
    LOOM_RETURN_IF_ERROR(ValidateDeviceSampleRows(batch, rows));
    std::vector<float> logits;
    LOOM_RETURN_IF_ERROR(forward_pass_->Step(batch, logits));
    const int64_t vocab = config().vocab_size;
    tokens.clear();
    logprobs.clear();
    std::vector<float> penalized;  // [rows, vocab]
    for (size_t i = 0; i < rows.params.size(); ++i) {
      std::vector<float> row(logits.begin() + i * vocab, logits.begin() + (i + 1) * vocab);
      const SamplingParams& params = rows.params[i];
      for (int32_t e = rows.penalty_indptr[i]; e < rows.penalty_indptr[i + 1]; ++e) {
        float& x = row[rows.penalty_tokens[e]];
        if (params.repetition_penalty != 1.0f) {
          x = x > 0.0f ? x / params.repetition_penalty : x * params.repetition_penalty;
        }
        if (rows.penalty_counts[e] > 0) {
          x -= params.presence_penalty +
               params.frequency_penalty * static_cast<float>(rows.penalty_counts[e]);
        }
      }
      tokens.push_back(
          static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin()));
      logprobs.push_back(-0.5f);
      penalized.insert(penalized.end(), row.begin(), row.end());
    }
    for (const DeviceSampleRows::DraftVerify& v : rows.verifies) {
      LOOM_RETURN_IF_ERROR(Verify(v, rows.params[v.first_row], penalized, tokens));
    }
    host_logits.clear();
    for (int32_t row : rows.logits_rows) {
      host_logits.insert(host_logits.end(), logits.begin() + row * vocab,
                         logits.begin() + (row + 1) * vocab);
    }
    return absl::OkStatus();
  }

  int host_steps = 0;
  int device_steps = 0;
  DeviceSampleRows last_rows;

 private:
  // One sequence's rejection sampling over its rows of `penalized`, into `tokens`.
  absl::Status Verify(const DeviceSampleRows::DraftVerify& v, SamplingParams params,
                      const std::vector<float>& penalized, std::vector<int32_t>& tokens) {
    const int64_t vocab = config().vocab_size;
    const int32_t k = static_cast<int32_t>(v.drafts.size());
    // The rows are penalized already: the filters alone give each row's distribution.
    params.repetition_penalty = 1.0f;
    params.presence_penalty = params.frequency_penalty = 0.0f;
    SequenceSampler sampler(params, {}, vocab);
    std::vector<float> target(static_cast<size_t>((k + 1) * vocab));
    for (int32_t i = 0; i <= k; ++i) {
      sampler.Distribution(penalized.data() + (v.first_row + i) * vocab, {},
                           target.data() + i * vocab);
    }
    LOOM_ASSIGN_OR_RETURN(const kernels::cpu::VerifiedDrafts verified,
                          kernels::cpu::VerifySampledDrafts(target.data(), v.draft_probs.data(),
                                                            v.drafts, v.accept_uniforms.data(),
                                                            v.sample_uniforms.data(), vocab));
    for (int32_t i = 0; i <= k; ++i) {
      tokens[v.first_row + i] = i < verified.accepted    ? v.drafts[i]
                                : i == verified.accepted ? verified.next
                                                         : -1;
    }
    return absl::OkStatus();
  }

  std::unique_ptr<CpuForwardPass> forward_pass_;
};

}  // namespace loom::worker::test_util
