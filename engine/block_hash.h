#pragma once

#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/types/span.h"

namespace loom::engine {

/// The identity of a full KV block's contents: a 128-bit chained hash of every token from
/// the start of the sequence up to the end of the block, plus the extra keys (model
/// fingerprint, cache salt) that change K/V. Two blocks with equal hashes hold the same
/// K/V (up to a 2^-128-scale accidental collision; see block_hash.cc).
struct BlockHash {
  uint64_t hi = 0;
  uint64_t lo = 0;

  friend bool operator==(const BlockHash& a, const BlockHash& b) {
    return a.hi == b.hi && a.lo == b.lo;
  }
  friend bool operator!=(const BlockHash& a, const BlockHash& b) { return !(a == b); }
  template <typename H>
  friend H AbslHashValue(H state, const BlockHash& hash) {
    return H::combine(std::move(state), hash.hi, hash.lo);
  }
};

/// The root of every chain: hashes this process's secret (see ProcessHashSecret) and the
/// extra keys, so that two models, or two tenants with different cache salts, never share
/// a block. The same inputs give the same seed within one process, and a different one in
/// another process: hashes must never be compared across processes. Thread-safe.
BlockHash PrefixHashSeed(std::string_view model_fingerprint, std::string_view cache_salt);

/// PrefixHashSeed with an explicit secret in place of the process's (tests: pinned values).
BlockHash PrefixHashSeedWithSecret(const BlockHash& secret, std::string_view model_fingerprint,
                                   std::string_view cache_salt);

/// 128 random bits drawn once per process (std::random_device) on first use, that seed
/// every chain: a client cannot compute, and so cannot aim a collision at, any block's
/// hash. Thread-safe.
const BlockHash& ProcessHashSecret();

/// hash(parent, tokens of one block): `parent` is the previous block's hash, or the seed
/// for the first block. A fixed function of its inputs. Thread-safe.
BlockHash HashBlock(const BlockHash& parent, absl::Span<const int32_t> block_tokens);

/// Test only: while on, HashBlock ignores the token values (it hashes only the parent and
/// the block's length), so every two blocks at the same position of equally long chains
/// collide. The prefix cache must then still serve every request correctly, because a hit
/// is verified against the block's stored tokens (BlockManager). Thread-safe.
void SetBlockHashCollisionsForTesting(bool on);

/// Appends to `hashes` the hashes of the full blocks of `tokens` that it does not hold yet
/// (blocks [hashes->size(), min(max_blocks, tokens.size() / block_size))), chaining from
/// the last one held or from `seed`. Tokens past the last full block are not hashed.
void ExtendBlockHashes(const BlockHash& seed, absl::Span<const int32_t> tokens, int32_t block_size,
                       int64_t max_blocks, std::vector<BlockHash>* hashes);

/// The hashes of every full block of `tokens`, first block first.
std::vector<BlockHash> HashFullBlocks(const BlockHash& seed, absl::Span<const int32_t> tokens,
                                      int32_t block_size);

}  // namespace loom::engine
