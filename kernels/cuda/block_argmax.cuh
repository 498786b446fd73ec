#pragma once

// Block-wide argmax shared by the sampling and speculative-verify kernels: the larger
// value wins, the lower index on ties (std::max_element's choice for inputs without NaN),
// index -1 meaning "none". Device code only; include from .cu files.

namespace loom::kernels::cuda::internal {

__device__ __forceinline__ bool ArgmaxBetter(float value, int index, float best, int best_index) {
  return index >= 0 && (best_index < 0 || value > best || (value == best && index < best_index));
}

/// Combines every thread's (value, index) candidate into the block's: all threads of the
/// block (kWarps warps of 32) must call it; every thread gets the result. `best_value` and
/// `best_index` are kWarps slots of shared scratch, free again when it returns.
template <int kWarps>
__device__ void BlockArgmax(float& value, int& index, float* best_value, int* best_index) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float other_value = __shfl_xor_sync(0xffffffffu, value, offset);
    const int other_index = __shfl_xor_sync(0xffffffffu, index, offset);
    if (ArgmaxBetter(other_value, other_index, value, index)) {
      value = other_value;
      index = other_index;
    }
  }
  if (lane == 0) {
    best_value[warp] = value;
    best_index[warp] = index;
  }
  __syncthreads();
  value = best_value[0];
  index = best_index[0];
  for (int w = 1; w < kWarps; ++w) {
    if (ArgmaxBetter(best_value[w], best_index[w], value, index)) {
      value = best_value[w];
      index = best_index[w];
    }
  }
  __syncthreads();  // the scratch is reused by the next reduction
}

}  // namespace loom::kernels::cuda::internal
