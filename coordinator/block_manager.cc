#include "coordinator/block_manager.h"

#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/check.h"

namespace loom::coordinator {

BlockManager::BlockManager(int64_t num_blocks)
    : ref_counts_(static_cast<size_t>(num_blocks < 0 ? 0 : num_blocks), 0),
      prev_(ref_counts_.size(), kNone),
      next_(ref_counts_.size(), kNone),
      hashes_(ref_counts_.size()),
      has_hash_(ref_counts_.size(), false) {
  // Block ids travel as int32 on the wire; the caller validated the pool size.
  LOOM_CHECK(num_blocks >= 0 && num_blocks <= std::numeric_limits<int32_t>::max());
}

void BlockManager::LinkAtTail(int32_t block) {
  prev_[static_cast<size_t>(block)] = free_tail_;
  next_[static_cast<size_t>(block)] = kNone;
  if (free_tail_ == kNone) {
    free_head_ = block;
  } else {
    next_[static_cast<size_t>(free_tail_)] = block;
  }
  free_tail_ = block;
  ++num_freed_;
}

void BlockManager::Unlink(int32_t block) {
  const int32_t prev = prev_[static_cast<size_t>(block)];
  const int32_t next = next_[static_cast<size_t>(block)];
  if (prev == kNone) {
    LOOM_CHECK(free_head_ == block);
    free_head_ = next;
  } else {
    next_[static_cast<size_t>(prev)] = next;
  }
  if (next == kNone) {
    LOOM_CHECK(free_tail_ == block);
    free_tail_ = prev;
  } else {
    prev_[static_cast<size_t>(next)] = prev;
  }
  prev_[static_cast<size_t>(block)] = kNone;
  next_[static_cast<size_t>(block)] = kNone;
  --num_freed_;
}

void BlockManager::Unregister(int32_t block) {
  if (!has_hash_[static_cast<size_t>(block)]) return;
  const BlockHash hash = hashes_[static_cast<size_t>(block)];
  cached_.erase(hash);
  has_hash_[static_cast<size_t>(block)] = false;
  if (record_events_) events_.push_back({KvCacheEvent::Kind::kRemoved, hash});
}

int32_t BlockManager::TakeFreeBlock() {
  if (next_never_used_ < num_blocks()) {
    return static_cast<int32_t>(next_never_used_++);
  }
  LOOM_CHECK(num_freed_ > 0);
  const int32_t block = free_head_;
  Unlink(block);
  // Its old contents are about to be overwritten: it leaves the cache.
  Unregister(block);
  return block;
}

absl::StatusOr<std::vector<int32_t>> BlockManager::Allocate(int64_t count) {
  if (count < 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot allocate ", count, " KV blocks"));
  }
  if (count > num_free()) {
    return absl::ResourceExhaustedError(absl::StrCat("need ", count, " KV blocks, ",
                                                     num_free(), " of ", num_blocks(),
                                                     " are free"));
  }
  std::vector<int32_t> blocks;
  blocks.reserve(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    const int32_t block = TakeFreeBlock();
    LOOM_CHECK(ref_counts_[static_cast<size_t>(block)] == 0);
    ref_counts_[static_cast<size_t>(block)] = 1;
    blocks.push_back(block);
  }
  return blocks;
}

absl::Status BlockManager::AddReference(absl::Span<const int32_t> blocks) {
  // Validate everything first so that a bad block leaves every count untouched.
  for (const int32_t block : blocks) {
    if (block < 0 || block >= num_blocks()) {
      return absl::FailedPreconditionError(
          absl::StrCat("KV block ", block, " is out of range [0, ", num_blocks(), ")"));
    }
    if (ref_counts_[static_cast<size_t>(block)] == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot share KV block ", block, ": it is free"));
    }
  }
  for (const int32_t block : blocks) ++ref_counts_[static_cast<size_t>(block)];
  return absl::OkStatus();
}

absl::Status BlockManager::Free(absl::Span<const int32_t> blocks) {
  for (const int32_t block : blocks) {
    if (block < 0 || block >= num_blocks()) {
      return absl::FailedPreconditionError(
          absl::StrCat("KV block ", block, " is out of range [0, ", num_blocks(), ")"));
    }
    int32_t& ref_count = ref_counts_[static_cast<size_t>(block)];
    if (ref_count == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot free KV block ", block, ": it is already free"));
    }
    if (--ref_count == 0) LinkAtTail(block);
  }
  return absl::OkStatus();
}

BlockManager::PrefixMatch BlockManager::MatchPrefix(absl::Span<const BlockHash> hashes) const {
  PrefixMatch match;
  for (const BlockHash& hash : hashes) {
    auto it = cached_.find(hash);
    if (it == cached_.end()) break;
    ++match.num_blocks;
    if (ref_counts_[static_cast<size_t>(it->second)] == 0) ++match.num_free_blocks;
  }
  return match;
}

std::vector<int32_t> BlockManager::TakeCachedPrefix(absl::Span<const BlockHash> hashes,
                                                    int64_t count) {
  LOOM_CHECK(count >= 0 && count <= static_cast<int64_t>(hashes.size()));
  std::vector<int32_t> blocks;
  blocks.reserve(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    auto it = cached_.find(hashes[static_cast<size_t>(i)]);
    LOOM_CHECK(it != cached_.end());  // the caller matched it and nothing ran since
    const int32_t block = it->second;
    int32_t& ref_count = ref_counts_[static_cast<size_t>(block)];
    if (ref_count == 0) Unlink(block);  // revived: no longer an eviction candidate
    ++ref_count;
    blocks.push_back(block);
  }
  return blocks;
}

bool BlockManager::RegisterBlock(int32_t block, const BlockHash& hash) {
  LOOM_CHECK(block >= 0 && block < num_blocks());
  if (has_hash_[static_cast<size_t>(block)]) return false;
  if (!cached_.try_emplace(hash, block).second) return false;
  hashes_[static_cast<size_t>(block)] = hash;
  has_hash_[static_cast<size_t>(block)] = true;
  if (record_events_) events_.push_back({KvCacheEvent::Kind::kStored, hash});
  return true;
}

void BlockManager::ForgetCachedBlocks() {
  for (int32_t block = 0; block < num_blocks(); ++block) Unregister(block);
}

std::vector<KvCacheEvent> BlockManager::TakeEvents() {
  std::vector<KvCacheEvent> events;
  events.swap(events_);
  return events;
}

double BlockManager::usage() const {
  if (num_blocks() == 0) return 0.0;
  return static_cast<double>(num_blocks() - num_free()) / static_cast<double>(num_blocks());
}

int32_t BlockManager::ref_count(int32_t block) const {
  LOOM_CHECK(block >= 0 && block < num_blocks());
  return ref_counts_[static_cast<size_t>(block)];
}

bool BlockManager::is_cached(int32_t block) const {
  LOOM_CHECK(block >= 0 && block < num_blocks());
  return has_hash_[static_cast<size_t>(block)];
}

std::vector<int32_t> BlockManager::FreeListForTesting() const {
  std::vector<int32_t> blocks;
  for (int32_t block = free_head_; block != kNone; block = next_[static_cast<size_t>(block)]) {
    blocks.push_back(block);
  }
  return blocks;
}

}  // namespace loom::coordinator
