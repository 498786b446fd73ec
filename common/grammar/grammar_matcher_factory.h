#pragma once

// Where a process turns a request's GrammarSpec into a per-sequence GrammarMatcher over
// its model's vocabulary: grammars are compiled once per distinct spec (GrammarCache) and
// each grammar's automaton (its configurations, transitions and token masks) is shared by
// every sequence that uses it, so a repeated schema reuses the masks computed before.

#include <cstddef>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/grammar/grammar_matcher.h"
#include "common/grammar/grammar_spec.h"
#include "common/tokenizer/token_trie.h"

namespace loom::common {

/// Thread-safe.
class GrammarMatcherFactory {
 public:
  /// Keeps the automata of up to `capacity` grammars (the oldest dropped first; matchers
  /// still using one keep it alive).
  explicit GrammarMatcherFactory(std::shared_ptr<const TokenTrie> trie, size_t capacity = 64);

  /// A matcher at the start of `spec`'s grammar. InvalidArgument when it does not compile.
  absl::StatusOr<std::unique_ptr<GrammarMatcher>> NewMatcher(const GrammarSpec& spec);

  const TokenTrie& trie() const { return *trie_; }
  const GrammarCache& grammars() const { return grammars_; }

 private:
  const std::shared_ptr<const TokenTrie> trie_;
  const size_t capacity_;
  GrammarCache grammars_;
  absl::Mutex mu_;
  absl::flat_hash_map<const Grammar*, std::shared_ptr<GrammarAutomaton>> automata_ ABSL_GUARDED_BY(mu_);
  // The grammars automata_ holds, so their addresses stay unique while keyed.
  absl::flat_hash_map<const Grammar*, std::shared_ptr<const Grammar>> pinned_ ABSL_GUARDED_BY(mu_);
};

}  // namespace loom::common
