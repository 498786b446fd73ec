#include "common/grammar/json_schema_grammar.h"

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/grammar/json_array_grammar.h"
#include "common/grammar/json_schema_merge.h"
#include "common/grammar/json_schema_not.h"
#include "common/grammar/json_schema_refs.h"
#include "common/grammar/number_range_grammar.h"
#include "common/grammar/regex_grammar.h"
#include "common/json_depth.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace loom::common {
namespace {

using Json = nlohmann::ordered_json;  // keeps properties in the schema's order
using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

GrammarExprPtr Lit(std::string s) { return LiteralExpr(std::move(s)); }
GrammarExprPtr Ref(std::string s) { return RuleRefExpr(std::move(s)); }
GrammarExprPtr Seq(std::vector<GrammarExprPtr> v) { return SequenceExpr(std::move(v)); }
GrammarExprPtr Alt(std::vector<GrammarExprPtr> v) { return ChoiceExpr(std::move(v)); }
GrammarExprPtr Opt(GrammarExprPtr e) { return RepeatExpr(std::move(e), 0, 1); }
GrammarExprPtr Digits(int32_t lo, int32_t hi) { return RepeatExpr(CharClassExpr({{'0', '9'}}), lo, hi); }
GrammarExprPtr Digit(char lo, char hi) { return CharClassExpr({{uint32_t(lo), uint32_t(hi)}}); }

// The shared rules every schema grammar may use.
void AddBaseRules(GrammarDefinition& d) {
  d.SetRule("ws", Opt(Lit(" ")));
  d.SetRule("json-char",
            Alt({CharClassExpr({{'"', '"'}, {'\\', '\\'}, {0, 0x1F}}, /*negated=*/true),
                 Seq({Lit("\\"), Alt({CharClassExpr({{'"', '"'}, {'\\', '\\'}, {'/', '/'}, {'b', 'b'},
                                                     {'f', 'f'}, {'n', 'n'}, {'r', 'r'}, {'t', 't'}}),
                                      Seq({Lit("u"), RepeatExpr(CharClassExpr({{'0', '9'}, {'a', 'f'}, {'A', 'F'}}), 4, 4)})})})}));
  d.SetRule("json-string", Seq({Lit("\""), RepeatExpr(Ref("json-char"), 0, -1), Lit("\"")}));
  d.SetRule("json-int", Seq({Opt(Lit("-")), Alt({Lit("0"), Seq({Digit('1', '9'), Digits(0, 15)})})}));
  d.SetRule("json-number",
            Seq({Ref("json-int"), Opt(Seq({Lit("."), Digits(1, 16)})),
                 Opt(Seq({CharClassExpr({{'e', 'e'}, {'E', 'E'}}), Opt(CharClassExpr({{'+', '+'}, {'-', '-'}})),
                          Digits(1, 3)}))}));
  d.SetRule("json-value", Alt({Ref("json-object"), Ref("json-array"), Ref("json-string"),
                               Ref("json-number"), Lit("true"), Lit("false"), Lit("null")}));
  auto member = Seq({Ref("json-string"), Ref("ws"), Lit(":"), Ref("ws"), Ref("json-value")});
  d.SetRule("json-object",
            Seq({Lit("{"), Ref("ws"),
                 Opt(Seq({member, RepeatExpr(Seq({Ref("ws"), Lit(","), Ref("ws"), member}), 0, -1)})),
                 Ref("ws"), Lit("}")}));
  d.SetRule("json-array",
            Seq({Lit("["), Ref("ws"),
                 Opt(Seq({Ref("json-value"),
                          RepeatExpr(Seq({Ref("ws"), Lit(","), Ref("ws"), Ref("json-value")}), 0, -1)})),
                 Ref("ws"), Lit("]")}));
}

class SchemaCompiler {
 public:
  explicit SchemaCompiler(const Json& root) : root_(root) {}

  absl::StatusOr<GrammarDefinition> Run() {
    AddBaseRules(d_);
    root_rule_ = "schema";
    auto expr = Compile(root_, "#");
    if (!expr.ok()) return expr.status();
    d_.SetRule("schema", *expr);
    for (size_t i = 0; i < pending_refs_.size(); ++i) {
      const auto [name, pointer] = pending_refs_[i];
      const Json* target = Resolve(pointer);
      if (target == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat("$ref '", pointer, "' does not resolve"));
      }
      auto body = Compile(*target, pointer);
      if (!body.ok()) return body.status();
      d_.SetRule(name, *body);
    }
    d_.SetRule("root", Ref("schema"));
    return std::move(d_);
  }

 private:
  absl::Status Unsupported(const std::string& keyword, const std::string& at) const {
    return absl::InvalidArgumentError(
        absl::StrCat("JSON Schema keyword '", keyword, "' at ", at, " is not supported"));
  }
  absl::Status Invalid(const std::string& what, const std::string& at) const {
    return absl::InvalidArgumentError(absl::StrCat("JSON Schema at ", at, ": ", what));
  }

  const Json* Resolve(const std::string& pointer) const { return ResolveLocalRef(root_, pointer); }

  std::string NewRule(const std::string& hint) { return absl::StrCat("s", next_rule_++, "-", hint); }

  // A rule name for `e` so repeated uses share it.
  GrammarExprPtr Named(const std::string& hint, GrammarExprPtr e) {
    const std::string name = NewRule(hint);
    d_.SetRule(name, std::move(e));
    return Ref(name);
  }

  absl::StatusOr<GrammarExprPtr> Compile(const Json& s, const std::string& at) {
    if (s.is_boolean()) {
      if (s.get<bool>()) return Ref("json-value");
      return Invalid("the schema false accepts nothing", at);
    }
    if (!s.is_object()) return Invalid("a schema must be an object or a boolean", at);
    static const absl::flat_hash_set<std::string> kKnown = {"type",
                                                            "properties",
                                                            "required",
                                                            "additionalProperties",
                                                            "items",
                                                            "minItems",
                                                            "maxItems",
                                                            "enum",
                                                            "const",
                                                            "anyOf",
                                                            "oneOf",
                                                            "allOf",
                                                            "$ref",
                                                            "minLength",
                                                            "maxLength",
                                                            "pattern",
                                                            "format",
                                                            "minimum",
                                                            "maximum",
                                                            "exclusiveMinimum",
                                                            "exclusiveMaximum",
                                                            "uniqueItems",
                                                            "patternProperties",
                                                            "minProperties",
                                                            "maxProperties",
                                                            "multipleOf",
                                                            "not",
                                                            "prefixItems",
                                                            "unevaluatedProperties",
                                                            "unevaluatedItems"};
    for (const auto& [key, value] : s.items()) {
      if (IsSchemaAnnotation(key) || kKnown.contains(key)) continue;
      return Unsupported(key, at);
    }
    if (s.contains("$ref")) {
      if (!s["$ref"].is_string()) return Invalid("'$ref' must be a string", at);
      const std::string pointer = s["$ref"].get<std::string>();
      if (pointer.empty() || pointer[0] != '#') {
        return Invalid(absl::StrCat("only local $ref ('#...') is supported, not '", pointer, "'"), at);
      }
      for (const auto& [key, value] : s.items()) {
        if (key == "$ref" || IsSchemaAnnotation(key)) continue;
        // Keywords beside $ref apply too: one schema for both, when they merge.
        const Json* target = Resolve(pointer);
        if (target == nullptr)
          return Invalid(absl::StrCat("$ref '", pointer, "' does not resolve"), at);
        Json siblings = s;
        siblings.erase("$ref");
        std::optional<Json> merged = MergeIntoApplicator(siblings, *target);
        if (++merges_ > kMaxMerges) return Unsupported("schemas merging more than 1000 times", at);
        if (!merged) {
          return Invalid(absl::StrCat("'$ref' with sibling keyword '", key, "' is not supported"),
                         at);
        }
        return Compile(*merged, at);
      }
      if (pointer == "#") return Ref("schema");
      auto it = ref_rules_.find(pointer);
      if (it == ref_rules_.end()) {
        if (Resolve(pointer) == nullptr) return Invalid(absl::StrCat("$ref '", pointer, "' does not resolve"), at);
        it = ref_rules_.emplace(pointer, NewRule("ref")).first;
        pending_refs_.emplace_back(it->second, pointer);
      }
      return Ref(it->second);
    }
    if (s.contains("not")) {
      absl::StatusOr<Json> rewritten = RewriteNot(s);
      if (!rewritten.ok()) return Invalid(std::string(rewritten.status().message()), at);
      return Compile(*rewritten, at);
    }
    if (s.contains("const")) return Lit(s["const"].dump());
    if (s.contains("enum")) {
      if (!s["enum"].is_array() || s["enum"].empty()) return Invalid("'enum' must be a non-empty array", at);
      std::vector<GrammarExprPtr> alts;
      for (const auto& v : s["enum"]) alts.push_back(Lit(v.dump()));
      return Alt(std::move(alts));
    }
    for (const char* combinator : {"anyOf", "oneOf", "allOf"}) {
      if (!s.contains(combinator)) continue;
      return Combinator(s, combinator, at);
    }
    if (s.contains("unevaluatedProperties") || s.contains("unevaluatedItems")) {
      return Compile(WithoutUnevaluated(s), at);  // every subschema is merged by now
    }
    std::vector<std::string> types;
    if (s.contains("type")) {
      const Json& t = s["type"];
      if (t.is_string()) {
        types.push_back(t.get<std::string>());
      } else if (t.is_array()) {
        for (const auto& v : t) {
          if (!v.is_string()) return Invalid("'type' entries must be strings", at);
          types.push_back(v.get<std::string>());
        }
      } else {
        return Invalid("'type' must be a string or an array", at);
      }
    } else {
      // Keywords imply the type; none at all accepts any value.
      types = ImpliedTypes(s);
      if (types.empty()) return Ref("json-value");
    }
    std::vector<GrammarExprPtr> alts;
    for (const std::string& type : types) {
      absl::StatusOr<GrammarExprPtr> e;
      if (type == "object") e = Object(s, at);
      else if (type == "array") e = Array(s, at);
      else if (type == "string") e = String(s, at);
      else if (type == "integer") e = Integer(s, at);
      else if (type == "number") e = Number(s, at);
      else if (type == "boolean") e = Alt({Lit("true"), Lit("false")});
      else if (type == "null") e = Lit("null");
      else return Invalid(absl::StrCat("unknown type '", type, "'"), at);
      if (!e.ok()) return e;
      alts.push_back(*e);
    }
    return Alt(std::move(alts));
  }

  // anyOf / oneOf / allOf, with the keywords beside them merged into each branch (anyOf,
  // oneOf) or into the one schema all members merge to (allOf). `false` branches are
  // dropped. oneOf is compiled as anyOf (vLLM's and xgrammar's reading): a value may match
  // more than one branch, except where branches that accept everything make that certain
  // (refused).
  absl::StatusOr<GrammarExprPtr> Combinator(const Json& s, const std::string& combinator,
                                            const std::string& at) {
    const Json& list = s[combinator];
    if (!list.is_array() || list.empty())
      return Invalid(absl::StrCat("'", combinator, "' must be a non-empty array"), at);
    Json siblings = Json::object();
    std::string sibling_key;
    for (const auto& [key, value] : s.items()) {
      if (key == combinator || IsSchemaAnnotation(key)) continue;
      siblings[key] = value;
      if (sibling_key.empty()) sibling_key = key;
    }
    const auto refused = [&] {
      return Invalid(absl::StrCat("'", combinator, "' with sibling keyword '", sibling_key,
                                  "' is not supported"),
                     at);
    };
    if ((!siblings.empty() || combinator == "allOf") && ++merges_ > kMaxMerges) {
      return Unsupported("schemas merging more than 1000 times", at);
    }
    if (combinator == "allOf") {
      std::optional<Json> merged = Json(true);
      for (const Json& member : list) {
        const Json* resolved = &member;
        if (member.is_object() && member.contains("$ref") && member["$ref"].is_string()) {
          resolved = Resolve(member["$ref"].get<std::string>());
          if (resolved == nullptr || member.size() > 1) resolved = &member;
        }
        merged = IntersectSchemas(*merged, *resolved);
        if (!merged)
          return Unsupported("allOf (of schemas that set the same keyword differently)", at);
      }
      if (!siblings.empty()) merged = MergeIntoApplicator(siblings, *merged);
      if (!merged)
        return Unsupported("allOf (of schemas that set the same keyword differently)", at);
      if (merged->is_boolean() && !merged->get<bool>())
        return Invalid("the schemas of 'allOf' accept nothing together", at);
      return Compile(*merged, at);
    }
    std::vector<Json> branches;
    for (const Json& branch : list) {
      if (branch.is_boolean() && !branch.get<bool>()) continue;  // matches nothing
      std::optional<Json> merged =
          siblings.empty() ? std::optional<Json>(branch) : MergeIntoApplicator(siblings, branch);
      if (!merged) return refused();
      if (merged->is_boolean() && !merged->get<bool>()) continue;
      branches.push_back(*merged);
    }
    if (branches.empty())
      return Invalid(absl::StrCat("no branch of '", combinator, "' accepts anything"), at);
    if (combinator == "oneOf" && branches.size() > 1) {
      for (size_t i = 0; i < branches.size(); ++i) {
        for (size_t j = i + 1; j < branches.size(); ++j) {
          if (AcceptsEverything(branches[i]) || AcceptsEverything(branches[j]) ||
              branches[i] == branches[j]) {
            return Invalid(absl::StrCat("'oneOf' branches ", i, " and ", j,
                                        " accept the same values: no value matches exactly one"),
                           at);
          }
        }
      }
    }
    std::vector<GrammarExprPtr> alts;
    for (size_t i = 0; i < branches.size(); ++i) {
      auto e = Compile(branches[i], absl::StrCat(at, "/", combinator, "/", i));
      if (!e.ok()) return e;
      alts.push_back(*e);
    }
    return Alt(std::move(alts));
  }

  absl::StatusOr<GrammarExprPtr> Object(const Json& s, const std::string& at) {
    std::vector<std::pair<std::string, GrammarExprPtr>> props;  // key literal, member expr
    std::vector<bool> required;
    absl::flat_hash_set<std::string> required_names;
    if (s.contains("required")) {
      if (!s["required"].is_array()) return Invalid("'required' must be an array", at);
      for (const auto& r : s["required"]) {
        if (!r.is_string()) return Invalid("'required' entries must be strings", at);
        required_names.insert(r.get<std::string>());
      }
    }
    absl::flat_hash_set<std::string> declared;
    if (s.contains("properties")) {
      if (!s["properties"].is_object()) return Invalid("'properties' must be an object", at);
      for (const auto& [name, sub] : s["properties"].items()) {
        if (sub.is_boolean() && !sub.get<bool>()) {  // the property must be absent
          if (required_names.contains(name)) {
            return Invalid(absl::StrCat("required property '", name, "' has the schema false"), at);
          }
          declared.insert(name);
          continue;
        }
        auto value = Compile(sub, absl::StrCat(at, "/properties/", name));
        if (!value.ok()) return value;
        props.emplace_back(name, Seq({Lit(Json(name).dump()), Ref("ws"), Lit(":"), Ref("ws"), *value}));
        required.push_back(required_names.contains(name));
        declared.insert(name);
      }
    }
    for (const auto& name : required_names) {
      if (!declared.contains(name)) {
        // A required property without a schema: any value under that name.
        props.emplace_back(name, Seq({Lit(Json(name).dump()), Ref("ws"), Lit(":"), Ref("ws"), Ref("json-value")}));
        required.push_back(true);
      }
    }
    auto extra = ExtraMembers(s, at);
    if (!extra.ok()) return extra.status();
    auto lo = Count(s, "minProperties", at, 0);
    if (!lo.ok()) return lo.status();
    auto hi = Count(s, "maxProperties", at, -1);
    if (!hi.ok()) return hi.status();
    if (*hi >= 0 && *hi < *lo) return Invalid("maxProperties is below minProperties", at);
    if (s.contains("minProperties") || s.contains("maxProperties")) {
      return CountedMembers(props, required, *extra, *lo, *hi, at);
    }
    return Members(props, required, *extra);
  }

  // The members beyond `properties`: additionalProperties' schema under any key, and each
  // patternProperties schema under keys matching its pattern. Null: none allowed.
  absl::StatusOr<GrammarExprPtr> ExtraMembers(const Json& s, const std::string& at) {
    std::vector<GrammarExprPtr> alts;
    if (s.contains("patternProperties")) {
      const Json& patterns = s["patternProperties"];
      if (!patterns.is_object()) return Invalid("'patternProperties' must be an object", at);
      if (s.contains("additionalProperties") && !(s["additionalProperties"].is_boolean() &&
                                                  !s["additionalProperties"].get<bool>())) {
        // A key the additional schema writes could match a pattern whose schema its value
        // breaks.
        return Unsupported("patternProperties together with additionalProperties", at);
      }
      for (const auto& [pattern, sub] : patterns.items()) {
        RegexOptions options;
        options.json_string = true;
        options.search = true;
        auto key = RegexToExpr(pattern, options);
        if (!key.ok()) return Invalid(std::string(key.status().message()), at + "/patternProperties");
        auto value = Compile(sub, absl::StrCat(at, "/patternProperties/", pattern));
        if (!value.ok()) return value;
        alts.push_back(Seq({Lit("\""), *key, Lit("\""), Ref("ws"), Lit(":"), Ref("ws"), *value}));
      }
    }
    if (s.contains("additionalProperties")) {
      const Json& ap = s["additionalProperties"];
      if (!(ap.is_boolean() && !ap.get<bool>())) {
        auto value = Compile(ap, at + "/additionalProperties");
        if (!value.ok()) return value;
        alts.push_back(Seq({Ref("json-string"), Ref("ws"), Lit(":"), Ref("ws"), *value}));
      }
    }
    if (alts.empty()) return GrammarExprPtr();
    return Named("extra", alts.size() == 1 ? alts[0] : Alt(std::move(alts)));
  }

  static GrammarExprPtr Sep(GrammarExprPtr member) {
    return Seq({Ref("ws"), Lit(","), Ref("ws"), std::move(member)});
  }

  // The object of `props` in order (required ones always, optional ones may be skipped),
  // then any number of `extra` members.
  GrammarExprPtr Members(const std::vector<std::pair<std::string, GrammarExprPtr>>& props,
                         const std::vector<bool>& required, const GrammarExprPtr& extra) {
    const size_t n = props.size();
    // after[i]: properties i.. when something was already written; first[i]: when not.
    std::vector<GrammarExprPtr> after(n + 1), first(n + 1);
    after[n] = extra ? RepeatExpr(Sep(extra), 0, -1) : EmptyExpr();
    first[n] = extra ? Opt(Seq({extra, after[n]})) : EmptyExpr();
    after[n] = Named("after", after[n]);
    first[n] = Named("first", first[n]);
    for (size_t k = n; k-- > 0;) {
      auto with = Seq({Sep(props[k].second), after[k + 1]});
      after[k] = Named("after", required[k] ? with : Alt({with, after[k + 1]}));
      auto start = Seq({props[k].second, after[k + 1]});
      first[k] = Named("first", required[k] ? start : Alt({start, first[k + 1]}));
    }
    return Seq({Lit("{"), Ref("ws"), first[0], Ref("ws"), Lit("}")});
  }

  // Members, counting them: between lo and hi (< 0: unbounded) members in all. One rule per
  // (next property, members written so far).
  absl::StatusOr<GrammarExprPtr> CountedMembers(
      const std::vector<std::pair<std::string, GrammarExprPtr>>& props,
      const std::vector<bool>& required, const GrammarExprPtr& extra, int64_t lo, int64_t hi,
      const std::string& at) {
    const int64_t n = static_cast<int64_t>(props.size());
    int64_t required_count = 0;
    for (bool r : required) required_count += r ? 1 : 0;
    if (hi >= 0 && required_count > hi) return Invalid("more required properties than maxProperties", at);
    if (!extra && lo > n) return Invalid("minProperties is above the properties there can be", at);
    const int64_t cap = hi >= 0 ? hi : std::max<int64_t>(lo, n);  // counts above are all alike
    // state[k][c]: the members from property k on, c written so far; null: impossible.
    std::vector<std::vector<GrammarExprPtr>> state(n + 1, std::vector<GrammarExprPtr>(cap + 1));
    for (int64_t c = 0; c <= cap; ++c) {
      std::vector<GrammarExprPtr> tails;
      if (c >= lo) tails.push_back(EmptyExpr());
      if (extra && (hi < 0 || c < hi)) {
        const int32_t min_extra = static_cast<int32_t>(std::max<int64_t>(lo - c, 1));
        const int32_t max_extra = hi < 0 ? -1 : static_cast<int32_t>(hi - c);
        if (c == 0) {
          tails.push_back(Seq({extra, RepeatExpr(Sep(extra), min_extra - 1, max_extra < 0 ? -1 : max_extra - 1)}));
        } else {
          tails.push_back(RepeatExpr(Sep(extra), min_extra, max_extra));
        }
      }
      if (!tails.empty()) state[n][c] = Named("members", Alt(std::move(tails)));
    }
    for (int64_t k = n; k-- > 0;) {
      for (int64_t c = 0; c <= cap; ++c) {
        std::vector<GrammarExprPtr> alts;
        const int64_t next = std::min(c + 1, cap);
        if ((hi < 0 || c < hi) && state[k + 1][next]) {
          alts.push_back(Seq({c == 0 ? props[k].second : Sep(props[k].second), state[k + 1][next]}));
        }
        if (!required[k] && state[k + 1][c]) alts.push_back(state[k + 1][c]);
        if (!alts.empty()) state[k][c] = Named("members", Alt(std::move(alts)));
      }
    }
    if (!state[0][0]) return Invalid("no object satisfies minProperties/maxProperties", at);
    return Seq({Lit("{"), Ref("ws"), state[0][0], Ref("ws"), Lit("}")});
  }

  absl::StatusOr<int64_t> Count(const Json& s, const char* key, const std::string& at, int64_t fallback) {
    if (!s.contains(key)) return fallback;
    const Json& v = s[key];
    // 2.0 is an integer in JSON Schema.
    const bool integral = v.is_number_integer() ||
                          (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>() &&
                           std::abs(v.get<double>()) < 1e15);
    if (!integral || v.get<double>() < 0) {
      return Invalid(absl::StrCat("'", key, "' must be a non-negative integer"), at);
    }
    const int64_t count = static_cast<int64_t>(v.get<double>());
    if (count > 1000) {
      return Invalid(absl::StrCat("'", key, "' of ", count, " is above the supported 1000"), at);
    }
    return count;
  }

  absl::StatusOr<GrammarExprPtr> Array(const Json& s, const std::string& at) {
    GrammarExprPtr item = Ref("json-value");
    if (s.contains("prefixItems")) return Tuple(s, at);
    if (s.contains("items") && s["items"].is_boolean() && !s["items"].get<bool>()) {
      auto lo = Count(s, "minItems", at, 0);
      if (!lo.ok()) return lo.status();
      if (*lo > 0) return Invalid("'items' false allows no item but minItems asks for some", at);
      return Seq({Lit("["), Ref("ws"), Lit("]")});
    }
    if (s.contains("items")) {
      if (s["items"].is_array()) return Unsupported("items (as an array: tuple validation)", at);
      auto e = Compile(s["items"], at + "/items");
      if (!e.ok()) return e;
      item = Named("item", *e);
    }
    auto lo = Count(s, "minItems", at, 0);
    if (!lo.ok()) return lo.status();
    auto hi = Count(s, "maxItems", at, -1);
    if (!hi.ok()) return hi.status();
    if (*hi >= 0 && *hi < *lo) return Invalid("maxItems is below minItems", at);
    if (*hi == 0) return Seq({Lit("["), Ref("ws"), Lit("]")});
    if (s.contains("uniqueItems") && s["uniqueItems"] == true) return UniqueItems(s, *lo, *hi, at);
    auto rest = RepeatExpr(Seq({Ref("ws"), Lit(","), Ref("ws"), item}), static_cast<int32_t>(std::max<int64_t>(*lo - 1, 0)),
                           *hi < 0 ? -1 : static_cast<int32_t>(*hi - 1));
    auto items = Seq({item, rest});
    return Seq({Lit("["), Ref("ws"), *lo > 0 ? items : Opt(items), Ref("ws"), Lit("]")});
  }

  // prefixItems: each leading item its own schema, then `items` (false: nothing more).
  absl::StatusOr<GrammarExprPtr> Tuple(const Json& s, const std::string& at) {
    const Json& list = s["prefixItems"];
    if (!list.is_array() || list.empty())
      return Invalid("'prefixItems' must be a non-empty array", at);
    if (s.contains("uniqueItems") && s["uniqueItems"] == true)
      return Unsupported("uniqueItems with prefixItems", at);
    std::vector<GrammarExprPtr> prefix;
    for (size_t i = 0; i < list.size(); ++i) {
      auto e = Compile(list[i], absl::StrCat(at, "/prefixItems/", i));
      if (!e.ok()) return e;
      prefix.push_back(*e);
    }
    GrammarExprPtr rest = Ref("json-value");
    if (s.contains("items") && s["items"].is_boolean() && !s["items"].get<bool>()) {
      rest = nullptr;
    } else if (s.contains("items")) {
      auto e = Compile(s["items"], at + "/items");
      if (!e.ok()) return e;
      rest = Named("item", *e);
    }
    auto lo = Count(s, "minItems", at, 0);
    if (!lo.ok()) return lo.status();
    auto hi = Count(s, "maxItems", at, -1);
    if (!hi.ok()) return hi.status();
    GrammarExprPtr tuple = TupleArrayExpr(prefix, rest, *lo, *hi);
    if (tuple == nullptr)
      return Invalid("minItems is above the items prefixItems and 'items: false' allow", at);
    return Named("tuple", tuple);
  }

  // uniqueItems over a finite set of item values (enum, const, boolean, null): the
  // values in the schema's order, each at most once, between lo and hi (< 0: any) items.
  absl::StatusOr<GrammarExprPtr> UniqueItems(const Json& s, int64_t lo, int64_t hi, const std::string& at) {
    std::vector<std::string> values;
    const Json items = s.contains("items") ? s["items"] : Json(true);
    if (items.is_object() && items.contains("enum") && items["enum"].is_array()) {
      for (const Json& v : items["enum"]) values.push_back(v.dump());
    } else if (items.is_object() && items.contains("const")) {
      values.push_back(items["const"].dump());
    } else if (items.is_object() && items.value("type", Json()) == "boolean") {
      values = {"true", "false"};
    } else if (items.is_object() && items.value("type", Json()) == "null") {
      values = {"null"};
    } else {
      return Unsupported("uniqueItems (on items other than enum, const, boolean or null)", at);
    }
    const int64_t k = static_cast<int64_t>(values.size());
    if (k > 64) return Unsupported("uniqueItems over more than 64 values", at);
    if (lo > k) return Invalid("minItems is above the distinct values there are", at);
    const int64_t cap = hi >= 0 ? std::min(hi, k) : k;
    // state[i][c]: values from i on, c written so far.
    std::vector<std::vector<GrammarExprPtr>> state(k + 1, std::vector<GrammarExprPtr>(cap + 1));
    for (int64_t c = lo; c <= cap; ++c) state[k][c] = EmptyExpr();
    for (int64_t i = k; i-- > 0;) {
      for (int64_t c = 0; c <= cap; ++c) {
        std::vector<GrammarExprPtr> alts;
        if (c < cap && state[i + 1][c + 1]) {
          GrammarExprPtr value = Lit(values[i]);
          alts.push_back(Seq({c == 0 ? value : Sep(value), state[i + 1][c + 1]}));
        }
        if (state[i + 1][c]) alts.push_back(state[i + 1][c]);
        if (!alts.empty()) state[i][c] = Named("unique", Alt(std::move(alts)));
      }
    }
    return Seq({Lit("["), Ref("ws"), state[0][0], Ref("ws"), Lit("]")});
  }

  absl::StatusOr<GrammarExprPtr> String(const Json& s, const std::string& at) {
    auto lo = Count(s, "minLength", at, 0);
    if (!lo.ok()) return lo.status();
    auto hi = Count(s, "maxLength", at, -1);
    if (!hi.ok()) return hi.status();
    if (*hi >= 0 && *hi < *lo) return Invalid("maxLength is below minLength", at);
    const bool has_length = s.contains("minLength") || s.contains("maxLength");
    if (s.contains("pattern")) {
      if (has_length) return Unsupported("pattern together with minLength/maxLength", at);
      if (!s["pattern"].is_string()) return Invalid("'pattern' must be a string", at);
      RegexOptions options;
      options.json_string = true;
      options.search = true;
      auto e = RegexToExpr(s["pattern"].get<std::string>(), options);
      if (!e.ok()) return Invalid(std::string(e.status().message()), at + "/pattern");
      return Seq({Lit("\""), *e, Lit("\"")});
    }
    if (s.contains("format")) {
      if (has_length) return Unsupported("format together with minLength/maxLength", at);
      const std::string format = s["format"].is_string() ? s["format"].get<std::string>() : "";
      auto two = [] { return Digits(2, 2); };
      auto date = Seq({Digits(4, 4), Lit("-"), Alt({Seq({Lit("0"), Digit('1', '9')}), Seq({Lit("1"), Digit('0', '2')})}),
                       Lit("-"), Alt({Seq({Lit("0"), Digit('1', '9')}), Seq({Digit('1', '2'), Digit('0', '9')}), Seq({Lit("3"), Digit('0', '1')})})});
      auto clock = Seq({Alt({Seq({Digit('0', '1'), Digit('0', '9')}), Seq({Lit("2"), Digit('0', '3')})}), Lit(":"),
                        Digit('0', '5'), Digit('0', '9'), Lit(":"), Digit('0', '5'), Digit('0', '9'),
                        Opt(Seq({Lit("."), Digits(1, 6)}))});
      auto offset = Alt({Lit("Z"), Seq({CharClassExpr({{'+', '+'}, {'-', '-'}}),
                                        Alt({Seq({Digit('0', '1'), Digit('0', '9')}), Seq({Lit("2"), Digit('0', '3')})}),
                                        Lit(":"), Digit('0', '5'), Digit('0', '9')})});
      (void)two;
      auto hex = [](int32_t n) { return RepeatExpr(CharClassExpr({{'0', '9'}, {'a', 'f'}, {'A', 'F'}}), n, n); };
      GrammarExprPtr body;
      if (format == "date-time") body = Seq({date, Lit("T"), clock, offset});
      else if (format == "date") body = date;
      else if (format == "time") body = Seq({clock, offset});
      else if (format == "uuid") body = Seq({hex(8), Lit("-"), hex(4), Lit("-"), hex(4), Lit("-"), hex(4), Lit("-"), hex(12)});
      else if (format == "email") {
        auto local = RepeatExpr(CharClassExpr({{'a', 'z'}, {'A', 'Z'}, {'0', '9'}, {'.', '.'}, {'_', '_'}, {'+', '+'}, {'-', '-'}}), 1, 64);
        auto label = RepeatExpr(CharClassExpr({{'a', 'z'}, {'A', 'Z'}, {'0', '9'}, {'-', '-'}}), 1, 63);
        body = Seq({local, Lit("@"), label, RepeatExpr(Seq({Lit("."), label}), 1, 4)});
      } else if (format == "ipv4") {
        auto octet = NonNegativeIntegerRange(0, 255);
        body = Seq({octet, Lit("."), octet, Lit("."), octet, Lit("."), octet});
      } else {
        return Unsupported(absl::StrCat("format '", format, "'"), at);
      }
      return Seq({Lit("\""), Named("format", body), Lit("\"")});
    }
    return Seq({Lit("\""), RepeatExpr(Ref("json-char"), static_cast<int32_t>(*lo), static_cast<int32_t>(*hi)), Lit("\"")});
  }

  // Integer bounds from minimum/maximum/exclusive*; nullopt-like flags for absent ones.
  absl::Status Bounds(const Json& s, const std::string& at, bool& has_lo, int64_t& lo, bool& has_hi, int64_t& hi) {
    has_lo = has_hi = false;
    auto read = [&](const char* key, double& out) -> absl::StatusOr<bool> {
      if (!s.contains(key)) return false;
      if (!s[key].is_number()) return Invalid(absl::StrCat("'", key, "' must be a number"), at);
      out = s[key].get<double>();
      if (std::fabs(out) > 1e15) return Invalid(absl::StrCat("'", key, "' beyond 1e15 is not supported"), at);
      return true;
    };
    double v;
    for (const char* key : {"minimum", "exclusiveMinimum"}) {
      auto present = read(key, v);
      if (!present.ok()) return present.status();
      if (!*present) continue;
      int64_t bound = std::string(key) == "minimum" ? static_cast<int64_t>(std::ceil(v))
                                                    : static_cast<int64_t>(std::floor(v)) + 1;
      lo = has_lo ? std::max(lo, bound) : bound;
      has_lo = true;
    }
    for (const char* key : {"maximum", "exclusiveMaximum"}) {
      auto present = read(key, v);
      if (!present.ok()) return present.status();
      if (!*present) continue;
      int64_t bound = std::string(key) == "maximum" ? static_cast<int64_t>(std::floor(v))
                                                    : static_cast<int64_t>(std::ceil(v)) - 1;
      hi = has_hi ? std::min(hi, bound) : bound;
      has_hi = true;
    }
    if (has_lo && has_hi && hi < lo) return Invalid("the range of values is empty", at);
    return absl::OkStatus();
  }

  absl::StatusOr<GrammarExprPtr> Integer(const Json& s, const std::string& at) {
    bool has_lo, has_hi;
    int64_t lo = 0, hi = 0;
    if (absl::Status st = Bounds(s, at, has_lo, lo, has_hi, hi); !st.ok()) return st;
    if (s.contains("multipleOf")) return MultipleOf(s, has_lo, lo, has_hi, hi, at);
    if (!has_lo && !has_hi) return Ref("json-int");
    std::vector<GrammarExprPtr> alts;
    // Non-negative part [max(lo, 0), hi].
    if (!has_hi || hi >= 0) {
      auto e = NonNegativeIntegerRange(has_lo ? static_cast<uint64_t>(std::max<int64_t>(lo, 0)) : 0, has_hi ? hi : -1);
      if (e) alts.push_back(e);
    }
    // Negative part: "-" and magnitudes [max(-hi, 1), -lo].
    if (!has_lo || lo < 0) {
      const uint64_t mag_lo = has_hi && hi < 0 ? static_cast<uint64_t>(-hi) : 1;
      auto e = NonNegativeIntegerRange(mag_lo, has_lo ? -lo : -1);
      if (e) alts.push_back(Seq({Lit("-"), e}));
    }
    return Named("int-range", Alt(std::move(alts)));
  }

  // Integers that are multiples of multipleOf (a positive integer): within bounds of at
  // most 4096 values, those multiples listed; unbounded, up to 16 digits whose value mod k
  // is tracked digit by digit (one rule per digit position and remainder, k <= 100).
  absl::StatusOr<GrammarExprPtr> MultipleOf(const Json& s, bool has_lo, int64_t lo, bool has_hi,
                                            int64_t hi, const std::string& at) {
    const Json& m = s["multipleOf"];
    if (!m.is_number() || m.get<double>() <= 0 || m.get<double>() != std::floor(m.get<double>()) ||
        m.get<double>() > 1e15) {
      return Unsupported("multipleOf (other than a positive integer)", at);
    }
    const int64_t k = static_cast<int64_t>(m.get<double>());
    if (has_lo && has_hi) {
      if (hi - lo > 4096 * k) return Unsupported("multipleOf over a range of more than 4096 multiples", at);
      std::vector<GrammarExprPtr> alts;
      // The first multiple at or above lo (C++'s % rounds toward zero).
      int64_t first = lo % k == 0 ? lo : lo + ((k - lo % k) % k);
      for (int64_t v = first; v <= hi; v += k) alts.push_back(Lit(std::to_string(v)));
      if (alts.empty()) return Invalid("no multiple of multipleOf lies in the range", at);
      return Named("multiple", Alt(std::move(alts)));
    }
    if (has_lo || has_hi) return Unsupported("multipleOf with only one bound", at);
    if (k > 100) return Unsupported("multipleOf above 100 without bounds", at);
    // tail[p][r]: the digits after p digits with remainder r; 16 digits at most.
    constexpr int kDigits = 16;
    std::vector<std::vector<GrammarExprPtr>> tail(kDigits + 1, std::vector<GrammarExprPtr>(k));
    const std::string prefix = NewRule("mod");
    for (int p = kDigits; p >= 1; --p) {
      for (int64_t r = 0; r < k; ++r) {
        std::vector<GrammarExprPtr> alts;
        if (r == 0) alts.push_back(EmptyExpr());
        if (p < kDigits) {
          for (int d = 0; d <= 9; ++d) {
            const int64_t next = (10 * r + d) % k;
            if (tail[p + 1][next]) alts.push_back(Seq({Lit(std::string(1, char('0' + d))), tail[p + 1][next]}));
          }
        }
        if (alts.empty()) continue;
        const std::string name = absl::StrCat(prefix, "-", p, "-", r);
        d_.SetRule(name, Alt(std::move(alts)));
        tail[p][r] = Ref(name);
      }
    }
    std::vector<GrammarExprPtr> leading;
    for (int d = 1; d <= 9; ++d) {
      if (tail[1][d % k]) leading.push_back(Seq({Lit(std::string(1, char('0' + d))), tail[1][d % k]}));
    }
    GrammarExprPtr magnitude = Alt(std::move(leading));
    return Named("multiple", Alt({Lit("0"), Seq({Opt(Lit("-")), magnitude})}));
  }

  absl::StatusOr<GrammarExprPtr> Number(const Json& s, const std::string& at) {
    if (s.contains("multipleOf")) return Unsupported("multipleOf on type number (use type integer)", at);
    // The tighter of each side's inclusive and exclusive bound (draft 2020-12: numbers).
    auto bound = [&](const char* inclusive, const char* exclusive, bool lower,
                     std::optional<DecimalBound>& out) -> absl::Status {
      for (const char* key : {inclusive, exclusive}) {
        if (!s.contains(key)) continue;
        if (!s[key].is_number()) return Invalid(absl::StrCat("'", key, "' must be a number"), at);
        const double value = s[key].get<double>();
        const bool is_exclusive = key == exclusive;
        if (out) {
          const double current = std::stod(out->text);
          const bool tighter = lower ? value > current : value < current;
          if (!tighter && !(value == current && is_exclusive)) continue;
        }
        out = DecimalBound{s[key].dump(), is_exclusive};
      }
      return absl::OkStatus();
    };
    std::optional<DecimalBound> lo;
    std::optional<DecimalBound> hi;
    if (absl::Status st = bound("minimum", "exclusiveMinimum", true, lo); !st.ok()) return st;
    if (absl::Status st = bound("maximum", "exclusiveMaximum", false, hi); !st.ok()) return st;
    if (!lo && !hi) return Ref("json-number");
    absl::StatusOr<GrammarExprPtr> range = DecimalRangeExpr(d_, NewRule("num"), lo, hi);
    if (!range.ok()) return Invalid(std::string(range.status().message()), at);
    if (*range == nullptr) return Invalid("the range of values is empty", at);
    return Named("num-range", *range);
  }

  const Json& root_;
  GrammarDefinition d_;
  std::string root_rule_;
  int next_rule_ = 0;
  // Schemas merged so far (allOf, keywords beside anyOf/oneOf/$ref): bounds the work a
  // schema of $refs merging into each other can ask for.
  static constexpr int kMaxMerges = 1000;
  int merges_ = 0;
  absl::flat_hash_map<std::string, std::string> ref_rules_;
  std::vector<std::pair<std::string, std::string>> pending_refs_;
};

}  // namespace

absl::StatusOr<GrammarDefinition> JsonSchemaGrammar(std::string_view schema_json) {
  // The compiler recurses per level (and copies and prints subschemas): bounded first.
  LOOM_RETURN_IF_ERROR(CheckJsonNestingDepth(schema_json, "the JSON Schema"));
  Json schema = Json::parse(schema_json, nullptr, /*allow_exceptions=*/false);
  if (schema.is_discarded()) return absl::InvalidArgumentError("JSON Schema is not valid JSON");
  return SchemaCompiler(schema).Run();
}

GrammarDefinition JsonObjectGrammar() {
  GrammarDefinition d;
  AddBaseRules(d);
  d.SetRule("root", Ref("json-object"));
  return d;
}

}  // namespace loom::common
