#pragma once

// Regular expressions (the common subset of ECMAScript, Python and RE2 syntax that
// `guided_regex` and JSON Schema `pattern` use) compiled to grammar expressions.

#include <string_view>

#include "absl/status/statusor.h"
#include "common/grammar/grammar.h"

namespace loom::common {

struct RegexOptions {
  /// The match is the inside of a JSON string: literal '"', '\' and control characters
  /// are matched in their escaped form, classes and '.' never match them raw.
  bool json_string = false;
  /// Unless the pattern starts with '^' / ends with '$', anything may come before /
  /// after the match (JSON Schema's `pattern` searches; `guided_regex` matches whole).
  bool search = false;
};

/// The expression matching exactly the strings `pattern` matches. InvalidArgument naming
/// the construct for what a grammar cannot express or this parser does not know
/// (backreferences, lookaround, word boundaries, anchors inside the pattern) and for
/// malformed patterns, with the offset.
absl::StatusOr<GrammarExprPtr> RegexToExpr(std::string_view pattern, const RegexOptions& options = {});

/// A grammar whose root matches `pattern` whole.
absl::StatusOr<GrammarDefinition> RegexGrammar(std::string_view pattern);

}  // namespace loom::common
