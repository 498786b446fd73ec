// RoPE: one block per token. The token's cosines and sines are computed once into shared
// memory, then every (head, pair) of Q and K is rotated.
#include "common/status_macros.h"
#include "kernels/cuda/launch_internal.cuh"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/rope_internal.cuh"

namespace loom::kernels::cuda {
namespace {

using internal::FromFloat;
using internal::ToFloat;

template <typename T>
__device__ void RotateRows(T* row, int num_heads, int head_dim, int half, bool neox,
                           const float* cosines, const float* sines) {
  for (int index = threadIdx.x; index < num_heads * half; index += blockDim.x) {
    const int head = index / half, i = index % half;
    T* v = row + static_cast<int64_t>(head) * head_dim;
    const int a = neox ? i : 2 * i;
    const int b = neox ? i + half : 2 * i + 1;
    const float2 r = internal::RotatePair(ToFloat(v[a]), ToFloat(v[b]), cosines[i], sines[i]);
    v[a] = FromFloat<T>(r.x);
    v[b] = FromFloat<T>(r.y);
  }
}

template <typename T>
__global__ void RopeKernel(T* q, T* k, const int32_t* __restrict__ positions,
                           const float* __restrict__ inv_freq, int num_heads, int num_kv_heads,
                           int head_dim, int half, int64_t q_stride, int64_t k_stride, bool neox,
                           float attention_factor) {
  extern __shared__ float table[];  // [2 * half]: cosines, then sines
  float* cosines = table;
  float* sines = table + half;
  internal::FillRopeTable(static_cast<float>(positions[blockIdx.x]), inv_freq, half,
                          attention_factor, table);
  __syncthreads();
  RotateRows(q + blockIdx.x * q_stride, num_heads, head_dim, half, neox, cosines, sines);
  if (k != nullptr) {
    RotateRows(k + blockIdx.x * k_stride, num_kv_heads, head_dim, half, neox, cosines, sines);
  }
}

}  // namespace

absl::Status LaunchRope(const RopeParams& p, cudaStream_t stream) {
  LOOM_RETURN_IF_ERROR(CheckRopeParams(p));
  if (p.num_tokens == 0) return absl::OkStatus();
  const int half = static_cast<int>(p.rope_dim / 2);
  const int64_t q_stride = p.q_stride != 0 ? p.q_stride : p.num_heads * p.head_dim;
  const int64_t k_stride = p.k_stride != 0 ? p.k_stride : p.num_kv_heads * p.head_dim;
  const int64_t pairs = p.num_heads * half;
  const int threads = pairs >= 256 ? 256 : static_cast<int>((pairs + 31) / 32) * 32;
  const size_t shared = 2 * half * sizeof(float);
  internal::DispatchDataType(p.dtype, [&]<typename T>() {
    RopeKernel<T><<<static_cast<unsigned>(p.num_tokens), threads, shared, stream>>>(
        static_cast<T*>(p.q), static_cast<T*>(p.k), p.positions, p.inv_freq,
        static_cast<int>(p.num_heads), static_cast<int>(p.num_kv_heads),
        static_cast<int>(p.head_dim), half, q_stride, k_stride, p.neox, p.attention_factor);
  });
  return internal::CheckLaunch("Rope");
}

}  // namespace loom::kernels::cuda
