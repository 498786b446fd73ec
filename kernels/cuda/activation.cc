#include "kernels/cuda/activation.h"

#include <cmath>

#include "absl/strings/str_format.h"

namespace loom::kernels::cuda {

absl::Status CheckSiluMulParams(const SiluMulParams& p) {
  if (p.num_tokens < 0 || p.ffn < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "SiluMul: num_tokens %d must be >= 0 and ffn %d >= 1", p.num_tokens, p.ffn));
  }
  if (p.num_tokens > 0 && (p.gate_up == nullptr || p.out == nullptr)) {
    return absl::InvalidArgumentError("SiluMul: null gate_up or out");
  }
  if (p.out_low != nullptr && p.low_dtype != DataType::kF16 && p.low_dtype != DataType::kBF16) {
    return absl::InvalidArgumentError(
        absl::StrFormat("SiluMul: low_dtype %s must be F16 or BF16", DataTypeName(p.low_dtype)));
  }
  return absl::OkStatus();
}

absl::Status CheckSoftCapParams(const SoftCapParams& p) {
  if (p.num_elements < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("SoftCap: num_elements %d must be >= 0", p.num_elements));
  }
  if (!std::isfinite(p.cap) || p.cap <= 0.0f) {
    return absl::InvalidArgumentError(
        absl::StrFormat("SoftCap: cap %g must be finite and > 0", p.cap));
  }
  if (p.num_elements > 0 && p.x == nullptr) return absl::InvalidArgumentError("SoftCap: null x");
  return absl::OkStatus();
}

absl::Status CheckScaleParams(const ScaleParams& p) {
  if (p.num_elements < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("Scale: num_elements %d must be >= 0", p.num_elements));
  }
  if (!std::isfinite(p.factor)) {
    return absl::InvalidArgumentError(absl::StrFormat("Scale: factor %g must be finite", p.factor));
  }
  if (p.num_elements > 0 && p.x == nullptr) return absl::InvalidArgumentError("Scale: null x");
  return absl::OkStatus();
}

#if !LOOM_HAVE_CUDA
absl::Status LaunchSiluMul(const SiluMulParams& params, cudaStream_t) {
  if (absl::Status status = CheckSiluMulParams(params); !status.ok()) return status;
  return absl::FailedPreconditionError("SiluMul: Loom was built without CUDA");
}

absl::Status LaunchSoftCap(const SoftCapParams& params, cudaStream_t) {
  if (absl::Status status = CheckSoftCapParams(params); !status.ok()) return status;
  return absl::FailedPreconditionError("SoftCap: Loom was built without CUDA");
}

absl::Status LaunchScale(const ScaleParams& params, cudaStream_t) {
  if (absl::Status status = CheckScaleParams(params); !status.ok()) return status;
  return absl::FailedPreconditionError("Scale: Loom was built without CUDA");
}
#endif

}  // namespace loom::kernels::cuda
