#pragma once

// Tokenizer for Jinja templates, a port of jinja2's Lexer with the settings Hugging Face
// uses: trim_blocks (drop the newline after a block or comment tag), lstrip_blocks
// (drop the spaces before a block or comment tag on its own line), `-`/`+` whitespace
// control, and no trailing newline kept at the end of the template.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace loom::common::jinja {

struct Token {
  enum class Type {
    kText,        // literal template data (after whitespace control)
    kVarBegin,    // {{
    kVarEnd,      // }}
    kBlockBegin,  // {%
    kBlockEnd,    // %}
    kName,
    kString,    // value: the decoded string
    kInteger,   // int_value
    kFloat,     // float_value
    kOperator,  // value: the operator text, e.g. "//" or "("
    kEnd,       // end of the template
  };
  Type type;
  std::string value;
  int64_t int_value = 0;
  double float_value = 0;
  int line = 1;    // 1-based
  int column = 1;  // 1-based, in bytes
};

/// Tokens of `source`, ending with kEnd. InvalidArgument ("line L, column C: ...")
/// for unterminated comments or tags, bad characters and bad string escapes.
absl::StatusOr<std::vector<Token>> Tokenize(absl::string_view source);

}  // namespace loom::common::jinja
