#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"
#include "google/protobuf/repeated_ptr_field.h"
#include "loom/v1/worker.pb.h"

namespace loom::worker {

/// What each full block of the worker's KV pool holds: the tokens whose K/V it computed
/// and the block before it in the chain that computed them (or, for a chain's first block,
/// the request's cache salt). The coordinator owns the prefix cache; the worker keeps
/// this so that a coordinator that takes over (a failover, or the same one after a
/// reconnect) can adopt the blocks instead of starting cold (RegisterRequest.
/// cached_kv_blocks). A block stops counting when a step writes it (Invalidate); a block
/// whose parent was written since it was recorded is not reported (its K/V belong to a
/// prefix nothing can name any more).
/// Not thread-safe: owned by the step executor.
class KvBlockLedger {
 public:
  static constexpr int32_t kNoParent = -1;

  /// A pool of `num_blocks` blocks of `block_size` tokens.
  KvBlockLedger(int64_t num_blocks, int32_t block_size);

  /// A step is about to write `block` (its content changes).
  void Invalidate(int32_t block);
  /// `block` holds the K/V of `tokens` (block_size of them), computed after the current
  /// content of `parent` (kNoParent: a chain's first block, with `cache_salt`). Recording
  /// what a block already holds only marks it used.
  void Record(int32_t block, absl::Span<const int32_t> tokens, int32_t parent,
              std::string_view cache_salt);

  /// Appends the blocks whose whole chain is intact, parents before children, most
  /// recently used chains first, until about `max_bytes` of messages.
  void Report(int64_t max_bytes,
              google::protobuf::RepeatedPtrField<loom::v1::CachedKvBlock>* out) const;

  int64_t num_blocks() const { return static_cast<int64_t>(generation_.size()); }
  /// Blocks recorded and not written since (their chains may be broken).
  int64_t num_recorded() const { return num_recorded_; }

 private:
  enum class Chain : uint8_t { kUnknown, kVisiting, kIntact, kBroken };
  bool recorded(int32_t block) const { return salt_[static_cast<size_t>(block)] >= 0; }
  // Resolves whether `block`'s chain is intact, memoized in `chains` (iterative: chains are
  // as long as a context).
  bool Intact(int32_t block, std::vector<Chain>& chains) const;
  int32_t SaltIndex(std::string_view cache_salt);

  const int32_t block_size_;
  std::vector<int32_t> tokens_;              // [num_blocks * block_size]; where recorded
  std::vector<uint32_t> generation_;         // [num_blocks]; bumped whenever content changes
  std::vector<int32_t> parent_;              // [num_blocks]; kNoParent for a chain's first
  std::vector<uint32_t> parent_generation_;  // [num_blocks]; the parent's when recorded
  std::vector<int32_t> salt_;                // [num_blocks]; index into salts_, -1: not recorded
  std::vector<uint64_t> last_use_;           // [num_blocks]; a clock, for the report's order
  std::vector<std::string> salts_;           // interned cache salts ("" first)
  absl::flat_hash_map<std::string, int32_t> salt_index_;
  uint64_t clock_ = 0;
  int64_t num_recorded_ = 0;
};

}  // namespace loom::worker
