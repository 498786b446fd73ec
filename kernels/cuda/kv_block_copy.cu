// Whole KV blocks between a pool and a staging area in the host tier's slot layout: one thread
// block per (pool, block) piece, 16-byte accesses when the piece allows them.
#include <cstdint>

#include "common/status_macros.h"
#include "kernels/cuda/kv_block_copy.h"
#include "kernels/cuda/launch_internal.cuh"

namespace loom::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// blockIdx.x: pool p (layer p / pools_per_layer, part p % pools_per_layer: K, V, K scales,
// V scales); blockIdx.y: entry i of the batch.
__global__ void __launch_bounds__(kThreads) KvBlockCopyKernel(const KvBlockCopyParams p) {
  const int pool = blockIdx.x, entry = blockIdx.y;
  const int layer = pool / p.pools_per_layer, part = pool % p.pools_per_layer;
  const int64_t size = part < 2 ? p.value_bytes : p.scale_bytes;
  const int64_t in_layer = part < 2 ? part * p.value_bytes : 2 * p.value_bytes + (part - 2) * p.scale_bytes;
  const int64_t slot_bytes = int64_t{p.num_layers} * 2 * (p.value_bytes + p.scale_bytes);
  uint8_t* pooled = p.pools[pool] + static_cast<int64_t>(p.blocks[entry]) * size;
  uint8_t* staged =
      p.staging + entry * slot_bytes + layer * 2 * (p.value_bytes + p.scale_bytes) + in_layer;
  const uint8_t* src = p.to_staging ? pooled : staged;
  uint8_t* dst = p.to_staging ? staged : pooled;
  if (((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst) |
        static_cast<uintptr_t>(size)) &
       15) == 0) {
    const uint4* from = reinterpret_cast<const uint4*>(src);
    uint4* to = reinterpret_cast<uint4*>(dst);
    for (int64_t i = threadIdx.x; i < size / 16; i += kThreads) to[i] = from[i];
    return;
  }
  for (int64_t i = threadIdx.x; i < size; i += kThreads) dst[i] = src[i];
}

}  // namespace

absl::Status LaunchKvBlockCopy(const KvBlockCopyParams& p, cudaStream_t stream) {
  LOOM_RETURN_IF_ERROR(CheckKvBlockCopyParams(p));
  if (p.num_blocks == 0) return absl::OkStatus();
  const dim3 grid(static_cast<unsigned>(p.num_layers * p.pools_per_layer),
                  static_cast<unsigned>(p.num_blocks));
  KvBlockCopyKernel<<<grid, kThreads, 0, stream>>>(p);
  return internal::CheckLaunch("KvBlockCopy");
}

}  // namespace loom::kernels::cuda
