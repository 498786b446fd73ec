#include "common/grammar/json_schema_merge.h"

#include <algorithm>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"

namespace loom::common {
namespace {

using Json = nlohmann::ordered_json;

// The types both allow ("integer" is within "number").
std::optional<Json> IntersectTypes(const Json& a, const Json& b) {
  const std::vector<std::string> left = TypeNames(a), right = TypeNames(b);
  if (left.empty() || right.empty()) return std::nullopt;
  Json out = Json::array();
  auto has = [](const std::vector<std::string>& list, const std::string& t) {
    return std::find(list.begin(), list.end(), t) != list.end();
  };
  for (const std::string& t : left) {
    if (has(right, t)) {
      out.push_back(t);
    } else if (t == "integer" && has(right, "number")) {
      out.push_back("integer");
    } else if (t == "number" && has(right, "integer")) {
      out.push_back("integer");
    }
  }
  if (out.empty()) return std::nullopt;  // no value has both types
  return out.size() == 1 ? out[0] : out;
}

std::vector<Json> Values(const Json& schema) {
  if (schema.contains("const")) return {schema["const"]};
  std::vector<Json> out;
  if (schema.contains("enum") && schema["enum"].is_array()) {
    for (const Json& v : schema["enum"]) out.push_back(v);
  }
  return out;
}

}  // namespace

bool IsSchemaAnnotation(const std::string& key) {
  static const absl::flat_hash_set<std::string> kAnnotations = {
      "title", "description",  "default",          "examples",        "$schema",
      "$id",   "$comment",     "deprecated",       "readOnly",        "writeOnly",
      "$defs", "definitions",  "contentMediaType", "contentEncoding", "strict",
      "name",  "uniqueItems_", "discriminator",    "nullable_",       "$anchor"};
  return kAnnotations.contains(key);
}

std::optional<Json> MergeIntoApplicator(const Json& outer, const Json& inner) {
  if (!outer.is_object()) return IntersectSchemas(outer, inner);
  Json stripped = outer;
  Json deferred = Json::object();
  for (const char* key : {"unevaluatedProperties", "unevaluatedItems"}) {
    if (!stripped.contains(key)) continue;
    deferred[key] = stripped[key];
    stripped.erase(key);
  }
  std::optional<Json> merged = IntersectSchemas(stripped, inner);
  if (!merged || !merged->is_object()) return merged;
  for (const auto& [key, value] : deferred.items()) {
    if (merged->contains(key) && (*merged)[key] != value) return std::nullopt;
    (*merged)[key] = value;
  }
  return merged;
}

std::vector<std::string> TypeNames(const Json& type) {
  std::vector<std::string> out;
  if (type.is_string()) out.push_back(type.get<std::string>());
  if (type.is_array()) {
    for (const Json& t : type) {
      if (t.is_string()) out.push_back(t.get<std::string>());
    }
  }
  return out;
}

std::vector<std::string> ImpliedTypes(const Json& schema) {
  const auto has_any = [&](std::initializer_list<const char*> keys) {
    return std::any_of(keys.begin(), keys.end(), [&](const char* k) { return schema.contains(k); });
  };
  std::vector<std::string> types;
  if (has_any({"properties", "additionalProperties", "required", "patternProperties",
               "minProperties", "maxProperties"})) {
    types.push_back("object");
  }
  if (has_any({"items", "prefixItems", "minItems", "maxItems"})) types.push_back("array");
  if (has_any({"pattern", "format", "minLength", "maxLength"})) types.push_back("string");
  if (has_any({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"})) {
    types.push_back("number");
  }
  return types;
}

Json WithoutUnevaluated(const Json& schema) {
  Json out = schema;
  for (const auto& [unevaluated, evaluating] :
       {std::pair<const char*, const char*>{"unevaluatedProperties", "additionalProperties"},
        std::pair<const char*, const char*>{"unevaluatedItems", "items"}}) {
    if (!out.is_object() || !out.contains(unevaluated)) continue;
    if (!out.contains(evaluating)) out[evaluating] = out[unevaluated];
    out.erase(unevaluated);
  }
  return out;
}

bool AcceptsEverything(const Json& schema) {
  if (schema.is_boolean()) return schema.get<bool>();
  if (!schema.is_object()) return false;
  for (const auto& [key, value] : schema.items()) {
    if (!IsSchemaAnnotation(key)) return false;
  }
  return true;
}

std::optional<Json> IntersectSchemas(const Json& a, const Json& b) {
  if (a.is_boolean()) return a.get<bool>() ? b : a;
  if (b.is_boolean()) return b.get<bool>() ? a : b;
  if (!a.is_object() || !b.is_object()) return std::nullopt;
  Json out = a;
  // Properties one side declares meet the other side's additionalProperties.
  const auto declared = [](const Json& s, const std::string& name) {
    return s.contains("properties") && s["properties"].is_object() &&
           s["properties"].contains(name);
  };
  if ((a.contains("patternProperties") && b.contains("properties")) ||
      (b.contains("patternProperties") && a.contains("properties"))) {
    return std::nullopt;
  }
  // A side's unevaluated* sees nothing the other side evaluates: where that is more than
  // `properties` (applicators not merged yet, items), the merge cannot say it; refused.
  for (const auto& [self, other] : {std::pair<const Json&, const Json&>{a, b}, {b, a}}) {
    if (!self.contains("unevaluatedProperties") && !self.contains("unevaluatedItems")) continue;
    for (const char* key : {"allOf", "anyOf", "oneOf", "$ref", "not", "if", "dependentSchemas",
                            "patternProperties"}) {
      if (other.contains(key)) return std::nullopt;
    }
    if (self.contains("unevaluatedItems") &&
        (other.contains("items") || other.contains("prefixItems"))) {
      return std::nullopt;
    }
  }
  Json properties = a.contains("properties") ? a["properties"] : Json::object();
  if (!properties.is_object()) return std::nullopt;
  std::vector<std::string> forbidden;
  for (const auto& side : {std::cref(a), std::cref(b)}) {
    const Json& self = side.get();
    const Json& other = &self == &a ? b : a;
    if (!self.contains("properties")) continue;
    if (!self["properties"].is_object()) return std::nullopt;
    for (const auto& [name, schema] : self["properties"].items()) {
      if (declared(other, name)) continue;
      // Members the other side does not declare meet its additionalProperties, or its
      // unevaluatedProperties (nothing of this side is evaluated in the other's scope).
      const Json extra = other.contains("additionalProperties")    ? other["additionalProperties"]
                         : other.contains("unevaluatedProperties") ? other["unevaluatedProperties"]
                                                                   : Json(true);
      std::optional<Json> merged = IntersectSchemas(schema, extra);
      if (!merged) return std::nullopt;
      if (merged->is_boolean() && !merged->get<bool>()) {
        forbidden.push_back(name);
        properties.erase(name);
        continue;
      }
      properties[name] = *merged;
    }
  }
  if (a.contains("properties") && b.contains("properties")) {
    for (const auto& [name, schema] : b["properties"].items()) {
      if (!declared(a, name)) continue;
      std::optional<Json> merged = IntersectSchemas(a["properties"][name], schema);
      if (!merged) return std::nullopt;
      properties[name] = *merged;
    }
  }
  if (a.contains("properties") || b.contains("properties")) out["properties"] = properties;
  for (const auto& [key, value] : b.items()) {
    if (key == "properties" || IsSchemaAnnotation(key)) continue;
    if (!a.contains(key)) {
      out[key] = value;
      continue;
    }
    const Json& mine = a[key];
    if (mine == value) continue;
    if (key == "type") {
      std::optional<Json> types = IntersectTypes(mine, value);
      if (!types) return std::nullopt;
      out[key] = *types;
    } else if (key == "required") {
      if (!mine.is_array() || !value.is_array()) return std::nullopt;
      Json united = mine;
      for (const Json& name : value) {
        if (std::find(united.begin(), united.end(), name) == united.end()) united.push_back(name);
      }
      out[key] = united;
    } else if (key == "minimum" || key == "exclusiveMinimum" || key == "minLength" ||
               key == "minItems" || key == "minProperties") {
      if (!mine.is_number() || !value.is_number()) return std::nullopt;
      out[key] = mine.get<double>() >= value.get<double>() ? mine : value;
    } else if (key == "maximum" || key == "exclusiveMaximum" || key == "maxLength" ||
               key == "maxItems" || key == "maxProperties") {
      if (!mine.is_number() || !value.is_number()) return std::nullopt;
      out[key] = mine.get<double>() <= value.get<double>() ? mine : value;
    } else if (key == "additionalProperties" || key == "items") {
      std::optional<Json> merged = IntersectSchemas(mine, value);
      if (!merged) return std::nullopt;
      out[key] = *merged;
    } else if ((key == "enum" || key == "const") && !Values(a).empty()) {
      continue;  // below
    } else {
      return std::nullopt;
    }
  }
  // enum / const on both sides: the values both list.
  if ((a.contains("enum") || a.contains("const")) && (b.contains("enum") || b.contains("const"))) {
    const std::vector<Json> right = Values(b);
    Json both = Json::array();
    for (const Json& v : Values(a)) {
      if (std::find(right.begin(), right.end(), v) != right.end()) both.push_back(v);
    }
    out.erase("const");
    out["enum"] = both;  // empty: nothing is valid, which the compiler refuses by name
  }
  for (const std::string& name : forbidden) {
    if (out.contains("required") && std::find(out["required"].begin(), out["required"].end(),
                                              Json(name)) != out["required"].end()) {
      return Json(false);  // a required property that cannot be present
    }
  }
  return out;
}

}  // namespace loom::common
