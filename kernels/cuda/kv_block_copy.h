#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda_device.h"

namespace loom::kernels::cuda {

/// Most blocks one KvBlockCopy launch moves (their ids travel in the launch's arguments).
inline constexpr int kKvBlockCopyMaxBlocks = 64;

/// Whole KV blocks between a paged pool and a contiguous device staging area laid out as the
/// host tier's slots: slot i holds block blocks[i], per layer its K values, V values and, with
/// 8-bit KV, K scales and V scales, contiguous (model::KvCache::block_bytes each). Moving a
/// batch of blocks to the host is then one gather here and one copy per slot (per run of
/// adjacent slots) over the link, instead of one copy per layer's K or V of every block: on the
/// H200 of 2026-12-04 a 32 KiB copy each ran the host tier at 0.19 of the link's bandwidth.
///
/// The pools, in slot order (per layer K, V, then K scales, V scales), each hold pool_blocks
/// blocks of value_bytes (K, V) or scale_bytes (scales) each.
struct KvBlockCopyParams {
  uint8_t* const* pools = nullptr;  // device array [num_layers * pools_per_layer] of pool bases
  int num_layers = 0;               // >= 1
  int pools_per_layer = 2;          // 2 (K, V) or 4 (8-bit KV: and their scales)
  int64_t value_bytes = 0;          // one block of a K or V pool, > 0
  int64_t scale_bytes = 0;          // one block of a scale pool: > 0 with 4 pools per layer, else 0
  int64_t pool_blocks = 0;          // blocks in each pool
  uint8_t* staging = nullptr;       // device [num_blocks][KvBlockCopySlotBytes]
  int num_blocks = 0;               // in [0, kKvBlockCopyMaxBlocks]
  int32_t blocks[kKvBlockCopyMaxBlocks] = {};  // each in [0, pool_blocks)
  bool to_staging = true;  // gather (pool -> staging), else scatter (staging -> pool)
};

/// Bytes of one slot: num_layers x 2 x (value_bytes + scale_bytes).
int64_t KvBlockCopySlotBytes(const KvBlockCopyParams& params);

/// InvalidArgument (naming the field and value) for a shape the kernel cannot run, or a block id
/// outside the pools (checked here, on the host: the kernel never reads or writes past them).
absl::Status CheckKvBlockCopyParams(const KvBlockCopyParams& params);

/// Asynchronous on `stream`, one thread block per (pool, block) piece, 16-byte accesses where
/// the piece's addresses and size allow; thread-safe (no state). FailedPrecondition without
/// CUDA.
absl::Status LaunchKvBlockCopy(const KvBlockCopyParams& params, cudaStream_t stream);

/// Which KV heads a pool-to-pool copy moves between pools of other tensor-parallel slices. A
/// part's block is `block_size` token rows, each of its pool's heads (a source row of
/// `src_heads`, a destination row of `dest_heads`, the same bytes per head); `count` heads from
/// head `src_first` of each source row land at head `dest_first` of the destination row. Unset
/// (count 0): whole blocks, both pools of the same heads.
struct KvHeadCopy {
  int block_size = 0;
  int src_heads = 0, dest_heads = 0;
  int src_first = 0, dest_first = 0, count = 0;
  bool whole() const { return count == 0; }
};

/// KV blocks from one paged pool straight into another (a pool-to-pool transfer,
/// model::KvCache::CopyBlocksFromPeer): block src_blocks[i] of every source part into block
/// dest_blocks[i] of the matching destination part, whole, or (`heads`) some KV heads of each
/// token row. The destination parts, in slot order as above (per layer K, V, then K scales,
/// V scales), hold value_bytes (K, V) or scale_bytes (scales) per block, the source parts as
/// much per head; a source part may be another process's memory mapped here through CUDA IPC,
/// on this GPU or a peer. The two pools do not overlap.
struct KvPoolCopyParams {
  const uint8_t* const* src_parts = nullptr;  // device array [num_layers * pools_per_layer]
  uint8_t* const* dest_parts = nullptr;       // device array [num_layers * pools_per_layer]
  int num_layers = 0;                         // >= 1
  int pools_per_layer = 2;                    // 2 (K, V) or 4 (8-bit KV: and their scales)
  int64_t value_bytes = 0;                    // one block of a K or V part, > 0
  int64_t scale_bytes = 0;       // one block of a scale part: > 0 with 4 pools per layer, else 0
  int64_t src_pool_blocks = 0;   // blocks in each source part
  int64_t dest_pool_blocks = 0;  // blocks in each destination part
  int num_blocks = 0;            // in [0, kKvBlockCopyMaxBlocks]
  int32_t src_blocks[kKvBlockCopyMaxBlocks] = {};   // each in [0, src_pool_blocks)
  int32_t dest_blocks[kKvBlockCopyMaxBlocks] = {};  // each in [0, dest_pool_blocks), distinct
  KvHeadCopy heads;                                 // unset: whole blocks
};

/// InvalidArgument (naming the field and value) for a shape the kernel cannot run, a block id
/// outside its pool, a destination block written twice, or heads outside either pool's rows
/// (checked here, on the host).
absl::Status CheckKvPoolCopyParams(const KvPoolCopyParams& params);

/// Bytes of one block of source part `part` (per layer K, V, K scales, V scales): the
/// destination's, or with `heads` set as much per head for the source's heads.
int64_t KvPoolCopySourceBytes(const KvPoolCopyParams& params, int part);

/// Asynchronous on `stream`, one thread block per (part, block) piece, 16-byte accesses where
/// the piece's addresses and size allow; thread-safe (no state). FailedPrecondition without
/// CUDA.
absl::Status LaunchKvPoolCopy(const KvPoolCopyParams& params, cudaStream_t stream);

/// The CPU reference of LaunchKvPoolCopy: the same copies, with src_parts and dest_parts host
/// arrays of host pointers; CheckKvPoolCopyParams' error, and nothing copied, for what the
/// launch refuses. Thread-safe.
absl::Status KvPoolCopyOnHost(const KvPoolCopyParams& params);

}  // namespace loom::kernels::cuda
