// KV write: one block per token copies its K and V rows into the token's slot.
#include "common/status_macros.h"
#include "kernels/cuda/kv_cache.h"
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

}  // namespace

absl::Status LaunchWriteKv(const WriteKvParams& p, cudaStream_t stream) {
  LOOM_RETURN_IF_ERROR(CheckWriteKvParams(p));
  if (p.num_tokens == 0) return absl::OkStatus();
  const int64_t row = p.cache.num_kv_heads * p.cache.head_dim;
  const int64_t k_stride = p.k_stride != 0 ? p.k_stride : row;
  const int64_t v_stride = p.v_stride != 0 ? p.v_stride : row;
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
