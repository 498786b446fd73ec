#include "worker/kv_block_ledger.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/check.h"

namespace loom::worker {

KvBlockLedger::KvBlockLedger(int64_t num_blocks, int32_t block_size)
    : block_size_(block_size),
      tokens_(static_cast<size_t>(std::max<int64_t>(num_blocks, 0)) *
              static_cast<size_t>(std::max(block_size, 0))),
      generation_(static_cast<size_t>(std::max<int64_t>(num_blocks, 0)), 0),
      parent_(generation_.size(), kNoParent),
      parent_generation_(generation_.size(), 0),
      salt_(generation_.size(), -1),
      last_use_(generation_.size(), 0) {
  LOOM_CHECK(block_size >= 1);
  salts_.emplace_back();
  salt_index_.emplace("", 0);
}

void KvBlockLedger::Invalidate(int32_t block) {
  LOOM_CHECK(block >= 0 && block < num_blocks());
  const size_t b = static_cast<size_t>(block);
  ++generation_[b];
  if (salt_[b] >= 0) --num_recorded_;
  salt_[b] = -1;
}

void KvBlockLedger::Record(int32_t block, absl::Span<const int32_t> tokens, int32_t parent,
                           std::string_view cache_salt) {
  LOOM_CHECK(block >= 0 && block < num_blocks());
  LOOM_CHECK(parent == kNoParent || (parent >= 0 && parent < num_blocks() && parent != block));
  LOOM_CHECK(tokens.size() == static_cast<size_t>(block_size_));
  const size_t b = static_cast<size_t>(block);
  const auto first = tokens_.begin() + static_cast<std::ptrdiff_t>(b * tokens.size());
  const uint32_t parent_generation =
      parent == kNoParent ? 0 : generation_[static_cast<size_t>(parent)];
  const int32_t salt = parent == kNoParent ? SaltIndex(cache_salt) : 0;
  const bool same = recorded(block) && parent_[b] == parent &&
                    parent_generation_[b] == parent_generation && salt_[b] == salt &&
                    std::equal(tokens.begin(), tokens.end(), first);
  if (!same) {
    // Other content than recorded: what was computed after the old content is orphaned.
    if (recorded(block)) ++generation_[b];
    if (!recorded(block)) ++num_recorded_;
    std::copy(tokens.begin(), tokens.end(), first);
    parent_[b] = parent;
    parent_generation_[b] = parent_generation;
    salt_[b] = salt;
  }
  last_use_[b] = ++clock_;
}

int32_t KvBlockLedger::SaltIndex(std::string_view cache_salt) {
  if (auto it = salt_index_.find(absl::string_view(cache_salt.data(), cache_salt.size()));
      it != salt_index_.end())
    return it->second;
  // Salts are per tenant and can be many: past a bound, keep only those still recorded.
  if (salts_.size() > generation_.size() + 1024) {
    std::vector<std::string> kept{""};
    absl::flat_hash_map<std::string, int32_t> index{{"", 0}};
    for (int32_t& salt : salt_) {
      if (salt <= 0) continue;
      auto [it, inserted] =
          index.try_emplace(salts_[static_cast<size_t>(salt)], static_cast<int32_t>(kept.size()));
      if (inserted) kept.push_back(it->first);
      salt = it->second;
    }
    salts_ = std::move(kept);
    salt_index_ = std::move(index);
  }
  const auto index = static_cast<int32_t>(salts_.size());
  salts_.emplace_back(cache_salt);
  salt_index_.emplace(std::string(cache_salt), index);
  return index;
}

bool KvBlockLedger::Intact(int32_t block, std::vector<Chain>& chains) const {
  std::vector<int32_t> path;
  int32_t at = block;
  Chain verdict = Chain::kBroken;
  // Walk up until a block whose verdict is known, a chain's first block, or a break.
  while (true) {
    const size_t b = static_cast<size_t>(at);
    if (chains[b] == Chain::kIntact || chains[b] == Chain::kBroken) {
      verdict = chains[b];
      break;
    }
    if (chains[b] == Chain::kVisiting || !recorded(at)) break;  // a cycle, or unrecorded
    chains[b] = Chain::kVisiting;
    path.push_back(at);
    const int32_t parent = parent_[b];
    if (parent == kNoParent) {
      verdict = Chain::kIntact;
      break;
    }
    if (generation_[static_cast<size_t>(parent)] != parent_generation_[b]) break;
    at = parent;
  }
  for (int32_t on_path : path) chains[static_cast<size_t>(on_path)] = verdict;
  return verdict == Chain::kIntact;
}

void KvBlockLedger::Report(int64_t max_bytes,
                           google::protobuf::RepeatedPtrField<loom::v1::CachedKvBlock>* out) const {
  std::vector<Chain> chains(generation_.size(), Chain::kUnknown);
  std::vector<int32_t> intact;
  for (int32_t block = 0; block < num_blocks(); ++block) {
    if (recorded(block) && Intact(block, chains)) intact.push_back(block);
  }
  std::sort(intact.begin(), intact.end(), [this](int32_t a, int32_t b) {
    return last_use_[static_cast<size_t>(a)] > last_use_[static_cast<size_t>(b)];
  });
  std::vector<bool> sent(generation_.size(), false);
  std::vector<int32_t> ancestors;
  int64_t bytes = 0;
  for (int32_t block : intact) {
    // The block and its ancestors not sent yet, parents first.
    ancestors.clear();
    for (int32_t at = block; at != kNoParent && !sent[static_cast<size_t>(at)];
         at = parent_[static_cast<size_t>(at)]) {
      ancestors.push_back(at);
    }
    for (auto it = ancestors.rbegin(); it != ancestors.rend(); ++it) {
      const size_t b = static_cast<size_t>(*it);
      const std::string& salt = salts_[static_cast<size_t>(salt_[b])];
      bytes += 4 * static_cast<int64_t>(block_size_) + 16 + static_cast<int64_t>(salt.size());
      if (bytes > max_bytes) return;
      loom::v1::CachedKvBlock* reported = out->Add();
      reported->set_block(*it);
      reported->set_parent(parent_[b]);
      reported->mutable_token_ids()->Add(
          tokens_.begin() + static_cast<std::ptrdiff_t>(b * static_cast<size_t>(block_size_)),
          tokens_.begin() +
              static_cast<std::ptrdiff_t>((b + 1) * static_cast<size_t>(block_size_)));
      if (parent_[b] == kNoParent) reported->set_cache_salt(salt);
      sent[b] = true;
    }
  }
}

}  // namespace loom::worker
