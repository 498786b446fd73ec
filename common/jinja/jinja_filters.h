#pragma once

// jinja2's built-in filters (`x | name(args)`) and tests (`x is name(args)`) that chat
// templates use, plus Hugging Face's `tojson`. The names are checked at parse time so an
// unsupported one is an error before any rendering.

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/jinja/jinja_value.h"

namespace loom::common::jinja {

/// True for the filters ApplyFilter implements.
bool IsKnownFilter(absl::string_view name);

/// True for the tests ApplyTest implements.
bool IsKnownTest(absl::string_view name);

/// `input | name(args)`. InvalidArgument for bad arguments or values, as jinja2 raises.
absl::StatusOr<Value> ApplyFilter(absl::string_view name, const Value& input, CallArgs& args);

/// `input is name(args)`.
absl::StatusOr<bool> ApplyTest(absl::string_view name, const Value& input, CallArgs& args);

}  // namespace loom::common::jinja
