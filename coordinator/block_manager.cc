#include "coordinator/block_manager.h"

#include <cstdint>
#include <limits>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/check.h"

namespace loom::coordinator {

BlockManager::BlockManager(int64_t num_blocks)
    : ref_counts_(static_cast<size_t>(num_blocks < 0 ? 0 : num_blocks), 0),
      freed_ring_(ref_counts_.size(), 0) {
  // Block ids travel as int32 on the wire; the caller validated the pool size.
  LOOM_CHECK(num_blocks >= 0 && num_blocks <= std::numeric_limits<int32_t>::max());
}

int32_t BlockManager::TakeFreeBlock() {
  if (next_never_used_ < num_blocks()) {
    return static_cast<int32_t>(next_never_used_++);
  }
  LOOM_CHECK(num_freed_ > 0);
  const int32_t block = freed_ring_[static_cast<size_t>(freed_head_)];
  freed_head_ = (freed_head_ + 1) % num_blocks();
  --num_freed_;
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
    if (--ref_count == 0) {
      // The ring holds at most every block once, so this slot is always vacant.
      LOOM_CHECK(num_freed_ < num_blocks());
      const int64_t tail = (freed_head_ + num_freed_) % num_blocks();
      freed_ring_[static_cast<size_t>(tail)] = block;
      ++num_freed_;
    }
  }
  return absl::OkStatus();
}

double BlockManager::usage() const {
  if (num_blocks() == 0) return 0.0;
  return static_cast<double>(num_blocks() - num_free()) / static_cast<double>(num_blocks());
}

int32_t BlockManager::ref_count(int32_t block) const {
  LOOM_CHECK(block >= 0 && block < num_blocks());
  return ref_counts_[static_cast<size_t>(block)];
}

}  // namespace loom::coordinator
