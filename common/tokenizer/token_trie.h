#pragma once

// The model's vocabulary as bytes, in a trie, for computing which tokens a grammar
// allows next (GrammarAutomaton::AllowedTokens walks it once per parser state).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace loom::common {

class Tokenizer;

/// Token byte strings in a prefix tree. Immutable after construction; thread-safe.
class TokenTrie {
 public:
  /// `token_bytes` [vocab_size]: what each token decodes to; an empty string keeps the
  /// token out of the trie (special tokens). `end_ids`: tokens that end generation,
  /// which a grammar allows exactly where a document may end.
  TokenTrie(std::vector<std::string> token_bytes, std::vector<int32_t> end_ids);

  /// The trie of `tokenizer`'s vocabulary: control and unknown tokens are left out, the
  /// end-of-generation ids become end_ids().
  static std::shared_ptr<const TokenTrie> FromTokenizer(const Tokenizer& tokenizer);

  struct Node {
    int32_t first_child = 0;  // children are nodes [first_child, first_child + num_children)
    int32_t num_children = 0;
    int32_t first_token = 0;  // tokens ending here: token_ids()[first_token, + num_tokens)
    int32_t num_tokens = 0;
    uint8_t byte = 0;  // the byte leading here from the parent
  };

  int32_t vocab_size() const { return static_cast<int32_t>(token_bytes_.size()); }
  const std::vector<Node>& nodes() const { return nodes_; }  // node 0 is the root
  const std::vector<int32_t>& token_ids() const { return token_ids_; }
  const std::vector<int32_t>& end_ids() const { return end_ids_; }
  const std::string& token_bytes(int32_t id) const { return token_bytes_[id]; }
  bool IsEnd(int32_t id) const;

 private:
  std::vector<std::string> token_bytes_;
  std::vector<int32_t> end_ids_;  // ascending
  std::vector<Node> nodes_;
  std::vector<int32_t> token_ids_;
};

}  // namespace loom::common
