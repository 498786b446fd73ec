#pragma once

#include <string_view>

#include "absl/status/status.h"

namespace loom::common {

/// The deepest nesting Loom accepts in JSON it did not write: request bodies, JSON Schemas,
/// tool specifications and the arguments a model generates. nlohmann's copy, dump and
/// comparison recurse once per level, and so do the schema compiler and the grammar it
/// builds: a request nested 10,000 deep overflowed a thread's stack. Python's json module
/// (vLLM, SGLang) stops near 1,000 levels; real schemas stay far below this.
inline constexpr int kMaxJsonNestingDepth = 256;

/// The deepest nesting of arrays and objects in JSON `text` ('[' and '{' inside strings not
/// counted; escapes honoured), found without parsing it. Meaningful for valid JSON; for
/// other text a bound of its brackets. O(length), no recursion.
int JsonNestingDepth(std::string_view text);

/// InvalidArgument "<what> nests arrays and objects deeper than 256 levels" when `text` is
/// deeper than kMaxJsonNestingDepth; OK otherwise (valid or not: parsing is the caller's).
absl::Status CheckJsonNestingDepth(std::string_view text, std::string_view what);

}  // namespace loom::common
