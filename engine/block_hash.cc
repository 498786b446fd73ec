#include "engine/block_hash.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <random>
#include <string_view>
#include <vector>

#include "absl/types/span.h"

// Why a fast 128-bit hash, with a per-process secret and verification, is enough.
//
// A collision would make a request reuse K/V computed for different tokens: wrong output,
// and across tenants a leak (GHSA-rm76-4mrf-v9r8 in vLLM). Two defences, each enough alone:
// * The hash is never trusted for correctness. A prefix-cache hit is verified by the block
//   manager against the block's stored token ids, its parent block and (for the first
//   block) the cache salt, so a collision, accidental or crafted, is only a cache miss.
//   The cost is one compare of block_size ints per hit (bench/prefix_hash_bench.cc
//   measures it against a prefill step).
// * Every chain is seeded with 128 random bits drawn once per process, so a client cannot
//   compute any block's hash and has nothing to aim a collision at; accidentally, with N
//   blocks alive, two lanes of bijective mixers collide with probability ~N^2 / 2^129.
// The hash decides routing (the cluster's KV index) and lookup only; all hashing happens
// in the one coordinator process, which is why a per-process secret is possible: no hash
// is persisted, put on the wire or compared across processes.

namespace loom::engine {
namespace {

// Two different 64-bit finalizers (both bijections with full avalanche): murmur3's fmix64
// and the "moremur" variant's constants. Different constants make the lanes independent.
uint64_t MixLaneA(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

uint64_t MixLaneB(uint64_t x) {
  x ^= x >> 27;
  x *= 0x3c79ac492ba7b653ULL;
  x ^= x >> 33;
  x *= 0x1c69b3f74ac4ae35ULL;
  x ^= x >> 27;
  return x;
}

// Absorbs one 64-bit word into both lanes. Each lane offsets the word by its own odd
// multiplier before the mixer, so a word that cancels one lane's state does not cancel
// the other's.
void Absorb(BlockHash& state, uint64_t word) {
  state.hi = MixLaneA(state.hi ^ (word * 0x9e3779b97f4a7c15ULL + 0x632be59bd9b4e019ULL));
  state.lo = MixLaneB(state.lo ^ (word * 0xd6e8feb86659fd93ULL + 0x8cb92ba72f3d8dd7ULL));
}

std::atomic<bool> g_colliding_hashes{false};

}  // namespace

const BlockHash& ProcessHashSecret() {
  static const BlockHash secret = [] {
    std::random_device device;
    auto draw64 = [&device] {
      return (static_cast<uint64_t>(device()) << 32) ^ static_cast<uint64_t>(device());
    };
    BlockHash drawn;
    drawn.hi = draw64();
    drawn.lo = draw64();
    return drawn;
  }();
  return secret;
}

void SetBlockHashCollisionsForTesting(bool on) { g_colliding_hashes.store(on); }

BlockHash PrefixHashSeed(std::string_view model_fingerprint, std::string_view cache_salt) {
  return PrefixHashSeedWithSecret(ProcessHashSecret(), model_fingerprint, cache_salt);
}

BlockHash PrefixHashSeedWithSecret(const BlockHash& secret, std::string_view model_fingerprint,
                                   std::string_view cache_salt) {
  BlockHash state{0x243f6a8885a308d3ULL, 0x13198a2e03707344ULL};  // digits of pi
  Absorb(state, secret.hi);
  Absorb(state, secret.lo);
  // Each key is absorbed with its length first, so ("ab", "c") and ("a", "bc") differ.
  for (std::string_view key : {model_fingerprint, cache_salt}) {
    Absorb(state, key.size());
    for (size_t i = 0; i < key.size(); i += 8) {
      uint64_t word = 0;
      std::memcpy(&word, key.data() + i, std::min<size_t>(8, key.size() - i));
      Absorb(state, word);
    }
  }
  return state;
}

BlockHash HashBlock(const BlockHash& parent, absl::Span<const int32_t> block_tokens) {
  BlockHash state = parent;
  Absorb(state, block_tokens.size());
  // Two tokens per word. The packing is explicit (not memcpy) so the hash is the same on
  // every byte order.
  const size_t hashed_tokens =
      g_colliding_hashes.load(std::memory_order_relaxed) ? 0 : block_tokens.size();
  for (size_t i = 0; i < hashed_tokens; i += 2) {
    uint64_t word = static_cast<uint32_t>(block_tokens[i]);
    if (i + 1 < block_tokens.size()) {
      word |= static_cast<uint64_t>(static_cast<uint32_t>(block_tokens[i + 1])) << 32;
    }
    Absorb(state, word);
  }
  // A final round with the lanes crossed, so each half depends on both.
  const uint64_t hi = state.hi, lo = state.lo;
  state.hi = MixLaneA(hi ^ MixLaneB(lo));
  state.lo = MixLaneB(lo ^ MixLaneA(hi + 0x9e3779b97f4a7c15ULL));
  return state;
}

void ExtendBlockHashes(const BlockHash& seed, absl::Span<const int32_t> tokens, int32_t block_size,
                       int64_t max_blocks, std::vector<BlockHash>* hashes) {
  const int64_t full_blocks =
      std::min<int64_t>(max_blocks, static_cast<int64_t>(tokens.size()) / block_size);
  for (int64_t b = static_cast<int64_t>(hashes->size()); b < full_blocks; ++b) {
    const BlockHash& parent = b == 0 ? seed : (*hashes)[static_cast<size_t>(b - 1)];
    hashes->push_back(HashBlock(parent, tokens.subspan(static_cast<size_t>(b * block_size),
                                                       static_cast<size_t>(block_size))));
  }
}

std::vector<BlockHash> HashFullBlocks(const BlockHash& seed, absl::Span<const int32_t> tokens,
                                      int32_t block_size) {
  std::vector<BlockHash> hashes;
  hashes.reserve(tokens.size() / static_cast<size_t>(block_size));
  ExtendBlockHashes(seed, tokens, block_size, static_cast<int64_t>(tokens.size()), &hashes);
  return hashes;
}

}  // namespace loom::engine
