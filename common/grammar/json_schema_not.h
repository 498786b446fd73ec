#pragma once

// JSON Schema `not` where what it excludes is finite, rewritten into keywords the grammar
// compiler (json_schema_grammar) reads.

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace loom::common {

/// `schema` (which has `not`) as an equivalent schema without it, when `not` excludes
///  - types (`{"not": {"type": ...}}`): the other types remain;
///  - a finite set of values (`const` / `enum`): a listed enum loses them; otherwise one
///    branch per remaining type (an anyOf): booleans and null as the values left,
///    integers and numbers as the ranges between the excluded values (merged with the
///    schema's own bounds), strings with a pattern no excluded string matches;
///  - `false` (nothing): the rest of the schema.
/// InvalidArgument (its message names the construct) for anything else: a `not` of
/// other keywords, excluded objects or arrays, strings that already carry a pattern,
/// format or length, multipleOf beside excluded numbers, a schema left with no value.
absl::StatusOr<nlohmann::ordered_json> RewriteNot(const nlohmann::ordered_json& schema);

}  // namespace loom::common
