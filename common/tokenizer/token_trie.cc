#include "common/tokenizer/token_trie.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "common/tokenizer/tokenizer.h"

namespace loom::common {

TokenTrie::TokenTrie(std::vector<std::string> token_bytes, std::vector<int32_t> end_ids)
    : token_bytes_(std::move(token_bytes)), end_ids_(std::move(end_ids)) {
  std::sort(end_ids_.begin(), end_ids_.end());
  // Sorting the tokens by their bytes lays the trie out breadth-first per subtree range:
  // the children of a node are the distinct next bytes within its range.
  std::vector<int32_t> order;
  for (int32_t id = 0; id < vocab_size(); ++id) {
    if (!token_bytes_[id].empty() && !IsEnd(id)) order.push_back(id);
  }
  std::sort(order.begin(), order.end(), [this](int32_t a, int32_t b) {
    return token_bytes_[a] < token_bytes_[b] || (token_bytes_[a] == token_bytes_[b] && a < b);
  });
  struct Pending {
    int32_t node;
    size_t begin, end;  // range of `order` below this node
    size_t depth;
  };
  nodes_.push_back({});
  std::vector<Pending> queue = {{0, 0, order.size(), 0}};
  for (size_t q = 0; q < queue.size(); ++q) {
    const Pending p = queue[q];
    size_t i = p.begin;
    nodes_[p.node].first_token = static_cast<int32_t>(token_ids_.size());
    while (i < p.end && token_bytes_[order[i]].size() == p.depth) {
      token_ids_.push_back(order[i++]);
    }
    nodes_[p.node].num_tokens = static_cast<int32_t>(token_ids_.size()) - nodes_[p.node].first_token;
    nodes_[p.node].first_child = static_cast<int32_t>(nodes_.size());
    while (i < p.end) {
      const uint8_t byte = static_cast<uint8_t>(token_bytes_[order[i]][p.depth]);
      size_t j = i;
      while (j < p.end && static_cast<uint8_t>(token_bytes_[order[j]][p.depth]) == byte) ++j;
      Node child;
      child.byte = byte;
      queue.push_back({static_cast<int32_t>(nodes_.size()), i, j, p.depth + 1});
      nodes_.push_back(child);
      ++nodes_[p.node].num_children;
      i = j;
    }
  }
}

bool TokenTrie::IsEnd(int32_t id) const {
  return std::binary_search(end_ids_.begin(), end_ids_.end(), id);
}

std::shared_ptr<const TokenTrie> TokenTrie::FromTokenizer(const Tokenizer& tokenizer) {
  std::vector<std::string> bytes(tokenizer.vocab_size());
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id) {
    if (!tokenizer.IsSpecial(id)) bytes[id] = tokenizer.TokenBytes(id);
  }
  return std::make_shared<const TokenTrie>(std::move(bytes), tokenizer.EndOfGenerationIds());
}

}  // namespace loom::common
