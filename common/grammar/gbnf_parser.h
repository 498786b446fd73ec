#pragma once

// GBNF, llama.cpp's EBNF dialect (what `guided_grammar` takes):
//   root  ::= "{" ws pair ("," ws pair)* "}"   # comment
//   pair  ::= [a-z]+ ":" ws ( "true" | "false" )
//   ws    ::= [ \t\n]*
// Literals "..." with \n \t \r \\ \" \xHH \uHHHH escapes, classes [...] / [^...], '.',
// rule names [A-Za-z0-9_-]+, groups, alternation, *, +, ?, {m}, {m,}, {m,n}.

#include <string_view>

#include "absl/status/statusor.h"
#include "common/grammar/grammar.h"

namespace loom::common {

/// The rules of `text` (root rule "root"). InvalidArgument with the line for syntax
/// errors; undefined rules and left recursion are found by Grammar::Compile.
absl::StatusOr<GrammarDefinition> ParseGbnf(std::string_view text);

}  // namespace loom::common
