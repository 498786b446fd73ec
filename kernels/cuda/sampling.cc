#include "kernels/cuda/sampling.h"

#include <cstdint>

#include "absl/strings/str_format.h"
#include "kernels/cuda/sampling_internal.h"

namespace loom::kernels::cuda {
namespace {

bool HasPenalties(const SampleTokensParams& p) {
  return p.penalty_indptr != nullptr || p.penalty_tokens != nullptr || p.penalty_counts != nullptr;
}

}  // namespace

size_t SampleTokensWorkspaceBytes(const SampleTokensParams& p) {
  if (!HasPenalties(p) || p.num_rows <= 0 || p.vocab_size <= 0) return 0;
  return static_cast<size_t>(p.num_rows) * static_cast<size_t>(p.vocab_size) * sizeof(float);
}

absl::Status CheckSampleTokensParams(const SampleTokensParams& p) {
  if (p.num_rows < 0 || p.num_rows > 0x7fffffff) {
    return absl::InvalidArgumentError(
        absl::StrFormat("SampleTokens: num_rows %d must be in [0, 2^31)", p.num_rows));
  }
  if (p.vocab_size < 1 || p.vocab_size > kSamplingMaxVocab) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "SampleTokens: vocab_size %d must be in [1, %d]", p.vocab_size, kSamplingMaxVocab));
  }
  if (p.logits_stride != 0 && p.logits_stride < p.vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrFormat("SampleTokens: logits_stride %d shorter than vocab_size %d",
                        p.logits_stride, p.vocab_size));
  }
  if (p.num_rows == 0) return absl::OkStatus();
  if (p.logits == nullptr || p.rows == nullptr || p.tokens == nullptr) {
    return absl::InvalidArgumentError("SampleTokens: null logits, rows or tokens");
  }
  if (HasPenalties(p)) {
    if (p.penalty_indptr == nullptr || p.penalty_tokens == nullptr || p.penalty_counts == nullptr) {
      return absl::InvalidArgumentError(
          "SampleTokens: penalty_indptr, penalty_tokens and penalty_counts go together");
    }
    const size_t needed = SampleTokensWorkspaceBytes(p);
    if (p.workspace == nullptr || p.workspace_bytes < needed) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "SampleTokens: workspace of %d bytes, %d needed", p.workspace_bytes, needed));
    }
  }
  return absl::OkStatus();
}

uint64_t SamplingRandomBits(uint64_t seed, uint64_t step) {
  return internal::SamplingBits(seed, step);
}

#if !LOOM_HAVE_CUDA
absl::Status LaunchSampleTokens(const SampleTokensParams& params, cudaStream_t) {
  if (absl::Status status = CheckSampleTokensParams(params); !status.ok()) return status;
  return absl::FailedPreconditionError("SampleTokens: Loom was built without CUDA");
}
#endif

}  // namespace loom::kernels::cuda
