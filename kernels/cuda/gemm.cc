#include "kernels/cuda/gemm.h"

#include <cstdint>

#include "absl/strings/str_format.h"

namespace loom::kernels::cuda {

absl::Status CheckGemmParams(const GemmParams& p) {
  if (p.dtype != DataType::kF16 && p.dtype != DataType::kBF16) {
    return absl::InvalidArgumentError(
        absl::StrFormat("Gemm: dtype %s unsupported (F16, BF16)", DataTypeName(p.dtype)));
  }
  if (p.y_dtype != p.dtype && p.y_dtype != DataType::kF32) {
    return absl::InvalidArgumentError(absl::StrFormat("Gemm: y dtype %s must be F32 or %s",
                                                      DataTypeName(p.y_dtype),
                                                      DataTypeName(p.dtype)));
  }
  constexpr int64_t kMaxDim = 0x7fffffff;  // cuBLAS takes int sizes and leading dimensions
  if (p.m < 0 || p.m > kMaxDim) {
    return absl::InvalidArgumentError(absl::StrFormat("Gemm: m %d must be in [0, 2^31)", p.m));
  }
  if (p.n < 1 || p.n > kMaxDim) {
    return absl::InvalidArgumentError(absl::StrFormat("Gemm: n %d must be in [1, 2^31)", p.n));
  }
  if (p.k < 1 || p.k > kMaxDim) {
    return absl::InvalidArgumentError(absl::StrFormat("Gemm: k %d must be in [1, 2^31)", p.k));
  }
  if (p.m > 0 && (p.x == nullptr || p.w == nullptr || p.y == nullptr)) {
    return absl::InvalidArgumentError("Gemm: null x, w or y");
  }
  if (p.m > 0 && (p.y == p.x || p.y == p.w)) {
    return absl::InvalidArgumentError("Gemm: y must not alias x or w");
  }
  return absl::OkStatus();
}

#if !LOOM_HAVE_CUDA
absl::StatusOr<std::unique_ptr<GemmHandle>> GemmHandle::Create(cudaStream_t) {
  return absl::FailedPreconditionError("GemmHandle: Loom was built without CUDA");
}

GemmHandle::~GemmHandle() = default;

absl::Status LaunchGemm(const GemmParams& params, GemmHandle&) {
  if (absl::Status status = CheckGemmParams(params); !status.ok()) return status;
  return absl::FailedPreconditionError("Gemm: Loom was built without CUDA");
}
#endif

}  // namespace loom::kernels::cuda
