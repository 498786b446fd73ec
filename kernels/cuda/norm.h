#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/types.h"
#include "kernels/cuda_device.h"

namespace loom::kernels::cuda {

/// RMSNorm over device rows, optionally fused with the residual add (cpu::AddRmsNorm):
/// with `residual` set, residual += x first (stored rounded to `dtype`) and the rounded sum
/// is normalized; without it, x is. out = v / sqrt(mean(v²) + eps) * weight, accumulated
/// in float. out may alias x.
struct RmsNormParams {
  const void* x = nullptr;        // [num_tokens, hidden] of dtype
  void* residual = nullptr;       // [num_tokens, hidden] of dtype, or nullptr (plain RMSNorm)
  const float* weight = nullptr;  // [hidden]
  void* out = nullptr;            // [num_tokens, hidden] of dtype
  DataType dtype = DataType::kF32;
  float eps = 1e-5f;       // finite, >= 0
  int64_t num_tokens = 0;  // >= 0 (0 launches nothing)
  int64_t hidden = 0;      // in [1, 65536]
  /// Also `out` rounded to low_dtype (F16 or BF16) here, or nullptr: the input of a GEMM that
  /// follows the norm, without a conversion launch of its own.
  void* out_low = nullptr;  // [num_tokens, hidden] of low_dtype
  DataType low_dtype = DataType::kF16;
};

/// InvalidArgument (naming the field and value) for a shape the kernel cannot run.
absl::Status CheckRmsNormParams(const RmsNormParams& params);

/// Asynchronous on `stream`, one block per token; thread-safe (no state). FailedPrecondition
/// without CUDA.
absl::Status LaunchRmsNorm(const RmsNormParams& params, cudaStream_t stream);

}  // namespace loom::kernels::cuda
