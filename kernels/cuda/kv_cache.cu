// KV write: one block per token copies its K and V rows into the token's slot; for the
// 8-bit types one warp per (token, KV head, K or V) row rotates, scales and rounds it.
// Head rotation: one warp per row.
#include <cmath>

#include "common/status_macros.h"
#include "kernels/cuda/kv_cache.h"
#include "kernels/cuda/kv_quant.cuh"
#include "kernels/cuda/launch_internal.cuh"

namespace loom::kernels::cuda {
namespace {

using internal::FromFloat;
using internal::ToFloat;

template <typename Src, typename Kv>
__global__ void WriteKvKernel(const Src* __restrict__ k, const Src* __restrict__ v,
                              int64_t k_stride, int64_t v_stride, const int32_t* __restrict__ slots,
                              Kv* __restrict__ k_cache, Kv* __restrict__ v_cache, int64_t num_slots,
                              int64_t row) {
  const int64_t slot = slots[blockIdx.x];
  if (slot < 0 || slot >= num_slots) return;  // padding (or a slot the host failed to reject)
  const Src* k_row = k + blockIdx.x * k_stride;
  const Src* v_row = v + blockIdx.x * v_stride;
  Kv* k_dst = k_cache + slot * row;
  Kv* v_dst = v_cache + slot * row;
  for (int64_t i = threadIdx.x; i < row; i += blockDim.x) {
    k_dst[i] = FromFloat<Kv>(ToFloat(k_row[i]));
    v_dst[i] = FromFloat<Kv>(ToFloat(v_row[i]));
  }
}

constexpr int kRowThreads = 128;  // 4 warps, a row each

struct QuantizedWriteArgs {
  const void* k;
  const void* v;
  int64_t k_stride, v_stride;
  const int32_t* slots;
  uint8_t* k_cache;
  uint8_t* v_cache;
  uint16_t* k_scale;
  uint16_t* v_scale;
  int64_t num_slots;
  int64_t num_rows;  // num_tokens * num_kv_heads * 2
  int num_kv_heads;
  float norm;  // 1 / sqrt(head_dim), as the CPU computes it
};

template <typename Src, typename Code, int E>
__global__ void __launch_bounds__(kRowThreads) WriteKvQuantizedKernel(QuantizedWriteArgs a) {
  constexpr int kHeadDim = 32 * E;
  const int lane = threadIdx.x % 32;
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * kRowThreads + threadIdx.x) / 32;
  if (row >= a.num_rows) return;  // uniform over the warp
  const int64_t token = row / (2 * a.num_kv_heads);
  const int which = static_cast<int>(row / a.num_kv_heads % 2);  // 0: K, 1: V
  const int head = static_cast<int>(row % a.num_kv_heads);
  const int64_t slot = a.slots[token];
  if (slot < 0 || slot >= a.num_slots) return;
  const Src* src = static_cast<const Src*>(which == 0 ? a.k : a.v) +
                   token * (which == 0 ? a.k_stride : a.v_stride) +
                   static_cast<int64_t>(head) * kHeadDim + lane * E;
  float x[E];
#pragma unroll
  for (int i = 0; i < E; ++i) x[i] = ToFloat(src[i]);
  internal::WarpHadamard<E>(x, lane);
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < E; ++i) {
    x[i] *= a.norm;
    const float m = fabsf(x[i]);
    amax = m > amax ? m : amax;  // NaN is skipped
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, amax, offset);
    amax = other > amax ? other : amax;
  }
  const uint16_t scale = internal::KvRowScaleBits(amax, internal::kKvCodeMax<Code>);
  const float s = internal::Bf16BitsToFloat(scale);
  const float inverse = s > 0.0f ? 1.0f / s : 0.0f;
  const int64_t index = slot * a.num_kv_heads + head;
  uint8_t* dst = (which == 0 ? a.k_cache : a.v_cache) + index * kHeadDim + lane * E;
#pragma unroll
  for (int i = 0; i < E; ++i) dst[i] = internal::QuantizeKvCode<Code>(x[i], inverse);
  if (lane == 0) (which == 0 ? a.k_scale : a.v_scale)[index] = scale;
}

template <typename Dst, int E>
__global__ void __launch_bounds__(kRowThreads)
    RotateHeadsKernel(const float* src, Dst* dst, int64_t rows, float norm) {
  constexpr int kHeadDim = 32 * E;
  const int lane = threadIdx.x % 32;
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * kRowThreads + threadIdx.x) / 32;
  if (row >= rows) return;  // uniform over the warp
  float x[E];
#pragma unroll
  for (int i = 0; i < E; ++i) x[i] = src[row * kHeadDim + lane * E + i];
  internal::WarpHadamard<E>(x, lane);
#pragma unroll
  for (int i = 0; i < E; ++i) dst[row * kHeadDim + lane * E + i] = FromFloat<Dst>(x[i] * norm);
}

// Calls body.template operator()<E>() for head_dim = 32 E.
template <typename Body>
void DispatchRowElements(int64_t head_dim, Body&& body) {
  switch (head_dim) {
    case 32:
      body.template operator()<1>();
      break;
    case 64:
      body.template operator()<2>();
      break;
    case 128:
      body.template operator()<4>();
      break;
    default:
      body.template operator()<8>();
      break;
  }
}

float HadamardNorm(int64_t head_dim) { return 1.0f / std::sqrt(static_cast<float>(head_dim)); }

unsigned RowBlocks(int64_t rows) {
  return static_cast<unsigned>((rows * 32 + kRowThreads - 1) / kRowThreads);
}

absl::Status LaunchWriteKvQuantized(const WriteKvParams& p, int64_t k_stride, int64_t v_stride,
                                    cudaStream_t stream) {
  QuantizedWriteArgs a{};
  a.k = p.k;
  a.v = p.v;
  a.k_stride = k_stride;
  a.v_stride = v_stride;
  a.slots = p.slots;
  a.k_cache = static_cast<uint8_t*>(p.cache.k);
  a.v_cache = static_cast<uint8_t*>(p.cache.v);
  a.k_scale = p.cache.k_scale;
  a.v_scale = p.cache.v_scale;
  a.num_slots = p.cache.num_blocks * p.cache.block_size;
  a.num_rows = p.num_tokens * p.cache.num_kv_heads * 2;
  a.num_kv_heads = static_cast<int>(p.cache.num_kv_heads);
  a.norm = HadamardNorm(p.cache.head_dim);
  internal::DispatchDataType(p.src_dtype, [&]<typename Src>() {
    DispatchRowElements(p.cache.head_dim, [&]<int E>() {
      const unsigned blocks = RowBlocks(a.num_rows);
      if (p.cache.quant == KvQuant::kInt8) {
        WriteKvQuantizedKernel<Src, int8_t, E><<<blocks, kRowThreads, 0, stream>>>(a);
      } else {
        WriteKvQuantizedKernel<Src, uint8_t, E><<<blocks, kRowThreads, 0, stream>>>(a);
      }
    });
  });
  return internal::CheckLaunch("WriteKv");
}

}  // namespace

absl::Status LaunchRotateHeads(const RotateHeadsParams& p, cudaStream_t stream) {
  LOOM_RETURN_IF_ERROR(CheckRotateHeadsParams(p));
  if (p.rows == 0) return absl::OkStatus();
  const float norm = HadamardNorm(p.head_dim);
  internal::DispatchDataType(p.dst_dtype, [&]<typename Dst>() {
    DispatchRowElements(p.head_dim, [&]<int E>() {
      RotateHeadsKernel<Dst, E><<<RowBlocks(p.rows), kRowThreads, 0, stream>>>(
          p.src, static_cast<Dst*>(p.dst), p.rows, norm);
    });
  });
  return internal::CheckLaunch("RotateHeads");
}

absl::Status LaunchWriteKv(const WriteKvParams& p, cudaStream_t stream) {
  LOOM_RETURN_IF_ERROR(CheckWriteKvParams(p));
  if (p.num_tokens == 0) return absl::OkStatus();
  const int64_t row = p.cache.num_kv_heads * p.cache.head_dim;
  const int64_t k_stride = p.k_stride != 0 ? p.k_stride : row;
  const int64_t v_stride = p.v_stride != 0 ? p.v_stride : row;
  if (p.cache.quant != KvQuant::kNone) {
    return LaunchWriteKvQuantized(p, k_stride, v_stride, stream);
  }
  const int threads = row >= 256 ? 256 : static_cast<int>((row + 31) / 32) * 32;
  const int64_t num_slots = p.cache.num_blocks * p.cache.block_size;
  internal::DispatchDataType(p.src_dtype, [&]<typename Src>() {
    auto launch = [&]<typename Kv>() {
      WriteKvKernel<Src, Kv><<<static_cast<unsigned>(p.num_tokens), threads, 0, stream>>>(
          static_cast<const Src*>(p.k), static_cast<const Src*>(p.v), k_stride, v_stride, p.slots,
          static_cast<Kv*>(p.cache.k), static_cast<Kv*>(p.cache.v), num_slots, row);
    };
    if (p.cache.dtype == DataType::kF16) {
      launch.template operator()<__half>();
    } else {
      launch.template operator()<__nv_bfloat16>();
    }
  });
  return internal::CheckLaunch("WriteKv");
}

}  // namespace loom::kernels::cuda
