#include "kernels/cuda/rope_write_kv.h"

#include <cmath>

#include "absl/strings/str_format.h"

namespace loom::kernels::cuda {

absl::Status CheckRopeWriteKvParams(const RopeWriteKvParams& p) {
  if (absl::Status status = CheckKvCacheView(p.cache); !status.ok()) return status;
  if (p.cache.quant != KvQuant::kNone) {
    return absl::InvalidArgumentError(
        "RopeWriteKv: an 8-bit cache (LaunchRope and LaunchWriteKv write those)");
  }
  if (p.num_tokens < 0 || p.num_tokens > 0x7fffffff) {
    return absl::InvalidArgumentError(
        absl::StrFormat("RopeWriteKv: num_tokens %d out of range", p.num_tokens));
  }
  const int64_t row = (p.num_heads + 2 * p.cache.num_kv_heads) * p.cache.head_dim;
  if (p.num_heads < 1 || p.num_heads > 0x7fffffff || row > 0x7fffffff) {
    return absl::InvalidArgumentError(
        absl::StrFormat("RopeWriteKv: num_heads %d out of range", p.num_heads));
  }
  if (p.qkv_stride != 0 && p.qkv_stride < row) {
    return absl::InvalidArgumentError(
        absl::StrFormat("RopeWriteKv: qkv_stride %d shorter than a row of %d", p.qkv_stride, row));
  }
  if (p.inv_freq != nullptr) {
    if (p.rope_dim < 2 || p.rope_dim > p.cache.head_dim || p.rope_dim > 1024 ||
        p.rope_dim % 2 != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "RopeWriteKv: rope_dim %d must be even and in [2, min(head_dim %d, 1024)]", p.rope_dim,
          p.cache.head_dim));
    }
    if (!(p.attention_factor > 0.0f) || !std::isfinite(p.attention_factor)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "RopeWriteKv: attention_factor %g must be positive and finite", p.attention_factor));
    }
    if (p.num_tokens > 0 && p.positions == nullptr) {
      return absl::InvalidArgumentError("RopeWriteKv: null positions");
    }
  }
  if ((p.q_norm == nullptr) != (p.k_norm == nullptr)) {
    return absl::InvalidArgumentError("RopeWriteKv: q_norm and k_norm go together");
  }
  if (p.q_norm != nullptr && (!std::isfinite(p.norm_eps) || p.norm_eps < 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("RopeWriteKv: norm_eps %g must be finite and >= 0", p.norm_eps));
  }
  if (p.num_tokens > 0 && (p.qkv == nullptr || p.q_out == nullptr || p.slots == nullptr)) {
    return absl::InvalidArgumentError("RopeWriteKv: null qkv, q_out or slots");
  }
  return absl::OkStatus();
}

#if !LOOM_HAVE_CUDA
absl::Status LaunchRopeWriteKv(const RopeWriteKvParams& params, cudaStream_t) {
  if (absl::Status status = CheckRopeWriteKvParams(params); !status.ok()) return status;
  return absl::FailedPreconditionError("RopeWriteKv: Loom was built without CUDA");
}
#endif

}  // namespace loom::kernels::cuda
