#pragma once

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "coordinator/block_hash.h"

namespace loom::coordinator {

/// A change to the set of cached blocks a replica holds, for the cluster's KV index.
struct KvCacheEvent {
  enum class Kind { kStored, kRemoved };
  Kind kind = Kind::kStored;
  BlockHash hash;
};

/// The KV block table of one replica: which physical blocks of the workers' pools are in
/// use, with reference counts so that sequences can share blocks, and the prefix cache:
/// full blocks whose K/V are computed can be registered under their BlockHash, and a
/// registered block stays findable after its last reference drops until it is evicted.
///
/// Block ids are [0, num_blocks); block b means the same slot range on every rank of the
/// replica. Allocation takes never-used blocks first (lowest id first), then free blocks
/// least recently freed first; taking a registered free block evicts it from the cache.
/// Not thread-safe: owned by the replica's scheduler.
class BlockManager {
 public:
  explicit BlockManager(int64_t num_blocks);

  /// `count` blocks, each with reference count 1; ResourceExhausted (nothing taken) when
  /// fewer than `count` are free. Cached free blocks taken are evicted (kRemoved events).
  absl::StatusOr<std::vector<int32_t>> Allocate(int64_t count);
  /// Adds a reference to each block (a second sequence shares them). FailedPrecondition
  /// for a block that is free or out of range (nothing changed).
  absl::Status AddReference(absl::Span<const int32_t> blocks);
  /// Drops one reference from each block, in the order given; blocks that reach zero
  /// become free (a registered block stays cached, at the most-recently-freed end).
  /// FailedPrecondition for a free or out-of-range block (a bug in the caller; the blocks
  /// before it were released).
  absl::Status Free(absl::Span<const int32_t> blocks);

  /// How many leading hashes of `hashes` are cached (a chain stops at the first miss),
  /// and how many of those blocks are free (taking them lowers num_free()).
  struct PrefixMatch {
    int64_t num_blocks = 0;
    int64_t num_free_blocks = 0;
  };
  PrefixMatch MatchPrefix(absl::Span<const BlockHash> hashes) const;
  /// Takes a reference on the blocks of the first `count` hashes, which MatchPrefix must
  /// have found (a free one leaves the free list: it is revived, not evicted). Returns
  /// their ids in order.
  std::vector<int32_t> TakeCachedPrefix(absl::Span<const BlockHash> hashes, int64_t count);
  /// Registers `block` (in use, its K/V computed) as holding `hash`. Returns false and
  /// changes nothing when another block already holds that hash (two sequences computed
  /// the same content; the first copy stays the cached one) or `block` holds one already.
  bool RegisterBlock(int32_t block, const BlockHash& hash);
  /// Un-registers every cached block (their contents can no longer be trusted), emitting
  /// kRemoved for each. Blocks in use stay allocated.
  void ForgetCachedBlocks();

  /// Events are recorded only when enabled (the replica forwards them to the KV index).
  void set_record_events(bool record) { record_events_ = record; }
  /// The events recorded since the last call, oldest first.
  std::vector<KvCacheEvent> TakeEvents();

  /// Size of the pool, in blocks.
  int64_t num_blocks() const { return static_cast<int64_t>(ref_counts_.size()); }
  /// Blocks Allocate can hand out now (never-used plus freed, cached or not).
  int64_t num_free() const { return (num_blocks() - next_never_used_) + num_freed_; }
  /// Registered blocks, in use or free.
  int64_t num_cached() const { return static_cast<int64_t>(cached_.size()); }
  /// Fraction of blocks in use, [0, 1].
  double usage() const;
  /// References held on `block`, 0 when it is free; `block` must be in [0, num_blocks).
  int32_t ref_count(int32_t block) const;
  /// Whether `block` is registered in the prefix cache; `block` must be in range.
  bool is_cached(int32_t block) const;
  /// The free blocks that were used before, least recently freed first (tests, debug).
  std::vector<int32_t> FreeListForTesting() const;

 private:
  static constexpr int32_t kNone = -1;

  // Takes one block from the pools: never-used first, then the least recently freed
  // (evicting its cache entry).
  int32_t TakeFreeBlock();
  void LinkAtTail(int32_t block);
  void Unlink(int32_t block);
  void Unregister(int32_t block);

  std::vector<int32_t> ref_counts_;  // [num_blocks]; 0 exactly for the free blocks
  // Blocks [next_never_used_, num_blocks) have never been handed out; they go first,
  // lowest id first.
  int64_t next_never_used_ = 0;
  // Blocks freed after use, as a doubly linked list in freeing order (head: least recently
  // freed, handed out first). A list rather than a ring because a cache hit revives a
  // block from the middle. Links are kNone at the ends and for blocks not in the list.
  std::vector<int32_t> prev_;  // [num_blocks]
  std::vector<int32_t> next_;  // [num_blocks]
  int32_t free_head_ = kNone;
  int32_t free_tail_ = kNone;
  int64_t num_freed_ = 0;  // blocks in the list

  // The prefix cache: hash -> block, and its inverse. A block is in cached_ exactly when
  // has_hash_[block]; a registered free block is in the free list.
  absl::flat_hash_map<BlockHash, int32_t> cached_;
  std::vector<BlockHash> hashes_;  // [num_blocks]; meaningful where has_hash_
  std::vector<bool> has_hash_;     // [num_blocks]
  bool record_events_ = false;
  std::vector<KvCacheEvent> events_;
};

}  // namespace loom::coordinator
