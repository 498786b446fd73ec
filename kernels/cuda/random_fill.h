#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/types.h"
#include "kernels/cuda_device.h"

namespace loom::kernels::cuda {

/// Fills a device tensor with deterministic pseudo-random values, without a host copy
/// (random weights for benchmarks of full-size models): element i holds
/// RandomFillValue(seed, i, offset, scale) rounded once to dtype, i.e. offset plus a value
/// uniform in [-scale, scale). scale 0 gives the constant `offset` (RMSNorm weights of 1).
struct RandomFillParams {
  void* out = nullptr;  // [count] of dtype
  DataType dtype = DataType::kF16;
  int64_t count = 0;  // >= 0
  uint64_t seed = 0;  // the same (seed, index) gives the same value on every device
  float offset = 0.0f;  // finite
  float scale = 1.0f;   // finite, >= 0
};

/// InvalidArgument (naming the field and value) for parameters the kernel cannot run.
absl::Status CheckRandomFillParams(const RandomFillParams& params);

/// Asynchronous on `stream`; thread-safe (no state). FailedPrecondition without CUDA.
absl::Status LaunchRandomFill(const RandomFillParams& params, cudaStream_t stream);

/// The host reference: the float value element `index` gets before rounding to dtype,
/// offset + scale * u with u = k * 2^-23 - 1 for a 24-bit hash k of (seed, index), as one
/// fused multiply-add (bit-identical to the kernel). Thread-safe.
float RandomFillValue(uint64_t seed, int64_t index, float offset, float scale);

}  // namespace loom::kernels::cuda
