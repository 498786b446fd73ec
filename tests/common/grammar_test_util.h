#pragma once

#include <memory>
#include <string>

#include "common/grammar/grammar_matcher.h"
#include "common/grammar/grammar_spec.h"
#include "gtest/gtest.h"

namespace loom::common::testing {

/// Whether the grammar of `spec` accepts `doc` whole; fails the test if it does not compile.
inline bool Accepts(const GrammarSpec& spec, const std::string& doc) {
  auto grammar = CompileGrammarSpec(spec);
  if (!grammar.ok()) {
    ADD_FAILURE() << "does not compile: " << grammar.status();
    return false;
  }
  GrammarAutomaton automaton(*grammar, nullptr);
  return automaton.IsAccepting(automaton.AdvanceBytes(automaton.Initial(), doc));
}

inline bool SchemaAccepts(const std::string& schema, const std::string& doc) {
  return Accepts({GrammarKind::kJsonSchema, schema}, doc);
}

}  // namespace loom::common::testing
