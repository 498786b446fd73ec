#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/block_hash.h"

namespace loom::engine {

/// A change to the set of cached blocks a replica holds, for the cluster's KV index.
struct KvCacheEvent {
  enum class Kind { kStored, kRemoved };
  Kind kind = Kind::kStored;
  BlockHash hash;
};

/// What a cached block held when the pool evicted it (BlockManager's eviction callback):
/// its hash and the content identity that verifies a later hit (see BlockManager), for a
/// tier below the pool (engine/host_kv_tier) to keep. The views live for the call only.
struct EvictedBlock {
  int32_t block = -1;
  BlockHash hash;
  absl::Span<const int32_t> tokens;
  uint64_t content_id = 0;
  uint64_t parent_id = 0;  // 0: a chain's first block, salted with `salt`
  std::string_view salt;
};

/// A cached block a worker still holds when a coordinator takes it over (a failover or a
/// reconnect), for BlockManager::AdoptCachedBlocks: its content and the block before it
/// in its chain (kNoParent: the chain's first, computed with `salt`).
struct AdoptedBlock {
  int32_t block = -1;
  int32_t parent_block = -1;
  BlockHash hash;  // hashed by this process from the chain's tokens and salt
  std::vector<int32_t> tokens;
  std::string salt;
};

/// The KV block table of one replica: which physical blocks of the workers' pools are in
/// use, with reference counts so that sequences can share blocks, and the prefix cache:
/// full blocks whose K/V are computed can be registered under their BlockHash, and a
/// registered block stays findable after its last reference drops until it is evicted.
///
/// A hash only finds a candidate; a hit is verified against what the block holds: its
/// token ids, its parent (the block before it in the chain that computed it, by content
/// identity) and, for a chain's first block, the cache salt. So a hash collision,
/// accidental or crafted, is a cache miss and never serves another request's K/V.
///
/// Block ids are [0, num_blocks); block b means the same slot range on every rank of the
/// replica. Allocation takes never-used blocks first (lowest id first), then free blocks
/// least recently freed first; taking a registered free block evicts it from the cache.
/// Not thread-safe: owned by the replica's scheduler.
class BlockManager {
 public:
  /// A pool of `num_blocks` blocks of `block_size` (>= 1) tokens each.
  BlockManager(int64_t num_blocks, int32_t block_size);

  /// RegisterBlock's parent for the first block of a chain.
  static constexpr int32_t kNoParent = -1;

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
  /// and how many of those blocks are free (taking them lowers num_free()). `tokens` are
  /// the sequence's tokens (at least hashes.size() * block_size) and `cache_salt` its
  /// salt: a block found by hash counts only when it holds exactly those tokens, after
  /// the block matched before it (or, first, with that salt); otherwise the chain stops
  /// there and num_verification_failures() grows.
  struct PrefixMatch {
    int64_t num_blocks = 0;
    int64_t num_free_blocks = 0;
    // The content identity of the last matched block (0 when none matched): the parent a
    // lower tier's continuation of the chain must have been computed after.
    uint64_t last_content_id = 0;
  };
  PrefixMatch MatchPrefix(absl::Span<const BlockHash> hashes, absl::Span<const int32_t> tokens,
                          std::string_view cache_salt) const;
  /// Takes a reference on the blocks of the first `count` hashes, which MatchPrefix must
  /// have found (a free one leaves the free list: it is revived, not evicted). Returns
  /// their ids in order.
  std::vector<int32_t> TakeCachedPrefix(absl::Span<const BlockHash> hashes, int64_t count);
  /// Registers `block` (in use, its K/V computed) as holding `hash`: the K/V of
  /// `tokens` (block_size of them), computed after `parent_block` (in use; kNoParent for
  /// a chain's first block, then salted with `cache_salt`). Returns false and caches
  /// nothing when `block` holds a hash already, when `parent_block`'s content is unknown
  /// (it was not cached: its own registration failed), or when another block holds that
  /// hash (two sequences computed the same content: the first copy stays the cached one,
  /// and `block` may still be the parent of a later block; or a collision: counted in
  /// num_verification_failures()).
  bool RegisterBlock(int32_t block, const BlockHash& hash, absl::Span<const int32_t> tokens,
                     int32_t parent_block, std::string_view cache_salt);
  /// Registers `block` (in use, just allocated) as holding content restored from a lower
  /// tier: the content identity it had when it was evicted (EvictedBlock), so chains
  /// continue across the tiers. False (nothing cached) when `block` holds a hash already or
  /// another block holds `hash`.
  bool RestoreBlock(int32_t block, const BlockHash& hash, absl::Span<const int32_t> tokens,
                    uint64_t content_id, uint64_t parent_id, std::string_view cache_salt);
  /// On a pool that has handed out no block yet: registers each block as cached and free
  /// (the blocks a worker reports holding, parents before children). A block out of
  /// range, reported twice, with the wrong number of tokens, whose parent was not adopted
  /// before it, or whose hash is held already is skipped (a second copy of the same
  /// content still counts as its children's parent, as in RegisterBlock). Every other block becomes
  /// free and uncached, handed out before the adopted ones; the adopted ones are evicted last
  /// first-listed last. Returns how many were adopted (kStored events for each); 0 and
  /// nothing changed when the pool has been used.
  int64_t AdoptCachedBlocks(absl::Span<const AdoptedBlock> blocks);
  /// A content id never used before, for content that enters from outside the pool (a
  /// block fetched from another replica into the host tier).
  uint64_t NewContentId() { return next_content_id_++; }
  /// The block holding `hash` (in use or free); -1 when none.
  int32_t cached_block(const BlockHash& hash) const {
    auto it = cached_.find(hash);
    return it == cached_.end() ? -1 : it->second;
  }
  /// What cached `block` holds, as an eviction would hand it over (its views live until
  /// the block manager changes).
  EvictedBlock Content(int32_t block) const;
  /// Whether some block holds `hash` (in use or free).
  bool holds_hash(const BlockHash& hash) const { return cached_.contains(hash); }
  /// Called with each cached block the pool evicts to hand it out again, before its
  /// contents are overwritten (a host tier demotes it). Not called by ForgetCachedBlocks.
  void set_eviction_callback(std::function<void(const EvictedBlock&)> callback) {
    on_evict_ = std::move(callback);
  }
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
  /// Blocks found by hash whose contents did not match (hash collisions), so far.
  int64_t num_verification_failures() const { return num_verification_failures_; }
  /// Tokens per block.
  int32_t block_size() const { return block_size_; }
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
  // Registers `block` (whose hash slot is empty) as holding `hash` with that content
  // identity (the cached_ entry is the caller's).
  void Record(int32_t block, const BlockHash& hash, absl::Span<const int32_t> tokens,
              uint64_t content_id, uint64_t parent_id, std::string_view cache_salt);
  // Whether cached `block` holds `tokens` after the content `parent_id` (0: a chain's
  // first block, salted with `cache_salt`).
  bool HoldsContent(int32_t block, absl::Span<const int32_t> tokens, uint64_t parent_id,
                    std::string_view cache_salt) const;

  const int32_t block_size_;

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
  // What a registered block holds, for verifying hits. content_id_[b] names b's content:
  // a number never reused (next_content_id_ counts up), given at registration; a block in
  // use whose registration found an equal cached copy shares that copy's id (so it can be
  // a parent); 0 for a block whose content is unknown. parent_id_[b] is the content id of
  // the block before b (0 for a first block, whose salt is in salts_[b]).
  std::vector<int32_t> tokens_;       // [num_blocks * block_size]; where has_hash_
  std::vector<uint64_t> content_id_;  // [num_blocks]
  std::vector<uint64_t> parent_id_;   // [num_blocks]; where has_hash_
  std::vector<std::string> salts_;    // [num_blocks]; where has_hash_ and parent_id_ == 0
  uint64_t next_content_id_ = 1;
  mutable int64_t num_verification_failures_ = 0;
  bool record_events_ = false;
  std::vector<KvCacheEvent> events_;
  std::function<void(const EvictedBlock&)> on_evict_;
};

}  // namespace loom::engine
