#pragma once

// Matching bytes and tokens against a compiled Grammar.
//
// A parser configuration is a set of stacks (a pushdown automaton run over all
// alternatives at once, as llama.cpp's grammar sampler does). Stacks are interned as
// (element, parent) nodes, and whole stack sets as integer states, so the automaton is a
// lazily built DFA over configurations: each (state, byte) transition is computed once
// and remembered, and so is each state's token mask. Repeated schemas and the repetitive
// inside of strings and arrays mostly hit those tables.

#include <bitset>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/grammar/grammar.h"
#include "common/tokenizer/token_trie.h"

namespace loom::common {

/// The bits of allowed token ids: bit (id % 64) of word id / 64.
using TokenMask = std::vector<uint64_t>;

/// One grammar's configurations, transitions and token masks, shared by every sequence
/// that matches it. Thread-safe (one mutex; a mask is computed under it).
class GrammarAutomaton {
 public:
  /// `trie` may be null when only bytes are matched (AllowedTokens then is unusable).
  GrammarAutomaton(std::shared_ptr<const Grammar> grammar,
                   std::shared_ptr<const TokenTrie> trie);

  static constexpr int32_t kDead = -1;

  /// The bound on one configuration: (element, return) pairs visited to build it, which
  /// also bounds the parser stacks it holds. Nested nullable repeats multiply them
  /// (((a?){n}){m} holds n * m stacks after each byte), and so do empty rules used twice
  /// in a chain (r1 ::= r0 r0, r2 ::= r1 r1, ...: 2^n return points); a configuration past
  /// it is refused (kDead), and the automaton says so (overflowed()), so no grammar makes
  /// a transition unbounded work or memory.
  static constexpr int64_t kMaxClosureSteps = int64_t{1} << 20;

  /// InvalidArgument when `grammar`'s configuration before any byte is past the bounds
  /// (what request validation checks); OK otherwise.
  static absl::Status CheckStartFits(std::shared_ptr<const Grammar> grammar);

  /// The configuration before any byte.
  int32_t Initial() const { return initial_; }
  /// The configuration after `byte`, or kDead when the grammar rejects it.
  int32_t Advance(int32_t state, uint8_t byte);
  /// Advance over every byte of `bytes` (kDead as soon as one is rejected).
  int32_t AdvanceBytes(int32_t state, std::string_view bytes);
  /// Whether a document may end in `state`.
  bool IsAccepting(int32_t state);
  /// Whether some byte may follow in `state`.
  bool CanContinue(int32_t state);
  /// The tokens allowed in `state` (the trie's end tokens exactly when accepting),
  /// computed once per state. Requires a trie.
  std::shared_ptr<const TokenMask> AllowedTokens(int32_t state);

  const TokenTrie* trie() const { return trie_.get(); }
  /// Configurations interned so far (a measure of the work done).
  int64_t num_states();
  /// Whether some configuration was refused for its size (kMaxClosureSteps).
  bool overflowed();

 private:
  struct Node {
    int32_t pos;     // element to match next
    int32_t parent;  // node to return to at the end of the alternative; 0: accept
  };
  struct State {
    std::vector<int32_t> nodes;  // sorted; contains 0 when accepting
    std::bitset<256> next_bytes;
  };

  // The (element, return node) pairs one configuration's closure visited: each once for the
  // whole configuration (what one pair yields does not depend on where it was reached from).
  struct Closure {
    absl::flat_hash_set<uint64_t> seen;
    std::vector<int32_t> nodes;
    bool overflowed = false;
  };

  int32_t InternNode(int32_t pos, int32_t parent) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Expand(int32_t pos, int32_t parent, Closure& closure) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The closure's configuration, kDead when it is empty or past the bounds.
  int32_t InternClosure(Closure closure) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int32_t InternState(std::vector<int32_t> nodes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int32_t AdvanceLocked(int32_t state, uint8_t byte) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::shared_ptr<const Grammar> grammar_;
  const std::shared_ptr<const TokenTrie> trie_;
  int32_t initial_ = 0;

  absl::Mutex mu_;
  std::vector<Node> nodes_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, int32_t> node_index_ ABSL_GUARDED_BY(mu_);
  std::vector<State> states_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::vector<int32_t>, int32_t> state_index_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, int32_t> transitions_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int32_t, std::shared_ptr<const TokenMask>> masks_ ABSL_GUARDED_BY(mu_);
  std::vector<int32_t> scratch_ ABSL_GUARDED_BY(mu_);
  bool overflowed_ ABSL_GUARDED_BY(mu_) = false;
};

/// One sequence's position in a grammar. Not thread-safe; cheap to copy.
class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<GrammarAutomaton> automaton);

  /// Consumes token `id` if the grammar allows it (an end token only where the document
  /// may end, which finishes the matcher); false and no change otherwise.
  bool AcceptToken(int32_t id);
  /// Consumes `bytes` if the grammar allows all of them; false and no change otherwise.
  bool AcceptBytes(std::string_view bytes);
  /// Undoes the last `n` accepted tokens (speculative drafts that were rejected).
  void Rollback(int32_t n);
  /// Tokens allowed next (nothing once finished).
  std::shared_ptr<const TokenMask> AllowedTokens();
  bool IsAccepting() const;
  /// Whether an end token was accepted.
  bool finished() const { return finished_; }
  /// Puts the matcher where nothing is allowed (after a token it refused was emitted).
  void Invalidate() { state_ = GrammarAutomaton::kDead; }
  /// The mask AllowedTokens returns, for computing it elsewhere (another thread).
  std::shared_ptr<GrammarAutomaton> automaton() const { return automaton_; }
  int32_t state() const { return finished_ ? GrammarAutomaton::kDead : state_; }

 private:
  std::shared_ptr<GrammarAutomaton> automaton_;
  int32_t state_;
  bool finished_ = false;
  std::vector<int32_t> history_;  // state before each accepted token
};

/// Whether bit `id` of `mask` is set.
inline bool MaskAllows(const TokenMask& mask, int32_t id) {
  return (mask[static_cast<size_t>(id) >> 6] >> (id & 63)) & 1;
}

}  // namespace loom::common
