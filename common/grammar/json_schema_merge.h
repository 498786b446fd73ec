#pragma once

// Rewrites of a JSON Schema into forms the grammar compiler (json_schema_grammar) reads:
// the intersection of two schemas as one schema (allOf, and keywords beside anyOf/oneOf/
// $ref), and `false` subschemas folded away (an anyOf branch dropped, a property
// forbidden, `items: false` as an empty array).

#include <optional>
#include <string>
#include <vector>

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

/// IntersectSchemas of `outer` (the keywords beside an applicator: allOf, anyOf, oneOf,
/// $ref) and `inner` (what the applicator applies), except that `outer`'s
/// unevaluatedProperties / unevaluatedItems see what `inner` evaluates: they apply to the
/// merged schema instead of restricting `inner`'s members (as a side's do in
/// IntersectSchemas, where nothing of one side is evaluated in the other's scope).
std::optional<nlohmann::ordered_json> MergeIntoApplicator(const nlohmann::ordered_json& outer,
                                                          const nlohmann::ordered_json& inner);

/// `unevaluatedProperties` / `unevaluatedItems` of a schema whose subschemas were merged
/// into it (allOf, $ref and anyOf/oneOf siblings: nothing else evaluates its members) as
/// `additionalProperties` / `items` where those are absent; dropped where they are present
/// (they evaluate every remaining member). Other schemas come back unchanged.
nlohmann::ordered_json WithoutUnevaluated(const nlohmann::ordered_json& schema);

/// The type names of a `type` value (a string, or a list of them; other entries skipped).
std::vector<std::string> TypeNames(const nlohmann::ordered_json& type);

/// The types the keywords of a schema without `type` imply (properties, required... ->
/// object; items, prefixItems... -> array; pattern, format, min/maxLength -> string; bounds
/// and multipleOf -> number), in that order; empty when none does.
std::vector<std::string> ImpliedTypes(const nlohmann::ordered_json& schema);

/// Keywords that describe and never constrain (title, description, $defs, ...).
bool IsSchemaAnnotation(const std::string& key);

/// True for `true` and for an object schema with no validation keyword (only annotations):
/// it accepts every value.
bool AcceptsEverything(const nlohmann::ordered_json& schema);

}  // namespace loom::common
