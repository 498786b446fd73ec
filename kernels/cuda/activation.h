#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/types.h"
#include "kernels/cuda_device.h"

namespace loom::kernels::cuda {

/// SwiGLU on the device, as cpu::SiluMul: out[t, i] = silu(gate_up[t, i]) * gate_up[t, ffn + i],
/// computed in float (expf, no fast-math) and rounded once to dtype.
struct SiluMulParams {
  const void* gate_up = nullptr;  // [num_tokens, 2 * ffn] of dtype (gate, then up)
  void* out = nullptr;            // [num_tokens, ffn] of dtype
  DataType dtype = DataType::kF32;
  int64_t num_tokens = 0;  // >= 0
  int64_t ffn = 0;         // >= 1
};

/// InvalidArgument (naming the field and value) for a shape the kernel cannot run.
absl::Status CheckSiluMulParams(const SiluMulParams& params);

/// Asynchronous on `stream`; thread-safe (no state). FailedPrecondition without CUDA.
absl::Status LaunchSiluMul(const SiluMulParams& params, cudaStream_t stream);

}  // namespace loom::kernels::cuda
