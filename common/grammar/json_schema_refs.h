#pragma once

// Local `$ref`s of a JSON Schema: JSON pointers ("#/$defs/a", with ~0/~1 and URI
// percent-escapes) and plain-name fragments ("#foo") naming a subschema's `$anchor`.

#include <string_view>

#include "nlohmann/json.hpp"

namespace loom::common {

/// The subschema of `root` that `ref` (starting with '#') names; null when none does.
const nlohmann::ordered_json* ResolveLocalRef(const nlohmann::ordered_json& root,
                                              std::string_view ref);

}  // namespace loom::common
