// Reads JSON lines {"kind": "json_schema"|"regex"|"choice"|"grammar"|"json_object",
// "spec": "...", "doc": "..."} on stdin and prints one JSON line per input:
// {"accept": true|false} or {"error": "..."} when the spec does not compile.
// tests/common/grammar_conformance_test.py checks it against Python's jsonschema.

#include <iostream>
#include <memory>
#include <string>

#include "common/grammar/grammar_matcher.h"
#include "common/grammar/grammar_spec.h"
#include "nlohmann/json.hpp"

int main() {
  loom::common::GrammarCache cache;
  std::string line;
  while (std::getline(std::cin, line)) {
    nlohmann::json out;
    nlohmann::json in = nlohmann::json::parse(line, nullptr, false);
    if (in.is_discarded()) {
      out["error"] = "input line is not JSON";
      std::cout << out.dump() << std::endl;
      continue;
    }
    auto kind = loom::common::ParseGrammarKind(in.value("kind", ""));
    if (!kind.ok()) {
      out["error"] = std::string(kind.status().message());
      std::cout << out.dump() << std::endl;
      continue;
    }
    auto grammar = cache.Get({*kind, in.value("spec", "")});
    if (!grammar.ok()) {
      out["error"] = std::string(grammar.status().message());
      std::cout << out.dump() << std::endl;
      continue;
    }
    auto automaton = std::make_shared<loom::common::GrammarAutomaton>(*grammar, nullptr);
    const int32_t state = automaton->AdvanceBytes(automaton->Initial(), in.value("doc", ""));
    out["accept"] = automaton->IsAccepting(state);
    std::cout << out.dump() << std::endl;
  }
  return 0;
}
