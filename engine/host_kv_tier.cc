#include "engine/host_kv_tier.h"

#include <algorithm>
#include <cstddef>
#include <limits>
#include <utility>

#include "common/check.h"

namespace loom::engine {

HostKvTier::HostKvTier(int64_t num_slots, int32_t block_size)
    : block_size_(block_size),
      entries_(static_cast<size_t>(std::max<int64_t>(num_slots, 0))),
      tokens_(entries_.size() * static_cast<size_t>(std::max(block_size, 1))) {
  LOOM_CHECK(num_slots >= 0 && num_slots <= std::numeric_limits<int32_t>::max());
  LOOM_CHECK(block_size >= 1);
}

void HostKvTier::LinkAtTail(int32_t slot) {
  Entry& entry = entries_[static_cast<size_t>(slot)];
  entry.prev = tail_;
  entry.next = kNone;
  if (tail_ == kNone) {
    head_ = slot;
  } else {
    entries_[static_cast<size_t>(tail_)].next = slot;
  }
  tail_ = slot;
}

void HostKvTier::Unlink(int32_t slot) {
  Entry& entry = entries_[static_cast<size_t>(slot)];
  if (entry.prev == kNone) {
    head_ = entry.next;
  } else {
    entries_[static_cast<size_t>(entry.prev)].next = entry.next;
  }
  if (entry.next == kNone) {
    tail_ = entry.prev;
  } else {
    entries_[static_cast<size_t>(entry.next)].prev = entry.prev;
  }
  entry.prev = entry.next = kNone;
}

int32_t HostKvTier::TakeSlot() {
  if (!free_slots_.empty()) {
    const int32_t slot = free_slots_.back();
    free_slots_.pop_back();
    return slot;
  }
  // Slots still held across a Forget are passed over (freed later, they join free_slots_).
  while (next_never_used_ < num_slots() && Busy(next_never_used_)) ++next_never_used_;
  if (next_never_used_ < num_slots()) return next_never_used_++;
  for (int32_t slot = head_; slot != kNone; slot = entries_[static_cast<size_t>(slot)].next) {
    Entry& entry = entries_[static_cast<size_t>(slot)];
    if (Busy(slot)) continue;
    Unlink(slot);
    by_hash_.erase(entry.hash);
    if (record_events_) events_.push_back({KvCacheEvent::Kind::kRemoved, entry.hash});
    entry.used = false;
    return slot;
  }
  return kNone;
}

void HostKvTier::Describe(int32_t slot, const EvictedBlock& content) {
  Entry& entry = entries_[static_cast<size_t>(slot)];
  entry.used = true;
  entry.hash = content.hash;
  entry.content_id = content.content_id;
  entry.parent_id = content.parent_id;
  entry.salt = content.parent_id == 0 ? std::string(content.salt) : std::string();
  std::copy(content.tokens.begin(), content.tokens.end(),
            tokens_.begin() + static_cast<std::ptrdiff_t>(slot) * block_size_);
}

void HostKvTier::Store(int32_t slot, const EvictedBlock& evicted) {
  Describe(slot, evicted);
  copies_.push_back({true, evicted.block, slot});
  entries_[static_cast<size_t>(slot)].copy_plan = copy_plans_taken_ + 1;
  ++num_demoted_;
}

int32_t HostKvTier::Demote(const EvictedBlock& evicted) {
  LOOM_CHECK(evicted.tokens.size() == static_cast<size_t>(block_size_));
  if (num_slots() == 0) return kNone;
  auto it = by_hash_.find(evicted.hash);
  if (it != by_hash_.end()) {
    const int32_t slot = it->second;
    Entry& entry = entries_[static_cast<size_t>(slot)];
    Unlink(slot);
    LinkAtTail(slot);
    // The same content (it was reloaded from here): the slot holds it already.
    if (entry.content_id == evicted.content_id) return slot;
    // Another content under the hash (recomputed, so named anew; or a collision): the
    // newest copy replaces it, unless a reload or a fetch being planned reads the slot.
    if (Busy(slot)) {
      ++num_dropped_;
      return kNone;
    }
    Store(slot, evicted);
    return slot;
  }
  const int32_t slot = TakeSlot();
  if (slot == kNone) {
    ++num_dropped_;
    return kNone;
  }
  Store(slot, evicted);
  by_hash_[evicted.hash] = slot;
  if (record_events_) events_.push_back({KvCacheEvent::Kind::kStored, evicted.hash});
  LinkAtTail(slot);
  return slot;
}

void HostKvTier::SetHolds(Entry& entry, int32_t holds) {
  num_held_ += (holds > 0 ? 1 : 0) - (entry.holds > 0 ? 1 : 0);
  entry.holds = holds;
}

void HostKvTier::Hold(int32_t slot) {
  Entry& entry = entries_[static_cast<size_t>(slot)];
  SetHolds(entry, entry.holds + 1);
}

void HostKvTier::Release(int32_t slot) {
  Entry& entry = entries_[static_cast<size_t>(slot)];
  if (entry.holds == 0) return;
  SetHolds(entry, entry.holds - 1);
  // A slot whose content a Forget dropped while it was held: free now.
  if (entry.holds == 0 && !entry.used) Free(slot);
}

void HostKvTier::Free(int32_t slot) {
  // Slots at or past next_never_used_ are still ahead of TakeSlot's scan: listing them
  // would hand them out twice.
  if (slot < next_never_used_) free_slots_.push_back(slot);
}

std::vector<int32_t> HostKvTier::Reserve(int64_t count, uint64_t* last_copy_plan) {
  std::vector<int32_t> slots;
  if (last_copy_plan != nullptr) *last_copy_plan = 0;
  while (static_cast<int64_t>(slots.size()) < count) {
    const int32_t slot = TakeSlot();
    if (slot == kNone) break;
    Entry& entry = entries_[static_cast<size_t>(slot)];
    SetHolds(entry, 1);
    // Least recently used slots were mostly copied long ago: plans since have run.
    if (last_copy_plan != nullptr) {
      *last_copy_plan = std::max({*last_copy_plan, entry.copy_plan, fence_plan_});
    }
    slots.push_back(slot);
  }
  return slots;
}

std::vector<int32_t> HostKvTier::ReserveSlots(absl::Span<const int32_t> slots) {
  std::vector<int32_t> reserved;
  for (const int32_t slot : slots) {
    if (slot < next_never_used_ || slot >= num_slots()) continue;
    Entry& entry = entries_[static_cast<size_t>(slot)];
    SetHolds(entry, entry.holds + 1);  // TakeSlot's scan passes it over
    reserved.push_back(slot);
  }
  return reserved;
}

bool HostKvTier::StoreFetched(int32_t slot, const EvictedBlock& content) {
  Entry& entry = entries_[static_cast<size_t>(slot)];
  LOOM_CHECK(!entry.used && entry.holds > 0);
  if (by_hash_.contains(content.hash)) {
    FreeReserved(slot);
    return false;
  }
  Describe(slot, content);
  SetHolds(entry, 0);
  by_hash_[content.hash] = slot;
  if (record_events_) events_.push_back({KvCacheEvent::Kind::kStored, content.hash});
  LinkAtTail(slot);
  return true;
}

void HostKvTier::FreeReserved(int32_t slot) {
  Entry& entry = entries_[static_cast<size_t>(slot)];
  LOOM_CHECK(!entry.used);
  SetHolds(entry, 0);
  Free(slot);
}

void HostKvTier::LoadReserved(int32_t slot, int32_t device_block) {
  LOOM_CHECK(reserved(slot));
  copies_.push_back({false, device_block, slot});
  entries_[static_cast<size_t>(slot)].copy_plan = copy_plans_taken_ + 1;
  ++num_promoted_;
  FreeReserved(slot);
}

std::vector<KvCacheEvent> HostKvTier::TakeEvents() {
  std::vector<KvCacheEvent> events;
  events.swap(events_);
  return events;
}

std::optional<HostKvTier::Hit> HostKvTier::Find(const BlockHash& hash,
                                                absl::Span<const int32_t> tokens,
                                                uint64_t parent_id,
                                                std::string_view cache_salt) const {
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return std::nullopt;
  const int32_t slot = it->second;
  const Entry& entry = entries_[static_cast<size_t>(slot)];
  const bool holds = entry.parent_id == parent_id && (parent_id != 0 || entry.salt == cache_salt) &&
                     std::equal(tokens.begin(), tokens.end(),
                                tokens_.begin() + static_cast<std::ptrdiff_t>(slot) * block_size_);
  if (!holds) {
    ++num_verification_failures_;
    return std::nullopt;
  }
  return Hit{slot, entry.content_id};
}

HostKvTier::Content HostKvTier::Promote(int32_t slot, int32_t device_block) {
  Entry& entry = entries_[static_cast<size_t>(slot)];
  LOOM_CHECK(entry.used);
  Unlink(slot);
  LinkAtTail(slot);
  copies_.push_back({false, device_block, slot});
  entry.copy_plan = copy_plans_taken_ + 1;
  ++num_promoted_;
  return Content{entry.hash,
                 absl::MakeConstSpan(tokens_).subspan(static_cast<size_t>(slot) * block_size_,
                                                      static_cast<size_t>(block_size_)),
                 entry.content_id, entry.parent_id, entry.salt};
}

void HostKvTier::CloseHold(uint64_t hold_id, absl::Span<const int32_t> slots) {
  closed_holds_.push_back(hold_id);
  for (const int32_t slot : slots) {
    entries_[static_cast<size_t>(slot)].copy_plan = copy_plans_taken_ + 1;
  }
}

void HostKvTier::CloseEarlierHolds(absl::Span<const uint64_t> hold_ids) {
  if (hold_ids.empty()) return;
  closed_holds_.insert(closed_holds_.end(), hold_ids.begin(), hold_ids.end());
  fence_plan_ = copy_plans_taken_ + 1;
}

std::vector<uint64_t> HostKvTier::TakeClosedHolds() {
  std::vector<uint64_t> closed;
  closed.swap(closed_holds_);
  return closed;
}

std::vector<KvCopy> HostKvTier::TakeCopies() {
  std::vector<KvCopy> copies;
  copies.swap(copies_);
  ++copy_plans_taken_;
  return copies;
}

void HostKvTier::Forget() {
  if (record_events_) {
    for (const auto& [hash, slot] : by_hash_)
      events_.push_back({KvCacheEvent::Kind::kRemoved, hash});
  }
  by_hash_.clear();
  for (Entry& entry : entries_) {
    // Plans in flight may still copy; a held slot may still be read by another worker or
    // written by a transfer: it stays held (without content) until its holder lets it go.
    const uint64_t copy_plan = entry.copy_plan;
    const int32_t holds = entry.holds;
    entry = Entry{};
    entry.copy_plan = copy_plan;
    entry.holds = holds;
  }
  next_never_used_ = 0;
  free_slots_.clear();
  ++generation_;
  head_ = tail_ = kNone;
  copies_.clear();
}

}  // namespace loom::engine
