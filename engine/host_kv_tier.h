#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"
#include "engine/block_hash.h"
#include "engine/block_manager.h"

namespace loom::engine {

/// One copy for the worker to run before a plan's forward pass (loom.v1.KvBlockCopy).
struct KvCopy {
  bool to_host = true;  // pool block -> host slot (offload); false: reload
  int32_t device_block = 0;
  int32_t host_slot = 0;
};

/// The coordinator's table of one replica's host KV tier (the workers' host memory,
/// worker/kv_host_tier; vLLM's CPU offloading, SGLang's HiCache host layer): which cached
/// block content sits in which of `num_slots` slots, least recently used first.
///
/// A cached block the device pool evicts is demoted: it takes a slot (a never-used one,
/// else the least recently used unheld one, whose content is dropped) and a device-to-
/// host copy is queued; content the tier holds already is only marked used. A prefix that
/// continues in the tier (Find, by hash, verified like BlockManager's hits: the tokens,
/// the parent's content identity, the salt of a chain's first block) is reloaded into a
/// freshly allocated pool block (Promote: a host-to-device copy); the slot keeps its copy
/// (the tier is inclusive), so a block evicted again costs no second copy.
///
/// Copies are queued in the order the table changed and the worker runs them in that
/// order before the plan's forward pass, so a slot reloaded and then reused, or a pool
/// block offloaded and then overwritten by a reload, read what they held.
/// Not thread-safe: owned by the replica's scheduler.
class HostKvTier {
 public:
  HostKvTier(int64_t num_slots, int32_t block_size);

  /// A verified content in the tier.
  struct Hit {
    int32_t slot = -1;
    uint64_t content_id = 0;
  };

  /// BlockManager's eviction callback: keeps `evicted` in a slot (queueing its copy).
  /// When every slot is held the content is dropped (num_dropped()). Also how a block
  /// still in the pool is copied out for another replica to fetch. Returns the slot, or
  /// -1 when dropped.
  int32_t Demote(const EvictedBlock& evicted);
  /// The slot holding `hash` as `tokens` (block_size of them) computed after the content
  /// `parent_id` (0: a chain's first block, salted with `cache_salt`). A hash found with
  /// other content is a miss (num_verification_failures()).
  std::optional<Hit> Find(const BlockHash& hash, absl::Span<const int32_t> tokens,
                          uint64_t parent_id, std::string_view cache_salt) const;
  /// Holds `slot` (counted: several readers may hold it) so it is neither reused nor
  /// replaced until Release: a reload being planned, another worker reading it, or this
  /// one writing it (fetches between replicas, coordinator/replica_kv_fetch).
  void Hold(int32_t slot);
  void Release(int32_t slot);
  /// Up to `count` slots for blocks fetched from elsewhere, held and empty (the least
  /// recently used contents are dropped for them). `*last_copy_plan`, if given, is the
  /// latest copy_plans_taken() number (0: none) whose copies touch one of them: an
  /// offload into or a reload out of such a slot may still be in that plan, or queued for
  /// it, so the slots may be written only once it ran.
  std::vector<int32_t> Reserve(int64_t count, uint64_t* last_copy_plan = nullptr);
  /// Holds these very slots empty (reserved, as Reserve's) where TakeSlot has not reached
  /// them yet (any slot of a new table): a slot named again is held once more (Release
  /// drops one hold, the slot is free after the last); returns those it held. For a table
  /// that starts over while transfers of the one before may still touch the workers' slots
  /// (the replica lost a worker whose process lives on: two readers of one slot each hold it).
  std::vector<int32_t> ReserveSlots(absl::Span<const int32_t> slots);
  /// Reserved `slot` received `content`'s bytes: the tier holds it now (no copy is
  /// queued) and the slot is released. False (the slot is freed instead) when the tier
  /// holds `content.hash` already.
  bool StoreFetched(int32_t slot, const EvictedBlock& content);
  /// Whether `slot` is reserved (held and empty).
  bool reserved(int32_t slot) const {
    const Entry& entry = entries_[static_cast<size_t>(slot)];
    return !entry.used && entry.holds > 0;
  }
  /// Reserved `slot` received a block no hash names (a hand-off's partial last block,
  /// written by another worker): queues its copy into `device_block` and frees the slot (a
  /// later Reserve of it waits for the plan that carries this copy).
  void LoadReserved(int32_t slot, int32_t device_block);
  /// Reserved `slot` received nothing usable: freed.
  void FreeReserved(int32_t slot);
  /// A push hold (reserved slots other workers write into, named `hold_id` to them) ended
  /// while a writer may still send into its `slots` (a stream its writer gave up on, a
  /// prefill worker that lost its coordinator). The next plan closes `hold_id` on the
  /// workers before its copies (TakeClosedHolds), and a reservation of any of the slots
  /// waits for that plan to have run (Reserve's last_copy_plan), so no late write lands
  /// in a slot given to other content. Call it when the slots are given back.
  void CloseHold(uint64_t hold_id, absl::Span<const int32_t> slots);
  /// The holds closed since the last call, for the plan TakeCopies was just called for.
  std::vector<uint64_t> TakeClosedHolds();
  bool has_closed_holds() const { return !closed_holds_.empty(); }
  /// The holds closed and not taken by a plan yet.
  absl::Span<const uint64_t> closed_holds() const { return closed_holds_; }
  /// A new table over the tier of a worker whose process may live on: holds of the table
  /// before it that a write may still come for (`hold_ids`) are closed by the next plan,
  /// and no reservation writes any slot before that plan ran (Reserve's last_copy_plan).
  void CloseEarlierHolds(absl::Span<const uint64_t> hold_ids);
  /// Bumped by Forget: what a hold or reservation of an earlier generation expected in its
  /// slots is gone (nothing is committed from it); the slots stay held until released.
  uint64_t generation() const { return generation_; }
  /// Copies are queued for the next plan.
  bool has_copies() const { return !copies_.empty(); }
  /// TakeCopies calls so far: the copies queued now go to plan copy_plans_taken() + 1.
  uint64_t copy_plans_taken() const { return copy_plans_taken_; }

  /// Queues the reload of `slot` into `device_block` and marks it used. What the slot
  /// holds, for BlockManager::RestoreBlock:
  struct Content {
    BlockHash hash;
    absl::Span<const int32_t> tokens;
    uint64_t content_id = 0;
    uint64_t parent_id = 0;
    std::string_view salt;
  };
  Content Promote(int32_t slot, int32_t device_block);

  /// Whether the tier holds content under `hash`.
  bool holds_hash(const BlockHash& hash) const { return by_hash_.contains(hash); }
  /// Records kStored / kRemoved as hashes enter and leave the tier (for the cluster's
  /// KvIndex, merged with the pool's by Scheduler::TakeKvEvents).
  void set_record_events(bool record) { record_events_ = record; }
  std::vector<KvCacheEvent> TakeEvents();

  /// The copies queued since the last call, in order.
  std::vector<KvCopy> TakeCopies();
  /// Forgets every content (a failed step: what its copies left cannot be trusted) and
  /// drops the queued copies. Held slots stay held, without content, until released: a
  /// transfer into or out of one (another worker's read, a fetch, a push) may still run.
  void Forget();

  int64_t num_slots() const { return static_cast<int64_t>(entries_.size()); }
  int64_t num_used() const { return static_cast<int64_t>(by_hash_.size()); }
  /// Slots held now (Hold, Reserve): read by other workers, or waiting for a transfer.
  int64_t num_held() const { return num_held_; }
  uint64_t num_demoted() const { return num_demoted_; }
  uint64_t num_promoted() const { return num_promoted_; }
  uint64_t num_dropped() const { return num_dropped_; }
  uint64_t num_verification_failures() const { return num_verification_failures_; }

 private:
  static constexpr int32_t kNone = -1;
  struct Entry;
  void SetHolds(Entry& entry, int32_t holds);  // keeps num_held_
  struct Entry {
    bool used = false;
    int32_t holds = 0;  // Hold() count
    BlockHash hash;
    uint64_t content_id = 0;
    uint64_t parent_id = 0;
    std::string salt;
    uint64_t copy_plan = 0;  // the TakeCopies number of the slot's latest copy (0: none)
    int32_t prev = kNone;  // LRU list: head least recently used
    int32_t next = kNone;
  };
  void LinkAtTail(int32_t slot);
  void Unlink(int32_t slot);
  // A slot for new content: never used, else the least recently used unheld one (its
  // content forgotten); kNone when every slot is held.
  int32_t TakeSlot();
  void Store(int32_t slot, const EvictedBlock& evicted);
  void Describe(int32_t slot, const EvictedBlock& content);
  void Free(int32_t slot);  // unheld and without content: to free_slots_ if TakeSlot passed it
  bool Busy(int32_t slot) const {
    const Entry& entry = entries_[static_cast<size_t>(slot)];
    return entry.holds > 0;
  }

  const int32_t block_size_;
  std::vector<Entry> entries_;   // [num_slots]
  std::vector<int32_t> tokens_;  // [num_slots * block_size]
  absl::flat_hash_map<BlockHash, int32_t> by_hash_;
  int32_t next_never_used_ = 0;
  std::vector<int32_t> free_slots_;  // reserved slots given back
  uint64_t generation_ = 0;
  int32_t head_ = kNone;
  int32_t tail_ = kNone;
  std::vector<KvCopy> copies_;
  bool record_events_ = false;
  std::vector<KvCacheEvent> events_;
  uint64_t num_demoted_ = 0;
  uint64_t num_promoted_ = 0;
  uint64_t num_dropped_ = 0;
  int64_t num_held_ = 0;
  std::vector<uint64_t> closed_holds_;  // for the next plan
  uint64_t fence_plan_ = 0;             // CloseEarlierHolds: every reservation waits for this plan
  uint64_t copy_plans_taken_ = 0;
  mutable uint64_t num_verification_failures_ = 0;
};

}  // namespace loom::engine
