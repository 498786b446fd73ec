// Random fill: element-wise, a grid-stride loop over [count].
#include "common/status_macros.h"
#include "kernels/cuda/launch_internal.cuh"
#include "kernels/cuda/random_fill.h"

namespace loom::kernels::cuda {
namespace {

using internal::FromFloat;

// The same computation as RandomFillValue in random_fill.cc (kept in step; the GPU test
// compares them bit for bit).
__device__ __forceinline__ float RandomValue(uint64_t seed, int64_t index, float offset,
                                             float scale) {
  uint64_t z = static_cast<uint64_t>(index) * 0x9E3779B97F4A7C15ull + seed * 0xD1B54A32D192ED03ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  const float u = static_cast<float>(z >> 40) * (1.0f / 8388608.0f) - 1.0f;
  return __fmaf_rn(scale, u, offset);
}

template <typename T>
__global__ void RandomFillKernel(T* __restrict__ out, int64_t count, uint64_t seed, float offset,
                                 float scale) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       index < count; index += stride) {
    out[index] = FromFloat<T>(RandomValue(seed, index, offset, scale));
  }
}

}  // namespace

absl::Status LaunchRandomFill(const RandomFillParams& p, cudaStream_t stream) {
  LOOM_RETURN_IF_ERROR(CheckRandomFillParams(p));
  if (p.count == 0) return absl::OkStatus();
  constexpr int kThreads = 256;
  internal::DispatchDataType(p.dtype, [&]<typename T>() {
    RandomFillKernel<T><<<internal::GridFor(p.count, kThreads), kThreads, 0, stream>>>(
        static_cast<T*>(p.out), p.count, p.seed, p.offset, p.scale);
  });
  return internal::CheckLaunch("RandomFill");
}

}  // namespace loom::kernels::cuda
