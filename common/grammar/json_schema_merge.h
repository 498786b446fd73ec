#pragma once

// Rewrites of a JSON Schema into forms the grammar compiler (json_schema_grammar) reads:
// the intersection of two schemas as one schema (allOf, and keywords beside anyOf/oneOf/
// $ref), and `false` subschemas folded away (an anyOf branch dropped, a property
// forbidden, `items: false` as an empty array).

#include <optional>
#include <string>

#include "nlohmann/json.hpp"

namespace loom::common {

/// One schema accepting exactly what both `a` and `b` accept, when the keywords allow it:
/// a keyword on one side only is kept; on both sides, `type` is intersected, `required`
/// united, `properties` merged name by name (recursively), `min*` / `exclusiveMinimum` take
/// the larger bound and `max*` / `exclusiveMaximum` the smaller, `enum`/`const` keep the
/// values both allow when both list them; any other keyword set on both sides must be
/// equal. A property only one side declares meets the other side's
/// `additionalProperties` (dropped under `false`, merged with a schema). Annotations come
/// from `a`. Booleans: true is the identity, false absorbs. nullopt: not expressible so
/// (the caller refuses the schema by name).
std::optional<nlohmann::ordered_json> IntersectSchemas(const nlohmann::ordered_json& a,
                                                       const nlohmann::ordered_json& b);

/// Keywords that describe and never constrain (title, description, $defs, ...).
bool IsSchemaAnnotation(const std::string& key);

/// True for `true` and for an object schema with no validation keyword (only annotations):
/// it accepts every value.
bool AcceptsEverything(const nlohmann::ordered_json& schema);

}  // namespace loom::common
