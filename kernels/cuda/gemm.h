#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/types.h"
#include "kernels/cuda_device.h"

namespace loom::kernels::cuda {

/// A cuBLAS handle bound to one stream of the device current at creation, with its own
/// workspace (set explicitly so GEMMs can be captured into CUDA graphs without cuBLAS
/// allocating). Create one per worker stream. Not thread-safe: one thread enqueues on it
/// at a time (cuBLAS handles must not be shared between concurrently running threads).
class GemmHandle {
 public:
  /// Bytes of workspace each handle owns (cuBLAS's recommendation for Hopper).
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;

  /// cublasCreate + cublasSetStream(stream) + cublasSetWorkspace on the current device.
  /// FailedPrecondition without CUDA; Internal naming the cuBLAS call that failed.
  static absl::StatusOr<std::unique_ptr<GemmHandle>> Create(cudaStream_t stream);

  GemmHandle(const GemmHandle&) = delete;
  GemmHandle& operator=(const GemmHandle&) = delete;
  ~GemmHandle();

  cudaStream_t stream() const { return stream_; }
  /// The cublasHandle_t, opaque here so this header needs no CUDA headers.
  void* cublas() const { return cublas_; }

 private:
  GemmHandle() = default;

  void* cublas_ = nullptr;        // cublasHandle_t, owned; set once Create succeeded
  cudaStream_t stream_ = nullptr;  // not owned; every GEMM of this handle runs on it
  DeviceBuffer workspace_;         // kWorkspaceBytes, lives as long as the handle
};

/// Dense GEMM with row-major operands, as cpu::Matmul: y[m, n] = x[m, k] · w[n, k]ᵀ
/// (+ bias[n]), accumulated in F32 on tensor cores (cublasGemmEx, CUBLAS_COMPUTE_32F),
/// the result rounded once to y_dtype; the bias is added by a second small kernel in
/// float to the rounded product (y = round(round(x·wᵀ) + bias) for F16/BF16 outputs).
struct GemmParams {
  const void* x = nullptr;        // [m, k] of dtype, row-major
  const void* w = nullptr;        // [n, k] of dtype, row-major (a weight: out x in features)
  const float* bias = nullptr;    // [n] F32, or nullptr (no bias)
  void* y = nullptr;              // [m, n] of y_dtype, row-major; must not alias x or w
  DataType dtype = DataType::kF16;    // of x and w: F16 or BF16
  DataType y_dtype = DataType::kF16;  // dtype or F32 (logits)
  int64_t m = 0;  // rows of x and y, in [0, 2^31) (0 launches nothing)
  int64_t n = 0;  // rows of w, columns of y, in [1, 2^31)
  int64_t k = 0;  // columns of x and w, in [1, 2^31)
};

/// InvalidArgument (naming the field and value) for a GEMM these kernels cannot run:
/// dtypes, sizes, null pointers. Checked before any CUDA call.
absl::Status CheckGemmParams(const GemmParams& params);

/// Enqueues the GEMM (and the bias kernel) on `handle`'s stream; asynchronous.
/// Thread-safety is the handle's. FailedPrecondition without CUDA; Internal naming the
/// cuBLAS call or kernel launch that failed.
absl::Status LaunchGemm(const GemmParams& params, GemmHandle& handle);

}  // namespace loom::kernels::cuda
