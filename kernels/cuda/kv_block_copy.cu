// Whole KV blocks between a pool and a staging area in the host tier's slot layout, and from one
// pool straight into another: one thread block per (pool part, block) piece, 16-byte accesses
// when the piece allows them.
#include <cstdint>

#include "common/status_macros.h"
#include "kernels/cuda/kv_block_copy.h"
#include "kernels/cuda/launch_internal.cuh"

namespace loom::kernels::cuda {
namespace {

constexpr int kThreads = 256;
// 16-byte loads each thread has in flight before it stores them: a peer GPU's memory (CUDA IPC
// over NVLink) answers in microseconds, and one load at a time would leave the link idle.
constexpr int kUnroll = 4;

// The thread block copies `size` bytes from `src` to `dst`.
__device__ __forceinline__ void CopyPiece(const uint8_t* src, uint8_t* dst, int64_t size) {
  if (((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst) |
        static_cast<uintptr_t>(size)) &
       15) != 0) {
    for (int64_t i = threadIdx.x; i < size; i += kThreads) dst[i] = src[i];
    return;
  }
  const uint4* from = reinterpret_cast<const uint4*>(src);
  uint4* to = reinterpret_cast<uint4*>(dst);
  const int64_t words = size / 16;
  int64_t i = threadIdx.x;
  // Every load of a round before its stores (the compiler cannot hoist them: to may alias from).
  for (; i + (kUnroll - 1) * kThreads < words; i += kUnroll * kThreads) {
    uint4 staged[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) staged[u] = from[i + u * kThreads];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) to[i + u * kThreads] = staged[u];
  }
  for (; i < words; i += kThreads) to[i] = from[i];
}

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
  CopyPiece(p.to_staging ? pooled : staged, p.to_staging ? staged : pooled, size);
}

// blockIdx.x: part p (in slot order, as above); blockIdx.y: entry i of the batch.
__global__ void __launch_bounds__(kThreads) KvPoolCopyKernel(const KvPoolCopyParams p) {
  const int part = blockIdx.x, entry = blockIdx.y;
  const int64_t size = part % p.pools_per_layer < 2 ? p.value_bytes : p.scale_bytes;
  CopyPiece(p.src_parts[part] + static_cast<int64_t>(p.src_blocks[entry]) * size,
            p.dest_parts[part] + static_cast<int64_t>(p.dest_blocks[entry]) * size, size);
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

absl::Status LaunchKvPoolCopy(const KvPoolCopyParams& p, cudaStream_t stream) {
  LOOM_RETURN_IF_ERROR(CheckKvPoolCopyParams(p));
  if (p.num_blocks == 0) return absl::OkStatus();
  const dim3 grid(static_cast<unsigned>(p.num_layers * p.pools_per_layer),
                  static_cast<unsigned>(p.num_blocks));
  KvPoolCopyKernel<<<grid, kThreads, 0, stream>>>(p);
  return internal::CheckLaunch("KvPoolCopy");
}

}  // namespace loom::kernels::cuda
