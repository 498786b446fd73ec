#pragma once

// Python's operators on interpreter values: arithmetic, `~` concatenation, comparisons
// and `in`, raising where Python (or jinja2's Undefined) would.

#include <cstddef>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/jinja/jinja_value.h"

namespace loom::common::jinja {

/// `lhs op rhs` for op in + - * / // % ** ~. Strings or lists longer than `max_bytes`
/// bytes/items are an error (runaway templates). InvalidArgument for Python's
/// TypeError/ZeroDivisionError, UndefinedError and 64-bit integer overflow.
absl::StatusOr<Value> BinaryOp(absl::string_view op, const Value& lhs, const Value& rhs,
                               size_t max_bytes);

/// Unary minus (`negate`) or plus on a number.
absl::StatusOr<Value> UnaryOp(bool negate, const Value& operand);

/// `lhs op rhs` for op in == != < <= > >= in notin.
absl::StatusOr<bool> CompareOp(absl::string_view op, const Value& lhs, const Value& rhs);

/// Python's `item in container`.
absl::StatusOr<bool> Contains(const Value& container, const Value& item);

}  // namespace loom::common::jinja
