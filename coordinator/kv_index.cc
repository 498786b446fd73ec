#include "coordinator/kv_index.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/types/span.h"

namespace loom::coordinator {
namespace {

constexpr int kMaxSlots = 64;

}  // namespace

int KvIndex::FindSlotLocked(const std::string& replica_id) const {
  for (size_t slot = 0; slot < slots_.size(); ++slot) {
    if (slots_[slot] == replica_id) return static_cast<int>(slot);
  }
  return -1;
}

int KvIndex::SlotLocked(const std::string& replica_id) {
  const int found = FindSlotLocked(replica_id);
  if (found >= 0) return found;
  if (static_cast<int>(slots_.size()) >= kMaxSlots) return -1;
  slots_.push_back(replica_id);
  num_blocks_.push_back(0);
  return static_cast<int>(slots_.size()) - 1;
}

void KvIndex::Apply(const std::string& replica_id, absl::Span<const engine::KvCacheEvent> events) {
  if (events.empty()) return;
  absl::MutexLock lock(&mu_);
  const int slot = SlotLocked(replica_id);
  // Past 64 replicas the extra ones are simply not indexed: they are placed by load only.
  if (slot < 0) return;
  const uint64_t bit = uint64_t{1} << slot;
  for (const engine::KvCacheEvent& event : events) {
    if (event.kind == engine::KvCacheEvent::Kind::kStored) {
      uint64_t& holders = holders_[event.hash];
      if ((holders & bit) == 0) ++num_blocks_[static_cast<size_t>(slot)];
      holders |= bit;
    } else {
      auto it = holders_.find(event.hash);
      if (it == holders_.end() || (it->second & bit) == 0) continue;
      --num_blocks_[static_cast<size_t>(slot)];
      it->second &= ~bit;
      if (it->second == 0) holders_.erase(it);
    }
  }
}

void KvIndex::RemoveReplica(const std::string& replica_id) {
  absl::MutexLock lock(&mu_);
  const int slot = FindSlotLocked(replica_id);
  if (slot < 0 || num_blocks_[static_cast<size_t>(slot)] == 0) return;
  const uint64_t bit = uint64_t{1} << slot;
  for (auto it = holders_.begin(); it != holders_.end();) {
    it->second &= ~bit;
    if (it->second == 0) {
      holders_.erase(it++);
    } else {
      ++it;
    }
  }
  num_blocks_[static_cast<size_t>(slot)] = 0;
}

std::vector<int64_t> KvIndex::MatchPrefix(absl::Span<const engine::BlockHash> block_hashes,
                                          absl::Span<const std::string> replica_ids) const {
  std::vector<int64_t> matched(replica_ids.size(), 0);
  absl::MutexLock lock(&mu_);
  // Which replicas (as slot bits) are still matching, and where each one's bit is.
  uint64_t alive = 0;
  std::vector<int> slots(replica_ids.size(), -1);
  for (size_t i = 0; i < replica_ids.size(); ++i) {
    slots[i] = FindSlotLocked(replica_ids[i]);
    if (slots[i] >= 0) alive |= uint64_t{1} << slots[i];
  }
  for (size_t b = 0; b < block_hashes.size() && alive != 0; ++b) {
    auto it = holders_.find(block_hashes[b]);
    alive &= it == holders_.end() ? 0 : it->second;
    for (size_t i = 0; i < replica_ids.size(); ++i) {
      if (slots[i] >= 0 && (alive >> slots[i] & 1) != 0) matched[i] = static_cast<int64_t>(b) + 1;
    }
  }
  return matched;
}

int64_t KvIndex::NumBlocks(const std::string& replica_id) const {
  absl::MutexLock lock(&mu_);
  const int slot = FindSlotLocked(replica_id);
  return slot < 0 ? 0 : num_blocks_[static_cast<size_t>(slot)];
}

}  // namespace loom::coordinator
