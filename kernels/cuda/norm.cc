#include "kernels/cuda/norm.h"

#include <cmath>

#include "absl/strings/str_format.h"

namespace loom::kernels::cuda {

absl::Status CheckRmsNormParams(const RmsNormParams& p) {
  if (p.num_tokens < 0 || p.hidden < 1 || p.hidden > 65536) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "RmsNorm: num_tokens %d must be >= 0 and hidden %d in [1, 65536]", p.num_tokens, p.hidden));
  }
  if (!std::isfinite(p.eps) || p.eps < 0.0f) {
    return absl::InvalidArgumentError(
        absl::StrFormat("RmsNorm: eps %g must be finite and >= 0", p.eps));
  }
  if (p.num_tokens > 0 && (p.x == nullptr || p.weight == nullptr || p.out == nullptr)) {
    return absl::InvalidArgumentError("RmsNorm: null x, weight or out");
  }
  if (p.out_low != nullptr && p.low_dtype != DataType::kF16 && p.low_dtype != DataType::kBF16) {
    return absl::InvalidArgumentError(
        absl::StrFormat("RmsNorm: low_dtype %s must be F16 or BF16", DataTypeName(p.low_dtype)));
  }
  return absl::OkStatus();
}

#if !LOOM_HAVE_CUDA
absl::Status LaunchRmsNorm(const RmsNormParams& params, cudaStream_t) {
  if (absl::Status status = CheckRmsNormParams(params); !status.ok()) return status;
  return absl::FailedPreconditionError("RmsNorm: Loom was built without CUDA");
}
#endif

}  // namespace loom::kernels::cuda
