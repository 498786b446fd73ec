#pragma once

// Internal to kernels/cuda: the online softmax's two helpers the decode kernels share
// (paged_attention.cu, paged_decode_mma.cu).

#include <cmath>

namespace loom::kernels::cuda::internal {

// exp(x - base) where base is -inf when nothing was attended yet (then 0, not NaN).
__device__ __forceinline__ float ExpFrom(float x, float max) {
  return expf(x - (max == -INFINITY ? 0.0f : max));
}

// Adds an attention sink to a finished softmax: `numerator` and `denominator` are
// relative to `max`; afterwards both are relative to max(max, sink) (so exp never
// overflows, a dominant sink just drives the output to 0) and the denominator holds
// exp(sink) too. Nothing attended (max -inf, sums 0) stays 0 / exp(0).
__device__ __forceinline__ void AddSink(float sink, float max, float& numerator,
                                        float& denominator) {
  const float new_max = fmaxf(max, sink);
  const float rescale = ExpFrom(max, new_max);
  numerator *= rescale;
  denominator = denominator * rescale + ExpFrom(sink, new_max);
}

}  // namespace loom::kernels::cuda::internal
