#include "kernels/cuda/rope.h"

#include <cmath>

#include "absl/strings/str_format.h"

namespace loom::kernels::cuda {

absl::Status CheckRopeParams(const RopeParams& p) {
  if (p.num_tokens < 0 || p.num_tokens > 0x7fffffff) {
    return absl::InvalidArgumentError(
        absl::StrFormat("Rope: num_tokens %d out of range", p.num_tokens));
  }
  if (p.head_dim < 2 || p.head_dim > 1024 || p.head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("Rope: head_dim %d must be even and in [2, 1024]", p.head_dim));
  }
  if (p.rope_dim < 2 || p.rope_dim > p.head_dim || p.rope_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "Rope: rope_dim %d must be even and in [2, head_dim %d]", p.rope_dim, p.head_dim));
  }
  if (p.num_heads < 1 || (p.k != nullptr && p.num_kv_heads < 1)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "Rope: num_heads %d and num_kv_heads %d must be positive", p.num_heads, p.num_kv_heads));
  }
  if ((p.q_stride != 0 && p.q_stride < p.num_heads * p.head_dim) ||
      (p.k != nullptr && p.k_stride != 0 && p.k_stride < p.num_kv_heads * p.head_dim)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "Rope: q_stride %d / k_stride %d shorter than a row", p.q_stride, p.k_stride));
  }
  if (!(p.attention_factor > 0.0f) || !std::isfinite(p.attention_factor)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "Rope: attention_factor %g must be positive and finite", p.attention_factor));
  }
  if (p.num_tokens > 0 && (p.q == nullptr || p.positions == nullptr || p.inv_freq == nullptr)) {
    return absl::InvalidArgumentError("Rope: null q, positions or inv_freq");
  }
  return absl::OkStatus();
}

#if !LOOM_HAVE_CUDA
absl::Status LaunchRope(const RopeParams& params, cudaStream_t) {
  if (absl::Status status = CheckRopeParams(params); !status.ok()) return status;
  return absl::FailedPreconditionError("Rope: Loom was built without CUDA");
}
#endif

}  // namespace loom::kernels::cuda
