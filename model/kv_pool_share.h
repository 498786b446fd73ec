#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace loom::model {

/// One region of a KV pool as another process reaches it: a layer's K, V, or (8-bit KV) K or
/// V scales, in the order a host-tier slot lays a block out (model::KvCache::SaveBlocks);
/// block b is `block_bytes` at `offset + b * block_bytes` of allocation `allocation`.
struct KvPoolPart {
  int32_t allocation = 0;
  int64_t offset = 0;
  int64_t block_bytes = 0;
};

/// How other processes of this machine read a KV pool's blocks directly (KvCache::Share): a
/// CPU pool lives in one memory file, a CUDA pool's allocations are exported through CUDA
/// IPC. Pool-to-pool transfers (worker/kv_pool_transfer) copy with it, one copy per block
/// and part, no host tier between.
struct KvPoolShare {
  enum class Kind { kHostFile, kCudaIpc };
  Kind kind = Kind::kHostFile;
  int fd = -1;  // kHostFile: the memory file (this process's descriptor)
  int64_t file_bytes = 0;
  std::vector<std::string> cuda_ipc_handles;  // kCudaIpc: one per allocation
  std::string cuda_device_uuid;               // the device they are on (16 bytes)
  std::vector<KvPoolPart> parts;
  int64_t num_blocks = 0;
};

/// Another process's KV pool as this one reaches it (KvCache::OpenPeer, or a mapping of its
/// memory file): each part's block 0 in this pool's address space (host memory for a CPU
/// pool, device memory for a CUDA one), kept valid while `keep` lives.
struct PeerKvPool {
  std::vector<const uint8_t*> bases;  // one per KvPoolShare::parts
  std::vector<int64_t> block_bytes;   // likewise
  int64_t num_blocks = 0;
  std::shared_ptr<const void> keep;
};

/// Which KV heads a pool-to-pool copy moves (KvCache::CopyBlocksFromPeer) between pools of
/// other tensor-parallel slices: every part's block is the pool's block_size token rows of its
/// KV heads (this pool's `dest_heads`, the source's `src_heads`, as many bytes a head in both);
/// heads [src_first, + count) of each source row land at [dest_first, + count) of the
/// destination's. Unset (count 0): whole blocks, both pools of the same heads.
struct PeerHeads {
  int64_t src_heads = 0, dest_heads = 0;
  int64_t src_first = 0, dest_first = 0, count = 0;
  bool whole() const { return count == 0; }
};

/// KvCache::CopyBlocksFromPeer's checks, for every device: one source per destination block,
/// each in its pool, no destination twice, and `peer`'s parts sized as this pool's
/// (`own_block_bytes`, one per part, blocks of `block_size` rows), or with `heads` as much per
/// head for the source's heads, the heads inside both pools' rows.
absl::Status CheckPeerCopy(const PeerKvPool& peer, absl::Span<const int64_t> own_block_bytes,
                           int64_t own_num_blocks, int64_t block_size,
                           absl::Span<const int32_t> src_blocks,
                           absl::Span<const int32_t> dest_blocks, const PeerHeads& heads);

}  // namespace loom::model
