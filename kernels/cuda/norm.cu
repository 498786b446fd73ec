// RMSNorm (+ residual add): one block per token; the row is read twice (sum of squares,
// then scale), the second time mostly from L1/L2.
#include "common/status_macros.h"
#include "kernels/cuda/launch_internal.cuh"
#include "kernels/cuda/norm.h"

namespace loom::kernels::cuda {
namespace {

using internal::FromFloat;
using internal::ToFloat;

// Launched with up to 1024 threads: the bound keeps the compiler's register use within what
// a block that size may have. `x` is not __restrict__: `out` may alias it.
template <typename T, bool kAddResidual>
__global__ void __launch_bounds__(1024) RmsNormKernel(const T* x, T* residual,
                              const float* __restrict__ weight, T* out, float eps, int hidden,
                              void* out_low, bool low_bf16) {
  __shared__ float scratch[32];
  const int64_t row = static_cast<int64_t>(blockIdx.x) * hidden;
  float sum_squares = 0.0f;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    float value = ToFloat(x[row + i]);
    if constexpr (kAddResidual) {
      // The norm sees the sum as the residual stream stores it.
      const T stored = FromFloat<T>(ToFloat(residual[row + i]) + value);
      residual[row + i] = stored;
      value = ToFloat(stored);
    }
    sum_squares += value * value;
  }
  const float inverse_rms = rsqrtf(internal::BlockSum(sum_squares, scratch) / hidden + eps);
  // Each thread re-reads only the elements it wrote, so out may alias x.
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    const float value = kAddResidual ? ToFloat(residual[row + i]) : ToFloat(x[row + i]);
    const T normed = FromFloat<T>(value * inverse_rms * weight[i]);
    out[row + i] = normed;
    if (out_low != nullptr) internal::StoreLow(out_low, low_bf16, row + i, ToFloat(normed));
  }
}

}  // namespace

absl::Status LaunchRmsNorm(const RmsNormParams& p, cudaStream_t stream) {
  LOOM_RETURN_IF_ERROR(CheckRmsNormParams(p));
  if (p.num_tokens == 0) return absl::OkStatus();
  if (p.num_tokens > 0x7fffffff) return absl::InvalidArgumentError("RmsNorm: too many tokens");
  const int threads = p.hidden >= 1024 ? 1024 : ((static_cast<int>(p.hidden) + 31) / 32) * 32;
  const int hidden = static_cast<int>(p.hidden);
  const bool low_bf16 = p.low_dtype == DataType::kBF16;
  internal::DispatchDataType(p.dtype, [&]<typename T>() {
    if (p.residual != nullptr) {
      RmsNormKernel<T, true><<<static_cast<unsigned>(p.num_tokens), threads, 0, stream>>>(
          static_cast<const T*>(p.x), static_cast<T*>(p.residual), p.weight, static_cast<T*>(p.out),
          p.eps, hidden, p.out_low, low_bf16);
    } else {
      RmsNormKernel<T, false><<<static_cast<unsigned>(p.num_tokens), threads, 0, stream>>>(
          static_cast<const T*>(p.x), nullptr, p.weight, static_cast<T*>(p.out), p.eps, hidden,
          p.out_low, low_bf16);
    }
  });
  return internal::CheckLaunch("RmsNorm");
}

}  // namespace loom::kernels::cuda
