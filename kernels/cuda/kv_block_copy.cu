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

// The thread block copies `rows` runs of `size` bytes, run r from src + r * src_stride to
// dst + r * dst_stride (some KV heads of each token row), 16 bytes an access where every run
// allows it, the loads of a round before its stores as in CopyPiece.
__device__ __forceinline__ void CopyRows(const uint8_t* src, uint8_t* dst, int64_t size, int rows,
                                         int64_t src_stride, int64_t dst_stride) {
  if (((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst) |
        static_cast<uintptr_t>(size) | static_cast<uintptr_t>(src_stride) |
        static_cast<uintptr_t>(dst_stride)) &
       15) != 0) {
    for (int64_t i = threadIdx.x; i < size * rows; i += kThreads) {
      dst[i / size * dst_stride + i % size] = src[i / size * src_stride + i % size];
    }
    return;
  }
  const int64_t row_words = size / 16, words = row_words * rows;
  const int64_t src_row = src_stride / 16, dst_row = dst_stride / 16;
  const uint4* from = reinterpret_cast<const uint4*>(src);
  uint4* to = reinterpret_cast<uint4*>(dst);
  int64_t i = threadIdx.x;
  for (; i + (kUnroll - 1) * kThreads < words; i += kUnroll * kThreads) {
    uint4 staged[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t w = i + u * kThreads;
      staged[u] = from[w / row_words * src_row + w % row_words];
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t w = i + u * kThreads;
      to[w / row_words * dst_row + w % row_words] = staged[u];
    }
  }
  for (; i < words; i += kThreads) to[i / row_words * dst_row + i % row_words] = from[i / row_words * src_row + i % row_words];
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
  const KvHeadCopy& h = p.heads;
  if (h.count == 0) {  // whole blocks
    CopyPiece(p.src_parts[part] + static_cast<int64_t>(p.src_blocks[entry]) * size,
              p.dest_parts[part] + static_cast<int64_t>(p.dest_blocks[entry]) * size, size);
    return;
  }
  // Some heads of each token row: bytes per head, then the rows' strides in either pool.
  const int64_t head = size / (int64_t{h.block_size} * h.dest_heads);
  const int64_t src_size = head * h.block_size * h.src_heads;
  CopyRows(p.src_parts[part] + static_cast<int64_t>(p.src_blocks[entry]) * src_size +
               h.src_first * head,
           p.dest_parts[part] + static_cast<int64_t>(p.dest_blocks[entry]) * size +
               h.dest_first * head,
           h.count * head, h.block_size, h.src_heads * head, h.dest_heads * head);
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
