// SiLU·mul: element-wise, a grid-stride loop over [num_tokens, ffn].
#include "common/status_macros.h"
#include "kernels/cuda/activation.h"
#include "kernels/cuda/launch_internal.cuh"

namespace loom::kernels::cuda {
namespace {

using internal::FromFloat;
using internal::ToFloat;

template <typename T>
__global__ void SiluMulKernel(const T* __restrict__ gate_up, T* __restrict__ out,
                              int64_t num_elements, int64_t ffn) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       index < num_elements; index += stride) {
    const int64_t token = index / ffn, i = index % ffn;
    const T* row = gate_up + token * 2 * ffn;
    const float gate = ToFloat(row[i]);
    out[index] = FromFloat<T>(gate / (1.0f + expf(-gate)) * ToFloat(row[ffn + i]));
  }
}

}  // namespace

absl::Status LaunchSiluMul(const SiluMulParams& p, cudaStream_t stream) {
  LOOM_RETURN_IF_ERROR(CheckSiluMulParams(p));
  if (p.num_tokens == 0) return absl::OkStatus();
  constexpr int kThreads = 256;
  const int64_t num_elements = p.num_tokens * p.ffn;
  internal::DispatchDataType(p.dtype, [&]<typename T>() {
    SiluMulKernel<T><<<internal::GridFor(num_elements, kThreads), kThreads, 0, stream>>>(
        static_cast<const T*>(p.gate_up), static_cast<T*>(p.out), num_elements, p.ffn);
  });
  return internal::CheckLaunch("SiluMul");
}

}  // namespace loom::kernels::cuda
