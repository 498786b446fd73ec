#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace loom::coordinator {

/// The KV block table of one replica: which physical blocks of the workers' pools are in
/// use, with reference counts so that sequences can share blocks (the prefix cache
/// builds on this). Block ids are [0, num_blocks); block b means the same slot range on
/// every rank of the replica. Allocation takes never-used blocks first, lowest id first.
/// Not thread-safe: owned by the replica's scheduler.
class BlockManager {
 public:
  explicit BlockManager(int64_t num_blocks);

  /// `count` blocks, each with reference count 1; ResourceExhausted (nothing taken) when
  /// fewer than `count` are free.
  absl::StatusOr<std::vector<int32_t>> Allocate(int64_t count);
  /// Adds a reference to each block (a second sequence shares them). FailedPrecondition
  /// for a block that is free or out of range (nothing changed).
  absl::Status AddReference(absl::Span<const int32_t> blocks);
  /// Drops one reference from each block, in the order given; blocks that reach zero
  /// become free. FailedPrecondition for a free or out-of-range block (a bug in the
  /// caller; the blocks before it were released).
  absl::Status Free(absl::Span<const int32_t> blocks);

  /// Size of the pool, in blocks.
  int64_t num_blocks() const { return static_cast<int64_t>(ref_counts_.size()); }
  /// Blocks Allocate can hand out now (never-used plus freed).
  int64_t num_free() const { return (num_blocks() - next_never_used_) + num_freed_; }
  /// Fraction of blocks in use, [0, 1].
  double usage() const;
  /// References held on `block`, 0 when it is free; `block` must be in [0, num_blocks).
  int32_t ref_count(int32_t block) const;

 private:
  // Takes one block from the pools: never-used first, then the least recently freed.
  int32_t TakeFreeBlock();

  std::vector<int32_t> ref_counts_;  // [num_blocks]; 0 exactly for the free blocks
  // Blocks [next_never_used_, num_blocks) have never been handed out; they go first,
  // lowest id first.
  int64_t next_never_used_ = 0;
  // Blocks freed after use, as a FIFO ring: the least recently freed is handed out first
  // (the prefix cache's LRU order). Capacity num_blocks, so it never reallocates.
  std::vector<int32_t> freed_ring_;  // [num_blocks]
  int64_t freed_head_ = 0;           // ring index of the least recently freed block
  int64_t num_freed_ = 0;            // blocks in the ring
};

}  // namespace loom::coordinator
