#include "engine/block_manager.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/check.h"

namespace loom::engine {

BlockManager::BlockManager(int64_t num_blocks, int32_t block_size)
    : block_size_(block_size),
      ref_counts_(static_cast<size_t>(num_blocks < 0 ? 0 : num_blocks), 0),
      prev_(ref_counts_.size(), kNone),
      next_(ref_counts_.size(), kNone),
      hashes_(ref_counts_.size()),
      has_hash_(ref_counts_.size(), false),
      tokens_(ref_counts_.size() * static_cast<size_t>(block_size < 1 ? 0 : block_size)),
      content_id_(ref_counts_.size(), 0),
      parent_id_(ref_counts_.size(), 0),
      salts_(ref_counts_.size()) {
  // Block ids travel as int32 on the wire; the caller validated the pool size.
  LOOM_CHECK(num_blocks >= 0 && num_blocks <= std::numeric_limits<int32_t>::max());
  LOOM_CHECK(block_size >= 1);
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
  content_id_[static_cast<size_t>(block)] = 0;
  salts_[static_cast<size_t>(block)].clear();
  if (record_events_) events_.push_back({KvCacheEvent::Kind::kRemoved, hash});
}

int32_t BlockManager::TakeFreeBlock() {
  if (next_never_used_ < num_blocks()) {
    return static_cast<int32_t>(next_never_used_++);
  }
  LOOM_CHECK(num_freed_ > 0);
  const int32_t block = free_head_;
  Unlink(block);
  // Its old contents are about to be overwritten: it leaves the cache (a tier below may
  // keep a copy).
  const size_t b = static_cast<size_t>(block);
  if (on_evict_ && has_hash_[b]) on_evict_(Content(block));
  Unregister(block);
  content_id_[static_cast<size_t>(block)] = 0;  // an uncached copy's shared id, if any
  return block;
}

absl::StatusOr<std::vector<int32_t>> BlockManager::Allocate(int64_t count) {
  if (count < 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot allocate ", count, " KV blocks"));
  }
  if (count > num_free()) {
    return absl::ResourceExhaustedError(absl::StrCat("need ", count, " KV blocks, ", num_free(),
                                                     " of ", num_blocks(), " are free"));
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

bool BlockManager::HoldsContent(int32_t block, absl::Span<const int32_t> tokens, uint64_t parent_id,
                                std::string_view cache_salt) const {
  const size_t b = static_cast<size_t>(block);
  if (parent_id_[b] != parent_id) return false;
  if (parent_id == 0 && salts_[b] != cache_salt) return false;
  return std::equal(
      tokens.begin(), tokens.end(),
      tokens_.begin() + static_cast<std::ptrdiff_t>(b * static_cast<size_t>(block_size_)));
}

BlockManager::PrefixMatch BlockManager::MatchPrefix(absl::Span<const BlockHash> hashes,
                                                    absl::Span<const int32_t> tokens,
                                                    std::string_view cache_salt) const {
  LOOM_CHECK(tokens.size() >= hashes.size() * static_cast<size_t>(block_size_));
  PrefixMatch match;
  uint64_t parent_id = 0;
  for (size_t i = 0; i < hashes.size(); ++i) {
    auto it = cached_.find(hashes[i]);
    if (it == cached_.end()) break;
    const int32_t block = it->second;
    const size_t first_token = i * static_cast<size_t>(block_size_);
    if (!HoldsContent(block, tokens.subspan(first_token, static_cast<size_t>(block_size_)),
                      parent_id, cache_salt)) {
      ++num_verification_failures_;
      break;
    }
    parent_id = content_id_[static_cast<size_t>(block)];
    match.last_content_id = parent_id;
    ++match.num_blocks;
    if (ref_counts_[static_cast<size_t>(block)] == 0) ++match.num_free_blocks;
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

bool BlockManager::RegisterBlock(int32_t block, const BlockHash& hash,
                                 absl::Span<const int32_t> tokens, int32_t parent_block,
                                 std::string_view cache_salt) {
  LOOM_CHECK(block >= 0 && block < num_blocks());
  LOOM_CHECK(parent_block == kNoParent || (parent_block >= 0 && parent_block < num_blocks()));
  LOOM_CHECK(tokens.size() == static_cast<size_t>(block_size_));
  const size_t b = static_cast<size_t>(block);
  if (has_hash_[b]) return false;
  const uint64_t parent_id =
      parent_block == kNoParent ? 0 : content_id_[static_cast<size_t>(parent_block)];
  // A parent whose content is unknown cannot be named, so no later request could be
  // verified to share it: the chain is not cached from here on.
  if (parent_block != kNoParent && parent_id == 0) return false;
  auto [it, inserted] = cached_.try_emplace(hash, block);
  if (!inserted) {
    if (HoldsContent(it->second, tokens, parent_id, cache_salt)) {
      // Same content as the cached copy: `block` can stand for it as a parent.
      content_id_[b] = content_id_[static_cast<size_t>(it->second)];
    } else {
      ++num_verification_failures_;
    }
    return false;
  }
  Record(block, hash, tokens, next_content_id_++, parent_id, cache_salt);
  return true;
}

void BlockManager::Record(int32_t block, const BlockHash& hash, absl::Span<const int32_t> tokens,
                          uint64_t content_id, uint64_t parent_id, std::string_view cache_salt) {
  const size_t b = static_cast<size_t>(block);
  hashes_[b] = hash;
  has_hash_[b] = true;
  content_id_[b] = content_id;
  parent_id_[b] = parent_id;
  if (parent_id == 0) salts_[b] = std::string(cache_salt);
  std::copy(tokens.begin(), tokens.end(),
            tokens_.begin() + static_cast<std::ptrdiff_t>(b * static_cast<size_t>(block_size_)));
  if (record_events_) events_.push_back({KvCacheEvent::Kind::kStored, hash});
}

EvictedBlock BlockManager::Content(int32_t block) const {
  const size_t b = static_cast<size_t>(block);
  LOOM_CHECK(block >= 0 && block < num_blocks() && has_hash_[b]);
  return EvictedBlock{block,
                      hashes_[b],
                      absl::MakeConstSpan(tokens_).subspan(b * static_cast<size_t>(block_size_),
                                                           static_cast<size_t>(block_size_)),
                      content_id_[b],
                      parent_id_[b],
                      salts_[b]};
}

bool BlockManager::RestoreBlock(int32_t block, const BlockHash& hash,
                                absl::Span<const int32_t> tokens, uint64_t content_id,
                                uint64_t parent_id, std::string_view cache_salt) {
  LOOM_CHECK(block >= 0 && block < num_blocks());
  LOOM_CHECK(tokens.size() == static_cast<size_t>(block_size_));
  LOOM_CHECK(content_id > 0 && content_id < next_content_id_);  // named by this manager
  const size_t b = static_cast<size_t>(block);
  if (has_hash_[b] || ref_counts_[b] == 0) return false;
  if (!cached_.try_emplace(hash, block).second) return false;
  Record(block, hash, tokens, content_id, parent_id, cache_salt);
  return true;
}

int64_t BlockManager::AdoptCachedBlocks(absl::Span<const AdoptedBlock> blocks) {
  if (next_never_used_ != 0 || num_freed_ != 0 || !cached_.empty()) return 0;
  std::vector<int32_t> adopted;
  for (const AdoptedBlock& report : blocks) {
    const int32_t block = report.block;
    if (block < 0 || block >= num_blocks() || has_hash_[static_cast<size_t>(block)] ||
        report.tokens.size() != static_cast<size_t>(block_size_)) {
      continue;
    }
    uint64_t parent_id = 0;
    if (report.parent_block != kNoParent) {
      if (report.parent_block < 0 || report.parent_block >= num_blocks() ||
          content_id_[static_cast<size_t>(report.parent_block)] == 0) {
        continue;
      }
      parent_id = content_id_[static_cast<size_t>(report.parent_block)];
    }
    if (auto [it, inserted] = cached_.try_emplace(report.hash, block); !inserted) {
      // A second copy of cached content (a sequence recomputed a block it could not take
      // from the cache): it stays uncached but can be its children's parent, as in
      // RegisterBlock.
      if (content_id_[static_cast<size_t>(block)] == 0 &&
          HoldsContent(it->second, report.tokens, parent_id, report.salt)) {
        content_id_[static_cast<size_t>(block)] = content_id_[static_cast<size_t>(it->second)];
      }
      continue;
    }
    Record(block, report.hash, report.tokens, next_content_id_++, parent_id, report.salt);
    adopted.push_back(block);
  }
  if (adopted.empty()) return 0;
  // Every block has been used now: the unadopted ones first (lowest id first), then the
  // adopted ones, the first listed (the worker's most recently used) last.
  next_never_used_ = num_blocks();
  for (int32_t block = 0; block < num_blocks(); ++block) {
    if (!has_hash_[static_cast<size_t>(block)]) LinkAtTail(block);
  }
  for (auto it = adopted.rbegin(); it != adopted.rend(); ++it) LinkAtTail(*it);
  return static_cast<int64_t>(adopted.size());
}

void BlockManager::ForgetCachedBlocks() {
  for (int32_t block = 0; block < num_blocks(); ++block) {
    Unregister(block);
    content_id_[static_cast<size_t>(block)] = 0;  // in-use copies' shared ids too
  }
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

}  // namespace loom::engine
