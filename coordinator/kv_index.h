#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "engine/block_hash.h"
#include "engine/block_manager.h"

namespace loom::coordinator {

/// The cluster-wide KV index: which replicas hold a cached block with a given hash. Each
/// replica's loop publishes its block manager's stored/removed events here after every
/// scheduling round; the router asks how long a prompt's cached prefix is on each replica.
/// It may trail a replica by one round (a block evicted a moment ago still shows), which
/// only costs a misjudged placement, never a wrong result: the replica's own block manager
/// decides what is reused. Thread-safe.
class KvIndex {
 public:
  KvIndex() = default;
  KvIndex(const KvIndex&) = delete;
  KvIndex& operator=(const KvIndex&) = delete;

  /// Applies one replica's events, in order.
  void Apply(const std::string& replica_id, absl::Span<const engine::KvCacheEvent> events);
  /// Forgets everything `replica_id` held (its worker was lost; its cache is gone).
  void RemoveReplica(const std::string& replica_id);
  /// For each of `replica_ids`, how many leading hashes of `block_hashes` it holds (a
  /// chain stops at its first miss), in the order of `replica_ids`.
  std::vector<int64_t> MatchPrefix(absl::Span<const engine::BlockHash> block_hashes,
                                   absl::Span<const std::string> replica_ids) const;
  /// Blocks `replica_id` holds (tests, stats).
  int64_t NumBlocks(const std::string& replica_id) const;

 private:
  // A small dense id per replica, so that an entry is a bit set (up to 64 replicas, the
  // most this index tracks; SlotLocked answers -1 past that).
  int SlotLocked(const std::string& replica_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int FindSlotLocked(const std::string& replica_id) const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::vector<std::string> slots_ ABSL_GUARDED_BY(mu_);  // slot -> replica id
  // hash -> bit set of the slots holding it; an entry with no bit set is erased.
  absl::flat_hash_map<engine::BlockHash, uint64_t> holders_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> num_blocks_ ABSL_GUARDED_BY(mu_);  // [slot]
};

}  // namespace loom::coordinator
