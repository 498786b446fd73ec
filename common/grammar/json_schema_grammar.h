#pragma once

// JSON Schema (the subset structured-output requests use) compiled to a grammar whose
// documents are exactly the JSON texts the schema accepts, in one layout:
//   * objects list their properties in the schema's order, required ones always, the
//     others optionally; no properties beyond `properties` unless `additionalProperties`
//     is true or a schema (its absence means false, as OpenAI's strict mode requires);
//   * at most one space after ',' ':' '{' '[' and before '}' ']', no other whitespace
//     (json.dumps' default and compact separators both match);
//   * numbers have at most 16 integer and 16 fraction digits and a 3-digit exponent.
// Supported: type (and type lists), properties, required, additionalProperties, items,
// minItems, maxItems, enum, const, anyOf, oneOf (as anyOf), allOf with one schema,
// $ref to "#", "#/$defs/..." and "#/definitions/...", string minLength, maxLength,
// pattern, format (date-time, date, time, uuid, email, ipv4), integer minimum, maximum,
// exclusiveMinimum, exclusiveMaximum, number minimum/maximum when integral and >= 0.
// Annotations (title, description, default, examples, ...) are ignored; any other
// keyword is refused by name.

#include <string_view>

#include "absl/status/statusor.h"
#include "common/grammar/grammar.h"

namespace loom::common {

/// The grammar of `schema_json`'s documents. InvalidArgument naming the keyword (and its
/// JSON pointer) for a construct outside the subset, and for malformed schemas.
absl::StatusOr<GrammarDefinition> JsonSchemaGrammar(std::string_view schema_json);

/// The grammar of any JSON object (`response_format: {"type": "json_object"}`).
GrammarDefinition JsonObjectGrammar();

}  // namespace loom::common
