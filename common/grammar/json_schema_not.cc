#include "common/grammar/json_schema_not.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/grammar/json_schema_merge.h"

namespace loom::common {
namespace {

using Json = nlohmann::ordered_json;

const std::vector<std::string>& AllTypes() {
  static const std::vector<std::string> kAll = {"null",  "boolean", "object",
                                                "array", "number",  "string"};
  return kAll;
}

// `schema` for values of `type` only. An object or array branch of a schema with no
// keyword for them stays open (the compiler closes objects without properties).
Json Typed(const Json& schema, const std::string& type) {
  Json out = schema;
  out["type"] = type;
  if (type == "object" && !schema.contains("type") && !schema.contains("properties") &&
      !schema.contains("additionalProperties") && !schema.contains("patternProperties")) {
    out["additionalProperties"] = true;
  }
  return out;
}

// The types `schema` allows, as the compiler reads them: its `type`, or those its keywords
// imply, or every type.
std::vector<std::string> BaseTypes(const Json& schema) {
  if (schema.contains("type")) return TypeNames(schema["type"]);
  std::vector<std::string> types = ImpliedTypes(schema);
  return types.empty() ? AllTypes() : types;
}

bool HasType(const Json& value, const std::string& type) {
  if (type == "null") return value.is_null();
  if (type == "boolean") return value.is_boolean();
  if (type == "object") return value.is_object();
  if (type == "array") return value.is_array();
  if (type == "string") return value.is_string();
  if (type == "number") return value.is_number();
  if (type == "integer") {
    return value.is_number_integer() ||
           (value.is_number_float() && std::floor(value.get<double>()) == value.get<double>());
  }
  return false;
}

absl::Status Refused(const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("'not' ", what, " is not supported"));
}

// A trie of excluded strings (by code point).
struct Trie {
  bool terminal = false;
  std::map<uint32_t, std::unique_ptr<Trie>> children;
};

// UTF-8 to code points; false for invalid text.
bool Decode(const std::string& text, std::vector<uint32_t>& out) {
  for (size_t i = 0; i < text.size();) {
    const auto b = static_cast<unsigned char>(text[i]);
    int n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > text.size()) return false;
    uint32_t c = n == 1 ? b : b & (0x7f >> n);
    for (int k = 1; k < n; ++k) c = (c << 6) | (static_cast<unsigned char>(text[i + k]) & 0x3f);
    out.push_back(c);
    i += n;
  }
  return true;
}

std::string RegexChar(uint32_t c) {
  if (c < 0x20 || c == 0x7f) return absl::StrFormat("\\u%04x", c);
  if (c < 0x80) {
    const char ch = static_cast<char>(c);
    if (std::isalnum(static_cast<unsigned char>(ch)) || ch == ' ' || ch == '_')
      return std::string(1, ch);
    return absl::StrCat("\\", std::string(1, ch));
  }
  if (c > 0xffff) return "";  // outside what \u writes: the caller refuses
  return absl::StrFormat("\\u%04x", c);
}

// The regex (without anchors) of the strings that continue from `node` and are not
// excluded: end here (unless excluded), a character no excluded string has next followed
// by anything, or a next character and what follows it.
std::string Complement(const Trie& node) {
  std::vector<std::string> alts;
  if (node.children.empty()) {
    alts.push_back("[\\s\\S]+");
  } else {
    std::string others = "[^";
    for (const auto& [c, child] : node.children) others += RegexChar(c);
    alts.push_back(others + "][\\s\\S]*");
    for (const auto& [c, child] : node.children) {
      alts.push_back(RegexChar(c) + "(" + Complement(*child) + ")");
    }
  }
  std::string joined;
  for (const std::string& alt : alts) joined += (joined.empty() ? "" : "|") + alt;
  return node.terminal ? "(" + joined + ")" : "(" + joined + ")?";
}

absl::StatusOr<std::string> ExcludingPattern(const std::vector<Json>& strings) {
  Trie root;
  for (const Json& value : strings) {
    std::vector<uint32_t> chars;
    if (!Decode(value.get<std::string>(), chars) || chars.size() > 256) {
      return Refused("of a string that is not short UTF-8");
    }
    Trie* node = &root;
    for (uint32_t c : chars) {
      if (c > 0xffff) return Refused("of a string outside the Basic Multilingual Plane");
      auto& child = node->children[c];
      if (!child) child = std::make_unique<Trie>();
      node = child.get();
    }
    node->terminal = true;
  }
  return "^" + Complement(root) + "$";
}

// [lo, hi] with open or closed ends; infinities for none.
struct Interval {
  double lo = -INFINITY, hi = INFINITY;
  bool lo_open = true, hi_open = true;
  bool Empty() const { return lo > hi || (lo == hi && (lo_open || hi_open)); }
};

Interval BoundsOf(const Json& schema) {
  Interval out;
  auto tighten_lo = [&](double v, bool open) {
    if (v > out.lo || (v == out.lo && open)) out.lo = v, out.lo_open = open;
  };
  auto tighten_hi = [&](double v, bool open) {
    if (v < out.hi || (v == out.hi && open)) out.hi = v, out.hi_open = open;
  };
  if (schema.contains("minimum") && schema["minimum"].is_number())
    tighten_lo(schema["minimum"].get<double>(), false);
  if (schema.contains("exclusiveMinimum") && schema["exclusiveMinimum"].is_number()) {
    tighten_lo(schema["exclusiveMinimum"].get<double>(), true);
  }
  if (schema.contains("maximum") && schema["maximum"].is_number())
    tighten_hi(schema["maximum"].get<double>(), false);
  if (schema.contains("exclusiveMaximum") && schema["exclusiveMaximum"].is_number()) {
    tighten_hi(schema["exclusiveMaximum"].get<double>(), true);
  }
  return out;
}

// The numbers (or integers) of `schema` other than `values`: one branch per gap.
absl::Status NumericBranches(const Json& schema, const std::string& type,
                             std::vector<double> values, std::vector<Json>& branches) {
  if (schema.contains("multipleOf")) return Refused("of numbers beside multipleOf");
  std::sort(values.begin(), values.end());
  values.erase(std::unique(values.begin(), values.end()), values.end());
  const Interval own = BoundsOf(schema);
  Json base = schema;
  for (const char* key : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})
    base.erase(key);
  base["type"] = type;
  for (size_t i = 0; i <= values.size(); ++i) {
    Interval gap;
    if (i > 0) gap.lo = values[i - 1], gap.lo_open = true;
    if (i < values.size()) gap.hi = values[i], gap.hi_open = true;
    if (own.lo > gap.lo || (own.lo == gap.lo && own.lo_open))
      gap.lo = own.lo, gap.lo_open = own.lo_open;
    if (own.hi < gap.hi || (own.hi == gap.hi && own.hi_open))
      gap.hi = own.hi, gap.hi_open = own.hi_open;
    if (type == "integer") {  // closed integer ends
      double lo = gap.lo_open ? std::floor(gap.lo) + 1 : std::ceil(gap.lo);
      double hi = gap.hi_open ? std::ceil(gap.hi) - 1 : std::floor(gap.hi);
      if (lo > hi) continue;
      Json branch = base;
      if (std::isfinite(lo)) branch["minimum"] = static_cast<int64_t>(lo);
      if (std::isfinite(hi)) branch["maximum"] = static_cast<int64_t>(hi);
      branches.push_back(branch);
      continue;
    }
    if (gap.Empty()) continue;
    Json branch = base;
    if (std::isfinite(gap.lo)) branch[gap.lo_open ? "exclusiveMinimum" : "minimum"] = gap.lo;
    if (std::isfinite(gap.hi)) branch[gap.hi_open ? "exclusiveMaximum" : "maximum"] = gap.hi;
    branches.push_back(branch);
  }
  return absl::OkStatus();
}

absl::StatusOr<Json> ExcludeValues(const Json& rest, const std::vector<Json>& excluded) {
  if (rest.contains("const") || rest.contains("enum")) {
    Json kept = Json::array();
    const Json listed = rest.contains("const") ? Json::array({rest["const"]}) : rest["enum"];
    for (const Json& v : listed) {
      if (std::find(excluded.begin(), excluded.end(), v) == excluded.end()) kept.push_back(v);
    }
    if (kept.empty()) return absl::InvalidArgumentError("'not' excludes every value 'enum' lists");
    Json out = rest;
    out.erase("const");
    out["enum"] = kept;
    return out;
  }
  std::vector<Json> branches;
  for (const std::string& type : BaseTypes(rest)) {
    std::vector<Json> hits;
    for (const Json& v : excluded) {
      if (HasType(v, type) || (type == "number" && v.is_number())) hits.push_back(v);
    }
    Json typed = Typed(rest, type);
    if (hits.empty()) {
      branches.push_back(typed);
    } else if (type == "boolean") {
      Json left = Json::array();
      for (bool b : {true, false}) {
        if (std::find(hits.begin(), hits.end(), Json(b)) == hits.end()) left.push_back(b);
      }
      if (!left.empty()) branches.push_back(Json{{"enum", left}});
    } else if (type == "integer" || type == "number") {
      std::vector<double> numbers;
      for (const Json& v : hits) numbers.push_back(v.get<double>());
      if (absl::Status st = NumericBranches(typed, type, numbers, branches); !st.ok()) return st;
    } else if (type == "string") {
      for (const char* key : {"pattern", "format", "minLength", "maxLength"}) {
        if (rest.contains(key)) return Refused(absl::StrCat("of strings beside '", key, "'"));
      }
      absl::StatusOr<std::string> pattern = ExcludingPattern(hits);
      if (!pattern.ok()) return pattern.status();
      typed["pattern"] = *pattern;
      branches.push_back(typed);
    } else if (type == "object" || type == "array") {
      return Refused(absl::StrCat("of ", type, " values"));
    }  // null: excluded whole
  }
  if (branches.empty()) return absl::InvalidArgumentError("'not' leaves no value");
  if (branches.size() == 1) return branches[0];
  return Json{{"anyOf", branches}};
}

}  // namespace

absl::StatusOr<Json> RewriteNot(const Json& schema) {
  Json rest = schema;
  rest.erase("not");
  const Json& excluded = schema["not"];
  if (excluded.is_boolean() && !excluded.get<bool>()) return rest;
  if (AcceptsEverything(excluded))
    return absl::InvalidArgumentError("'not' of a schema that accepts everything leaves no value");
  if (!excluded.is_object()) return absl::InvalidArgumentError("'not' must be a schema");
  std::vector<std::string> keys;
  for (const auto& [key, value] : excluded.items()) {
    if (!IsSchemaAnnotation(key)) keys.push_back(key);
  }
  if (keys == std::vector<std::string>{"type"}) {
    std::vector<std::string> out_types = BaseTypes(excluded);
    std::vector<std::string> kept;
    for (const std::string& type : BaseTypes(rest)) {
      const bool gone = std::find(out_types.begin(), out_types.end(), type) != out_types.end() ||
                        (type == "integer" && std::find(out_types.begin(), out_types.end(),
                                                        "number") != out_types.end());
      if (type == "number" &&
          std::find(out_types.begin(), out_types.end(), "integer") != out_types.end() && !gone) {
        return Refused("of integers among numbers");
      }
      if (!gone) kept.push_back(type);
    }
    if (kept.empty())
      return absl::InvalidArgumentError("'not' excludes every type the schema allows");
    if (std::find(kept.begin(), kept.end(), "object") != kept.end()) {
      rest = Typed(rest, "object");  // open objects, as without `not`
    }
    rest["type"] = kept.size() == 1 ? Json(kept[0]) : Json(kept);
    return rest;
  }
  if (keys == std::vector<std::string>{"const"} || keys == std::vector<std::string>{"enum"}) {
    std::vector<Json> values;
    if (excluded.contains("const")) {
      values.push_back(excluded["const"]);
    } else if (excluded["enum"].is_array()) {
      for (const Json& v : excluded["enum"]) values.push_back(v);
    }
    return ExcludeValues(rest, values);
  }
  return Refused("(other than of types or of a finite set of values)");
}

}  // namespace loom::common
