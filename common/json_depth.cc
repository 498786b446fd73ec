#include "common/json_depth.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"

namespace loom::common {

int JsonNestingDepth(std::string_view text) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character, whatever it is
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

absl::Status CheckJsonNestingDepth(std::string_view text, std::string_view what) {
  if (JsonNestingDepth(text) <= kMaxJsonNestingDepth) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(std::string(what),
                                                 " nests arrays and objects deeper than ",
                                                 kMaxJsonNestingDepth, " levels"));
}

}  // namespace loom::common
