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
  if (p.activation == GateActivation::kSwigluOai && !(std::isfinite(p.limit) && p.limit > 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("SiluMul: SwiGLU-OAI limit %g must be finite and > 0", p.limit));
  }
  return absl::OkStatus();
}

absl::Status CheckInPlaceParams(const InPlaceParams& p) {
  const char* name = p.op == InPlaceOp::kSoftCap ? "SoftCap" : "Scale";
  if (p.num_elements < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: num_elements %d must be >= 0", name, p.num_elements));
  }
  if (!std::isfinite(p.value) || (p.op == InPlaceOp::kSoftCap && p.value <= 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: value %g must be finite%s", name, p.value,
                        p.op == InPlaceOp::kSoftCap ? " and > 0" : ""));
  }
  if (p.num_elements > 0 && p.x == nullptr) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: null x", name));
  }
  return absl::OkStatus();
}

absl::Status CheckAddGatedRowsParams(const AddGatedRowsParams& p) {
  if (p.rows < 0 || p.cols < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("AddGatedRows: rows %d must be >= 0 and cols %d >= 1", p.rows, p.cols));
  }
  if (p.rows > 0 && (p.x == nullptr || p.out == nullptr)) {
    return absl::InvalidArgumentError("AddGatedRows: null x or out");
  }
  return absl::OkStatus();
}

#if !LOOM_HAVE_CUDA
absl::Status LaunchSiluMul(const SiluMulParams& params, cudaStream_t) {
  if (absl::Status status = CheckSiluMulParams(params); !status.ok()) return status;
  return absl::FailedPreconditionError("SiluMul: Loom was built without CUDA");
}

absl::Status LaunchInPlace(const InPlaceParams& params, cudaStream_t) {
  if (absl::Status status = CheckInPlaceParams(params); !status.ok()) return status;
  return absl::FailedPreconditionError("InPlace: Loom was built without CUDA");
}

absl::Status LaunchAddGatedRows(const AddGatedRowsParams& params, cudaStream_t) {
  if (absl::Status status = CheckAddGatedRowsParams(params); !status.ok()) return status;
  return absl::FailedPreconditionError("AddGatedRows: Loom was built without CUDA");
}
#endif

}  // namespace loom::kernels::cuda
