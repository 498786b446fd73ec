#include "common/grammar/grammar_matcher_factory.h"

#include <utility>

namespace loom::common {

GrammarMatcherFactory::GrammarMatcherFactory(std::shared_ptr<const TokenTrie> trie, size_t capacity)
    : trie_(std::move(trie)), capacity_(capacity), grammars_(capacity) {}

absl::StatusOr<std::unique_ptr<GrammarMatcher>> GrammarMatcherFactory::NewMatcher(
    const GrammarSpec& spec) {
  absl::StatusOr<std::shared_ptr<const Grammar>> grammar = grammars_.Get(spec);
  if (!grammar.ok()) return grammar.status();
  std::shared_ptr<GrammarAutomaton> automaton;
  {
    absl::MutexLock lock(&mu_);
    auto it = automata_.find(grammar->get());
    if (it != automata_.end()) {
      automaton = it->second;
    } else {
      if (automata_.size() >= capacity_) {  // rare: many distinct schemas; start over
        automata_.clear();
        pinned_.clear();
      }
      automaton = std::make_shared<GrammarAutomaton>(*grammar, trie_);
      automata_.emplace(grammar->get(), automaton);
      pinned_.emplace(grammar->get(), *grammar);
    }
  }
  return std::make_unique<GrammarMatcher>(std::move(automaton));
}

}  // namespace loom::common
