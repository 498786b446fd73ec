#pragma once

// The CUDA runner's device-side weights: a linear layer's weight uploaded dense (for cuBLAS) or
// kept 4-bit (for the W4A16 GEMM), and the CUDA runtime call check. Only in builds with CUDA
// (LOOM_HAVE_CUDA); the runner is the one user.

#if LOOM_HAVE_CUDA

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/status_macros.h"
#include "kernels/cpu/weights.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/quantized_gemm.h"

namespace loom::worker {

/// OK for cudaSuccess; otherwise Internal naming `call` and the error (a non-sticky error is
/// cleared so the next launch check does not report it again).
absl::Status CudaCallStatus(cudaError_t error, const char* call);

/// Every CUDA runtime call goes through this, so an error names the call.
#define LOOM_CUDA_RETURN_IF_ERROR(call) \
  LOOM_RETURN_IF_ERROR(::loom::worker::CudaCallStatus((call), #call))

// A linear layer's weight on the device: dense in dtype for cuBLAS, or INT4 kept 4-bit in the
// quantized GEMM's layout (a quarter of the bytes a decode step reads).
struct DeviceLinear {
  kernels::cuda::DeviceBuffer dense;      // [n, k] of dtype; empty when quantized
  kernels::cuda::DeviceBuffer q;          // Int4GpuWeight::q
  kernels::cuda::DeviceBuffer scale_min;  // Int4GpuWeight::scale_min
  // Quantized only: the bias in dtype (the quantized GEMM adds it).
  kernels::cuda::DeviceBuffer bias;
  int64_t n = 0, k = 0, group_size = 0;

  bool quantized() const { return q.data() != nullptr; }
  size_t bytes() const { return dense.bytes() + q.bytes() + scale_min.bytes(); }
};

/// `weight` dequantized to a dense [rows, cols] matrix of `dtype` on the device (uploaded in row
/// chunks, so the host scratch stays bounded).
absl::StatusOr<kernels::cuda::DeviceBuffer> UploadMatrix(const kernels::cpu::PackedWeight& weight,
                                                         kernels::cuda::DataType dtype);

/// `values` as F32 on the device.
absl::StatusOr<kernels::cuda::DeviceBuffer> UploadFloats(const std::vector<float>& values);

/// Whether the quantized GEMM takes `weight` as it is: INT4 in groups of 32/64/128 on a shape it
/// tiles (n % 16, k % 64). INT8 weights are per-group here (GGUF Q8_0), which the per-channel W8A16
/// kernel does not take; they are dequantized.
bool QuantGemmTakes(const kernels::cpu::PackedWeight& weight);

/// `weight` (and its `bias`, may be null) on the device: 4-bit in the quantized GEMM's layout when
/// `keep_quantized` and QuantGemmTakes(weight), dense in `dtype` otherwise.
absl::StatusOr<DeviceLinear> UploadLinear(const kernels::cpu::PackedWeight& weight,
                                          const std::vector<float>* bias,
                                          kernels::cuda::DataType dtype, bool keep_quantized);

/// The quantized GEMM's parameters for `linear` at m tokens (x, y, workspace left unset).
kernels::cuda::QuantGemmParams QuantParams(const DeviceLinear& linear,
                                           kernels::cuda::DataType dtype, int64_t m);

}  // namespace loom::worker

#endif  // LOOM_HAVE_CUDA
