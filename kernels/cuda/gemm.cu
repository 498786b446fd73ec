// Dense GEMM through cuBLAS (cublasGemmEx), plus the bias kernel.
//
// Row-major y[m, n] = x[m, k] · w[n, k]ᵀ is, read column-major, yᵀ[n, m] = w · xᵀ: w (a
// column-major [k, n] matrix) transposed times x (column-major [k, m]) untransposed, so
// cuBLAS gets (OP_T, OP_N, n, m, k) with leading dimensions k, k and n.
#include <cublas_v2.h>
#include <dlfcn.h>

#include "kernels/cuda/cublas_library.h"

#include <utility>

#include "common/status_macros.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/launch_internal.cuh"

namespace loom::kernels::cuda {
namespace {

using internal::FromFloat;
using internal::ToFloat;

// cublasGemmEx is overloaded in C++ (a wrapper for the old cudaDataType compute type):
// name the real entry point's type.
using GemmExFn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int,
                                    int, int, const void*, const void*, cudaDataType, int,
                                    const void*, cudaDataType, int, const void*, void*,
                                    cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
GemmExFn GemmEx() {
  static const GemmExFn fn =
      detail::ResolveCublas<GemmExFn>(detail::CublasLibrary::kCublas, "cublasGemmEx");
  return fn;
}

absl::Status FromCublas(cublasStatus_t status, const char* call) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrFormat("%s failed: %s (%d)", call,
                                             LOOM_CUBLAS(cublasGetStatusString)(status),
                                             static_cast<int>(status)));
}

cudaDataType_t CudaType(DataType type) {
  switch (type) {
    case DataType::kF32:
      return CUDA_R_32F;
    case DataType::kF16:
      return CUDA_R_16F;
    case DataType::kBF16:
      return CUDA_R_16BF;
  }
  return CUDA_R_32F;
}

template <typename T>
__global__ void AddBiasKernel(T* __restrict__ y, const float* __restrict__ bias,
                              int64_t num_elements, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       index < num_elements; index += stride) {
    y[index] = FromFloat<T>(ToFloat(y[index]) + bias[index % n]);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<GemmHandle>> GemmHandle::Create(cudaStream_t stream) {
  if (CudaDeviceCount() == 0) {
    return absl::FailedPreconditionError(
        absl::StrFormat("GemmHandle: no CUDA device (%s)", CudaDeviceDescription(0)));
  }
  if (detail::OpenCublasLibrary(detail::CublasLibrary::kCublas) == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrFormat("GemmHandle: cannot load libcublas: %s", dlerror()));
  }
  std::unique_ptr<GemmHandle> handle(new GemmHandle());
  handle->stream_ = stream;
  cublasHandle_t cublas = nullptr;
  LOOM_RETURN_IF_ERROR(FromCublas(LOOM_CUBLAS(cublasCreate)(&cublas), "cublasCreate"));
  handle->cublas_ = cublas;  // owned from here: the destructor destroys it on any error below
  // cublasSetStream resets the workspace to cuBLAS's default pool: set the stream first.
  LOOM_RETURN_IF_ERROR(FromCublas(LOOM_CUBLAS(cublasSetStream)(cublas, stream), "cublasSetStream"));
  LOOM_ASSIGN_OR_RETURN(handle->workspace_, DeviceBuffer::Allocate(kWorkspaceBytes));
  LOOM_RETURN_IF_ERROR(FromCublas(
      LOOM_CUBLAS(cublasSetWorkspace)(cublas, handle->workspace_.data(), handle->workspace_.bytes()),
      "cublasSetWorkspace"));
  return handle;
}

GemmHandle::~GemmHandle() {
  if (cublas_ != nullptr) LOOM_CUBLAS(cublasDestroy)(static_cast<cublasHandle_t>(cublas_));
}

absl::Status LaunchGemm(const GemmParams& p, GemmHandle& handle) {
  LOOM_RETURN_IF_ERROR(CheckGemmParams(p));
  if (p.m == 0) return absl::OkStatus();
  if (handle.cublas() == nullptr) return absl::FailedPreconditionError("Gemm: no cuBLAS handle");
  const float alpha = 1.0f, beta = 0.0f;
  const int m = static_cast<int>(p.m), n = static_cast<int>(p.n), k = static_cast<int>(p.k);
  LOOM_RETURN_IF_ERROR(FromCublas(
      GemmEx()(static_cast<cublasHandle_t>(handle.cublas()), CUBLAS_OP_T, CUBLAS_OP_N, n, m, k,
                   &alpha, p.w, CudaType(p.dtype), k, p.x, CudaType(p.dtype), k, &beta, p.y,
                   CudaType(p.y_dtype), n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      "cublasGemmEx"));
  if (p.bias == nullptr) return absl::OkStatus();
  constexpr int kThreads = 256;
  const int64_t num_elements = p.m * p.n;
  internal::DispatchDataType(p.y_dtype, [&]<typename T>() {
    AddBiasKernel<T><<<internal::GridFor(num_elements, kThreads), kThreads, 0, handle.stream()>>>(
        static_cast<T*>(p.y), p.bias, num_elements, p.n);
  });
  return internal::CheckLaunch("GemmAddBias");
}

}  // namespace loom::kernels::cuda
