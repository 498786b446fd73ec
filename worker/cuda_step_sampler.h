#pragma once

// Built with CUDA only (LOOM_HAVE_CUDA): the device sampling of a CUDA forward pass's step.

#if LOOM_HAVE_CUDA
#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/sampling.h"
#include "worker/forward_pass.h"

namespace loom::worker {

/// CudaForwardPass::StepAndSample's sampling: the rows' parameters, penalty lists and draft
/// verifications go to the device, the sampler (kernels/cuda/sampling) and, for a draft
/// model's distributions under a sampling sampler, the rejection sampling
/// (kernels/cuda/speculative_verify) run on the step's stream over its logits, and only tokens
/// come back. Buffers grow as steps need and are kept; no graph reads them. Not thread-safe.
class CudaStepSampler {
 public:
  /// Enqueues the sampling of the first rows.params.size() rows of `logits` ([rows, vocab] F32
  /// on the device) on `stream`, and the copies of the picked tokens and their logprobs into
  /// `tokens` / `logprobs`. With rows.verifies, also every row's distribution and each
  /// sequence's verification. InvalidArgument for a verification whose draft probabilities are
  /// not [drafts, vocab].
  absl::Status Enqueue(const DeviceSampleRows& rows, const float* logits, int64_t vocab,
                       cudaStream_t stream, std::vector<int32_t>& tokens,
                       std::vector<float>& logprobs);
  /// Once the stream drained: each verified sequence's rows of `tokens` become what the
  /// verification emits (DeviceSampleRows::verifies). Internal where the kernel refused one (a
  /// draft token outside the vocabulary).
  absl::Status Finish(const DeviceSampleRows& rows, std::vector<int32_t>& tokens) const;

 private:
  // The verifications' uploads and launches, after the rows' sampling `sampled` (whose inputs
  // they reuse).
  absl::Status EnqueueVerifies(const DeviceSampleRows& rows,
                               const kernels::cuda::SampleTokensParams& sampled,
                               cudaStream_t stream);

  kernels::cuda::DeviceBuffer params_, penalty_indptr_, penalty_tokens_, penalty_counts_;
  kernels::cuda::DeviceBuffer workspace_, tokens_, logprobs_;
  // Draft verification: one sequence's rows' distributions (and their unused tokens) at a
  // time, the drafts, their distributions, the uniforms, per sequence {0, k + 1} and its
  // greedy flag, and (accepted, next) per sequence.
  kernels::cuda::DeviceBuffer probs_, verify_tokens_, drafts_, draft_probs_, uniforms_;
  kernels::cuda::DeviceBuffer sample_uniforms_;
  kernels::cuda::DeviceBuffer row_starts_, greedy_, verified_;
  std::vector<int32_t> row_starts_host_;
  std::vector<int32_t> verified_host_;
};

}  // namespace loom::worker
#endif  // LOOM_HAVE_CUDA
