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

  int64_t num_blocks() const { return static_cast<int64_t>(ref_counts_.size()); }
  int64_t num_free() const { return static_cast<int64_t>(free_blocks_.size()); }
  /// Fraction of blocks in use, [0, 1].
  double usage() const;
  int32_t ref_count(int32_t block) const;

 private:
  std::vector<int32_t> ref_counts_;   // [num_blocks]; 0 exactly for blocks in free_blocks_
  std::vector<int32_t> free_blocks_;  // stack, the next block to hand out at the back
};

}  // namespace loom::coordinator
