// Empty without CUDA: model/cuda_status.h is for CUDA builds only.
#if LOOM_HAVE_CUDA
#include "model/cuda_status.h"

#include "absl/strings/str_format.h"

namespace loom::model {

absl::Status CudaStatus(cudaError_t error, const char* call) {
  if (error == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();  // clears a non-sticky error so the next check does not repeat it
  return absl::InternalError(absl::StrFormat("%s: %s", call, cudaGetErrorString(error)));
}

}  // namespace loom::model

#endif  // LOOM_HAVE_CUDA
