#pragma once

// Tree-walking renderer for parsed Jinja templates, with jinja2's scoping (a for-loop
// body gets a fresh scope per iteration; `if` does not scope; namespaces are the way out
// of a loop) and limits that stop runaway templates with an error.

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/jinja/jinja_ast.h"
#include "common/jinja/jinja_value.h"

namespace loom::common::jinja {

struct RenderLimits {
  size_t max_output_bytes = size_t{64} << 20;  // also bounds any single string value
  int max_call_depth = 64;                     // nested macro calls
  int64_t max_steps = 5'000'000;               // statements executed + loop iterations
};

/// Renders `tmpl` with `context` as its variables (beside the globals range, dict,
/// namespace, raise_exception, strftime_now). InvalidArgument for runtime errors, with
/// "line L, column C: " before the message except for raise_exception's own message;
/// ResourceExhausted when a limit is hit. Thread-safe for concurrent calls.
absl::StatusOr<std::string> RenderTemplate(const Template& tmpl, const ValueDict& context,
                                           const RenderLimits& limits = {});

}  // namespace loom::common::jinja
