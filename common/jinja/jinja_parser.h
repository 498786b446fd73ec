#pragma once

// Recursive-descent parser from jinja2's grammar (operator precedence, tests, filters,
// tuple rules) to the syntax tree in jinja_ast.h.

#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/jinja/jinja_ast.h"

namespace loom::common::jinja {

/// Parses `source`. InvalidArgument with "line L, column C" for syntax errors and for
/// constructs outside the supported subset (extends, include, import, call blocks,
/// unknown filters or tests), naming the construct.
absl::StatusOr<std::unique_ptr<Template>> ParseTemplate(absl::string_view source);

}  // namespace loom::common::jinja
