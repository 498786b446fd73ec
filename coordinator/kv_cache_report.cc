#include "coordinator/kv_cache_report.h"

#include <algorithm>
#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "engine/block_hash.h"

namespace loom::coordinator {
namespace {

bool SameContent(const loom::v1::CachedKvBlock& a, const loom::v1::CachedKvBlock& b) {
  return a.parent() == b.parent() && a.cache_salt() == b.cache_salt() &&
         std::equal(a.token_ids().begin(), a.token_ids().end(), b.token_ids().begin(),
                    b.token_ids().end());
}

}  // namespace

std::vector<engine::AdoptedBlock> AdoptableBlocks(
    absl::Span<const loom::v1::RegisterRequest* const> ranks, std::string_view model_fingerprint,
    int32_t block_size) {
  std::vector<engine::AdoptedBlock> adopted;
  if (ranks.empty() || ranks[0] == nullptr) return adopted;
  // The other ranks' reports, by block.
  std::vector<absl::flat_hash_map<int32_t, const loom::v1::CachedKvBlock*>> others;
  for (size_t r = 1; r < ranks.size(); ++r) {
    auto& by_block = others.emplace_back();
    for (const loom::v1::CachedKvBlock& block : ranks[r]->cached_kv_blocks()) {
      by_block.emplace(block.block(), &block);
    }
  }
  absl::flat_hash_map<int32_t, engine::BlockHash> hashed;  // adopted so far
  for (const loom::v1::CachedKvBlock& block : ranks[0]->cached_kv_blocks()) {
    if (block.token_ids_size() != block_size || hashed.contains(block.block())) continue;
    const bool everywhere =
        std::all_of(others.begin(), others.end(), [&block](const auto& by_block) {
          auto it = by_block.find(block.block());
          return it != by_block.end() && SameContent(*it->second, block);
        });
    if (!everywhere) continue;
    engine::BlockHash parent_hash;
    if (block.parent() == engine::BlockManager::kNoParent) {
      parent_hash = engine::PrefixHashSeed(model_fingerprint, block.cache_salt());
    } else if (auto it = hashed.find(block.parent()); it != hashed.end()) {
      parent_hash = it->second;
    } else {
      continue;  // its parent was left out, or comes after it
    }
    engine::AdoptedBlock& entry = adopted.emplace_back();
    entry.block = block.block();
    entry.parent_block = block.parent();
    entry.tokens.assign(block.token_ids().begin(), block.token_ids().end());
    entry.hash = engine::HashBlock(parent_hash, entry.tokens);
    if (block.parent() == engine::BlockManager::kNoParent) entry.salt = block.cache_salt();
    hashed.emplace(entry.block, entry.hash);
  }
  return adopted;
}

}  // namespace loom::coordinator
