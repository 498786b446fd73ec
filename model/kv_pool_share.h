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

/// KvCache::CopyBlocksFromPeer's checks, for every device: one source per destination block,
/// each in its pool, no destination twice, and `peer`'s parts sized as this pool's
/// (`own_block_bytes`, one per part).
absl::Status CheckPeerCopy(const PeerKvPool& peer, absl::Span<const int64_t> own_block_bytes,
                           int64_t own_num_blocks, absl::Span<const int32_t> src_blocks,
                           absl::Span<const int32_t> dest_blocks);

}  // namespace loom::model
