#include "common/grammar/json_schema_grammar.h"

#include <cstdio>
#include <string>
#include <vector>

#include "common/json_depth.h"
#include "gtest/gtest.h"
#include "tests/common/grammar_test_util.h"

namespace loom::common {
namespace {

using testing::SchemaAccepts;

TEST(JsonSchemaGrammarTest, ObjectPropertiesInSchemaOrderRequiredAndOptional) {
  const std::string schema = R"({"type":"object","properties":{"a":{"type":"integer"},
      "b":{"type":"string"},"c":{"type":"boolean"}},"required":["b"]})";
  EXPECT_TRUE(SchemaAccepts(schema, R"({"b":"x"})"));
  EXPECT_TRUE(SchemaAccepts(schema, R"({"a": 1, "b": "x", "c": true})"));
  EXPECT_TRUE(SchemaAccepts(schema, R"({"a":-3,"b":""})"));
  EXPECT_FALSE(SchemaAccepts(schema, R"({"a":1})"));             // b missing
  EXPECT_FALSE(SchemaAccepts(schema, R"({"b":"x","d":1})"));     // no additional
  EXPECT_FALSE(SchemaAccepts(schema, R"({"b":"x",})"));
  EXPECT_FALSE(SchemaAccepts(schema, R"({"a":1.5,"b":"x"})"));
}

// The compiler recurses per level: a schema nested beyond the limit is refused by name
// (10,000 levels crashed the coordinator), one within it compiles.
TEST(JsonSchemaGrammarTest, SchemasNestedBeyondTheLimitAreRefused) {
  const auto nested = [](int levels) {
    std::string schema;
    for (int i = 0; i < levels; ++i) schema += R"({"type":"array","items":)";
    return schema + R"({"type":"integer"})" + std::string(levels, '}');
  };
  EXPECT_TRUE(SchemaAccepts(nested(100), std::string(100, '[') + "7" + std::string(100, ']')));
  for (const int levels : {kMaxJsonNestingDepth, 10'000}) {
    auto d = JsonSchemaGrammar(nested(levels));
    ASSERT_FALSE(d.ok()) << levels;
    EXPECT_NE(d.status().message().find("the JSON Schema nests arrays and objects deeper than"),
              std::string::npos)
        << d.status();
  }
}

TEST(JsonSchemaGrammarTest, AdditionalPropertiesSchema) {
  const std::string schema = R"({"type":"object","additionalProperties":{"type":"number"}})";
  EXPECT_TRUE(SchemaAccepts(schema, "{}"));
  EXPECT_TRUE(SchemaAccepts(schema, R"({"x":1,"y":2.5e3})"));
  EXPECT_FALSE(SchemaAccepts(schema, R"({"x":"1"})"));
}

TEST(JsonSchemaGrammarTest, ArraysWithBounds) {
  const std::string schema = R"({"type":"array","items":{"enum":["a","b",3]},"minItems":1,"maxItems":3})";
  EXPECT_FALSE(SchemaAccepts(schema, "[]"));
  EXPECT_TRUE(SchemaAccepts(schema, R"(["a"])"));
  EXPECT_TRUE(SchemaAccepts(schema, R"(["a", 3, "b"])"));
  EXPECT_FALSE(SchemaAccepts(schema, R"(["a",3,"b","a"])"));
  EXPECT_FALSE(SchemaAccepts(schema, R"(["c"])"));
}

TEST(JsonSchemaGrammarTest, StringLengthPatternAndFormats) {
  EXPECT_TRUE(SchemaAccepts(R"({"type":"string","minLength":2,"maxLength":3})", R"("é\n")"));
  EXPECT_FALSE(SchemaAccepts(R"({"type":"string","minLength":2,"maxLength":3})", R"("abcd")"));
  EXPECT_TRUE(SchemaAccepts(R"({"type":"string","pattern":"^[A-Z]{2}\\d+$"})", R"("AB12")"));
  EXPECT_FALSE(SchemaAccepts(R"({"type":"string","pattern":"^[A-Z]{2}\\d+$"})", R"("AB")"));
  EXPECT_TRUE(SchemaAccepts(R"({"type":"string","pattern":"\\d"})", R"("abc1def")"));
  EXPECT_TRUE(SchemaAccepts(R"({"type":"string","format":"date-time"})", R"("2024-02-29T23:59:07.5+01:00")"));
  EXPECT_FALSE(SchemaAccepts(R"({"type":"string","format":"date-time"})", R"("2024-13-29T23:59:07Z")"));
  EXPECT_TRUE(SchemaAccepts(R"({"type":"string","format":"uuid"})", R"("123e4567-e89b-12d3-a456-426614174000")"));
  EXPECT_TRUE(SchemaAccepts(R"({"type":"string","format":"email"})", R"("a.b+c@example.co.uk")"));
  EXPECT_FALSE(SchemaAccepts(R"({"type":"string","format":"email"})", R"("nobody")"));
}

TEST(JsonSchemaGrammarTest, IntegerRanges) {
  const std::string schema = R"({"type":"integer","minimum":-15,"maximum":120})";
  for (int v = -30; v <= 200; ++v) {
    EXPECT_EQ(SchemaAccepts(schema, std::to_string(v)), v >= -15 && v <= 120) << v;
  }
  EXPECT_FALSE(SchemaAccepts(schema, "007"));
  EXPECT_TRUE(SchemaAccepts(R"({"type":"integer","exclusiveMinimum":99})", "100"));
  EXPECT_TRUE(SchemaAccepts(R"({"type":"integer","exclusiveMinimum":99})", "123456789"));
  EXPECT_FALSE(SchemaAccepts(R"({"type":"integer","exclusiveMinimum":99})", "99"));
  EXPECT_TRUE(SchemaAccepts(R"({"type":"integer","exclusiveMaximum":-5})", "-6"));
  EXPECT_FALSE(SchemaAccepts(R"({"type":"integer","exclusiveMaximum":-5})", "-5"));
  EXPECT_FALSE(SchemaAccepts(R"({"type":"integer","exclusiveMaximum":-5})", "0"));
}

TEST(JsonSchemaGrammarTest, NumberRangeWithIntegralBounds) {
  const std::string schema = R"({"type":"number","minimum":0,"maximum":5})";
  EXPECT_TRUE(SchemaAccepts(schema, "4.99"));
  EXPECT_TRUE(SchemaAccepts(schema, "5.00"));
  EXPECT_FALSE(SchemaAccepts(schema, "5.01"));
  EXPECT_FALSE(SchemaAccepts(schema, "-1"));
}

TEST(JsonSchemaGrammarTest, RefsDefsRecursionAndAnyOf) {
  const std::string schema = R"({"$defs":{"node":{"type":"object","properties":{
      "v":{"type":"integer"},"kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},
      "required":["v"]}},"anyOf":[{"$ref":"#/$defs/node"},{"type":"null"}]})";
  EXPECT_TRUE(SchemaAccepts(schema, "null"));
  EXPECT_TRUE(SchemaAccepts(schema, R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[]}]})"));
  EXPECT_FALSE(SchemaAccepts(schema, R"({"v":1,"kids":[{"w":2}]})"));
}

TEST(JsonSchemaGrammarTest, TypeListsConstAndEmptySchema) {
  EXPECT_TRUE(SchemaAccepts(R"({"type":["string","null"]})", "null"));
  EXPECT_TRUE(SchemaAccepts(R"({"type":["string","null"]})", R"("s")"));
  EXPECT_FALSE(SchemaAccepts(R"({"type":["string","null"]})", "1"));
  EXPECT_TRUE(SchemaAccepts(R"({"const":{"k":[1,2]}})", R"({"k":[1,2]})"));
  EXPECT_TRUE(SchemaAccepts("{}", R"([1, {"a": null}, "x", -0.5e-3])"));
}

TEST(JsonSchemaGrammarTest, UnsupportedKeywordsAreNamed) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"type":"object","patternProperties":{"a":{}},"additionalProperties":{}})",
       "patternProperties together with additionalProperties"},
      {R"({"type":"array","items":{"type":"string"},"uniqueItems":true})", "uniqueItems"},
      {R"({"type":"object","maxProperties":1,"required":["a","b"]})", "maxProperties"},
      {R"({"not":{"pattern":"a"}})", "'not' (other than"},
      {R"({"type":"string","pattern":"b","not":{"const":"a"}})", "beside 'pattern'"},
      {R"({"not":{"enum":[[1]]}})", "array values"},
      {R"({"type":"boolean","not":{"enum":[true,false]}})", "leaves no value"},
      {R"({"not":{}})", "accepts everything"},
      {R"({"type":"number","multipleOf":3})", "multipleOf on type number"},
      {R"({"type":"integer","multipleOf":0.5})", "positive integer"},
      {R"({"type":"integer","multipleOf":7,"minimum":0})", "only one bound"},
      {R"({"type":"array","items":[{"type":"string"}]})", "tuple"},
      {R"({"prefixItems":[{"type":"string"}],"items":false,"minItems":2})", "prefixItems"},
      {R"({"prefixItems":[{"const":1}],"uniqueItems":true})", "uniqueItems with prefixItems"},
      {R"({"allOf":[{"pattern":"a"},{"pattern":"b"}]})", "allOf"},
      {R"({"oneOf":[true,{"type":"string"}]})", "no value matches exactly one"},
      {R"({"anyOf":[false,false]})", "no branch"},
      {R"({"type":"object","properties":{"a":false},"required":["a"]})", "schema false"},
      {R"({"type":"array","items":false,"minItems":1})", "allows no item"},
      {R"({"$ref":"#/$defs/a","pattern":"x","$defs":{"a":{"pattern":"y"}}})",
       "sibling keyword 'pattern'"},
      {R"({"type":"string","format":"hostname"})", "hostname"},
      {R"({"$ref":"https://example.com/s.json"})", "local $ref"},
      {R"({"$ref":"#/$defs/missing"})", "does not resolve"},
      {R"({"type":"strange"})", "strange"},
      {R"({"type":"number","minimum":0.0000000000000001})", "15 fraction digits"},
      {R"({"type":"number","minimum":1e16})", "beyond 1e15"},
      {R"({"type":"number","minimum":5,"exclusiveMaximum":5})", "empty"},
      {"[1,2", "not valid JSON"}};
  for (const auto& [schema, what] : cases) {
    auto d = JsonSchemaGrammar(schema);
    ASSERT_FALSE(d.ok()) << schema;
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(d.status().message().find(what), std::string::npos) << schema << ": " << d.status();
  }
}

// Fractional, negative and exclusive bounds on numbers (Pydantic's confloat / Field(gt=...)):
// every decimal with up to 3 fraction digits in [-3, 3], with and without trailing zeros,
// is accepted exactly when it lies in the range.
TEST(JsonSchemaGrammarTest, NumberRangesWithRealBounds) {
  struct Range {
    const char* schema;
    double lo;
    bool lo_exclusive;
    double hi;
    bool hi_exclusive;
  };
  const double inf = 1e300;
  const std::vector<Range> ranges = {
      {R"({"type":"number","minimum":0.5,"maximum":2.25})", 0.5, false, 2.25, false},
      {R"({"type":"number","exclusiveMinimum":0})", 0, true, inf, false},
      {R"({"type":"number","minimum":-1.5,"exclusiveMaximum":0.75})", -1.5, false, 0.75, true},
      {R"({"type":"number","exclusiveMinimum":-2.05,"exclusiveMaximum":-0.1})", -2.05, true, -0.1, true},
      {R"({"type":"number","minimum":1.25,"maximum":1.5})", 1.25, false, 1.5, false},
      {R"({"type":"number","exclusiveMinimum":1.2,"exclusiveMaximum":1.205})", 1.2, true, 1.205, true},
      {R"({"type":"number","maximum":-0.5})", -inf, false, -0.5, false},
      {R"({"type":"number","minimum":0,"maximum":1e-2})", 0, false, 0.01, false},
      {R"({"type":"number","minimum":2,"exclusiveMinimum":1.5,"maximum":3})", 2, false, 3, false},
  };
  for (const Range& range : ranges) {
    auto grammar = CompileGrammarSpec({GrammarKind::kJsonSchema, range.schema});
    ASSERT_TRUE(grammar.ok()) << range.schema << ": " << grammar.status();
    GrammarAutomaton automaton(*grammar, nullptr);
    auto accepts = [&](const std::string& doc) {
      return automaton.IsAccepting(automaton.AdvanceBytes(automaton.Initial(), doc));
    };
    for (int thousandths = -3000; thousandths <= 3000; thousandths += 1) {
      const double v = thousandths / 1000.0;
      const bool inside = (range.lo_exclusive ? v > range.lo + 1e-12 : v >= range.lo - 1e-12) &&
                          (range.hi_exclusive ? v < range.hi - 1e-12 : v <= range.hi + 1e-12);
      // Written canonically with 3 fraction digits, and without the trailing zeros.
      char text[32];
      std::snprintf(text, sizeof(text), "%.3f", v);
      std::string shortest = text;
      while (shortest.back() == '0') shortest.pop_back();
      if (shortest.back() == '.') shortest.pop_back();
      if (shortest == "-0") continue;
      EXPECT_EQ(accepts(shortest), inside) << range.schema << " " << shortest;
      EXPECT_EQ(accepts(text), inside) << range.schema << " " << text;
    }
  }
  // Values the grammar never writes in a range are still refused outside it.
  EXPECT_FALSE(SchemaAccepts(R"({"type":"number","minimum":0.5})", "-0.5"));
  EXPECT_TRUE(SchemaAccepts(R"({"type":"number","minimum":0.5})", "12345.678"));
  EXPECT_FALSE(SchemaAccepts(R"({"type":"number","minimum":0.5})", "0.4999999"));
}

TEST(JsonSchemaGrammarTest, UniqueItemsOverAFiniteSetOfValues) {
  const std::string schema =
      R"({"type":"array","items":{"enum":["a","b",3]},"uniqueItems":true,"minItems":1,"maxItems":2})";
  EXPECT_TRUE(SchemaAccepts(schema, R"(["a"])"));
  EXPECT_TRUE(SchemaAccepts(schema, R"(["a", 3])"));
  EXPECT_TRUE(SchemaAccepts(schema, R"(["b",3])"));
  EXPECT_FALSE(SchemaAccepts(schema, "[]"));
  EXPECT_FALSE(SchemaAccepts(schema, R"(["a","a"])"));
  EXPECT_FALSE(SchemaAccepts(schema, R"(["a","b",3])"));
  // The grammar writes the values in the schema's order (a unique array either way).
  EXPECT_FALSE(SchemaAccepts(schema, R"([3,"a"])"));
  const std::string flags = R"({"type":"array","items":{"type":"boolean"},"uniqueItems":true})";
  EXPECT_TRUE(SchemaAccepts(flags, "[]"));
  EXPECT_TRUE(SchemaAccepts(flags, "[true,false]"));
  EXPECT_FALSE(SchemaAccepts(flags, "[true,true]"));
  EXPECT_TRUE(SchemaAccepts(R"({"type":"array","items":{"type":"integer"},"uniqueItems":false})", "[1,1]"));
}

TEST(JsonSchemaGrammarTest, MinAndMaxProperties) {
  const std::string fixed = R"({"type":"object","properties":{"a":{"type":"integer"},
      "b":{"type":"integer"},"c":{"type":"integer"}},"required":["a"],"minProperties":2,"maxProperties":2})";
  EXPECT_TRUE(SchemaAccepts(fixed, R"({"a":1,"b":2})"));
  EXPECT_TRUE(SchemaAccepts(fixed, R"({"a":1, "c":3})"));
  EXPECT_FALSE(SchemaAccepts(fixed, R"({"a":1})"));
  EXPECT_FALSE(SchemaAccepts(fixed, R"({"b":1,"c":2})"));  // a is required
  EXPECT_FALSE(SchemaAccepts(fixed, R"({"a":1,"b":2,"c":3})"));
  const std::string map = R"({"type":"object","additionalProperties":{"type":"integer"},
      "minProperties":1,"maxProperties":2})";
  EXPECT_FALSE(SchemaAccepts(map, "{}"));
  EXPECT_TRUE(SchemaAccepts(map, R"({"x":1})"));
  EXPECT_TRUE(SchemaAccepts(map, R"({"x":1,"y":2})"));
  EXPECT_FALSE(SchemaAccepts(map, R"({"x":1,"y":2,"z":3})"));
  const std::string mixed = R"({"type":"object","properties":{"id":{"type":"integer"}},"required":["id"],
      "additionalProperties":{"type":"boolean"},"minProperties":3})";
  EXPECT_FALSE(SchemaAccepts(mixed, R"({"id":1,"x":true})"));
  EXPECT_TRUE(SchemaAccepts(mixed, R"({"id":1,"x":true,"y":false})"));
  EXPECT_TRUE(SchemaAccepts(mixed, R"({"id":1,"x":true,"y":false,"z":true})"));
}

TEST(JsonSchemaGrammarTest, PatternProperties) {
  const std::string schema = R"({"type":"object","properties":{"name":{"type":"string"}},
      "required":["name"],"patternProperties":{"^x_[a-z]+$":{"type":"integer"},"^is_":{"type":"boolean"}}})";
  EXPECT_TRUE(SchemaAccepts(schema, R"({"name":"n"})"));
  EXPECT_TRUE(SchemaAccepts(schema, R"({"name":"n","x_ab":1,"is_on":true})"));
  EXPECT_FALSE(SchemaAccepts(schema, R"({"name":"n","x_ab":"1"})"));
  EXPECT_FALSE(SchemaAccepts(schema, R"({"name":"n","x_":1})"));
  EXPECT_FALSE(SchemaAccepts(schema, R"({"name":"n","y":1})"));
}

TEST(JsonSchemaGrammarTest, IntegerMultiples) {
  const std::string bounded = R"({"type":"integer","multipleOf":5,"minimum":-12,"maximum":31})";
  for (int v = -40; v <= 40; ++v) {
    EXPECT_EQ(SchemaAccepts(bounded, std::to_string(v)), v % 5 == 0 && v >= -12 && v <= 31) << v;
  }
  auto grammar = CompileGrammarSpec({GrammarKind::kJsonSchema, R"({"type":"integer","multipleOf":7})"});
  ASSERT_TRUE(grammar.ok()) << grammar.status();
  GrammarAutomaton automaton(*grammar, nullptr);
  for (int64_t v : {0LL, 7LL, -7LL, 13LL, 700LL, 701LL, 123456789LL, 123456786LL, -98LL, -99LL,
                    999999999999994LL}) {
    const std::string text = std::to_string(v);
    EXPECT_EQ(automaton.IsAccepting(automaton.AdvanceBytes(automaton.Initial(), text)), v % 7 == 0)
        << v;
  }
  EXPECT_FALSE(automaton.IsAccepting(automaton.AdvanceBytes(automaton.Initial(), "07")));
}

// allOf, and keywords beside anyOf/oneOf/$ref, merge into one schema (Pydantic writes
// {"allOf": [{"$ref": ...}], "description": ...} and models extending others as allOf);
// false subschemas fold away.
TEST(JsonSchemaGrammarTest, MergedSchemasAndFalseSubschemas) {
  const std::string all_of =
      R"({"allOf":[{"type":"object","properties":{"a":{"type":"integer","maximum":99}},
      "required":["a"]},{"properties":{"b":{"type":"string"}},"required":["b"]},
      {"properties":{"a":{"minimum":3}}}]})";
  EXPECT_TRUE(SchemaAccepts(all_of, R"({"a":3,"b":"x"})"));
  EXPECT_FALSE(SchemaAccepts(all_of, R"({"a":2,"b":"x"})"));  // minimum from the third
  EXPECT_FALSE(SchemaAccepts(all_of, R"({"a":3})"));          // b required by the second
  EXPECT_FALSE(SchemaAccepts(all_of, R"({"a":3.5,"b":"x"})"));
  const std::string closed = R"({"allOf":[{"properties":{"a":{}},"additionalProperties":false},
      {"properties":{"a":{"type":"integer"},"b":{}}}]})";
  EXPECT_TRUE(SchemaAccepts(closed, R"({"a":1})"));
  EXPECT_FALSE(SchemaAccepts(closed, R"({"a":1,"b":2})"));  // b is additional in the first
  const std::string beside_any_of =
      R"({"type":"integer","anyOf":[{"minimum":10,"maximum":99},{"maximum":-10,"minimum":-99}]})";
  EXPECT_TRUE(SchemaAccepts(beside_any_of, "12"));
  EXPECT_TRUE(SchemaAccepts(beside_any_of, "-10"));
  EXPECT_FALSE(SchemaAccepts(beside_any_of, "0"));
  EXPECT_FALSE(SchemaAccepts(beside_any_of, "12.5"));
  const std::string beside_ref =
      R"({"$defs":{"n":{"type":"integer","minimum":0}},"$ref":"#/$defs/n","maximum":5,"description":"d"})";
  EXPECT_TRUE(SchemaAccepts(beside_ref, "5"));
  EXPECT_FALSE(SchemaAccepts(beside_ref, "6"));
  const std::string enums = R"({"allOf":[{"enum":["a","b","c"]},{"enum":["c","b","d"]}]})";
  EXPECT_TRUE(SchemaAccepts(enums, R"("b")"));
  EXPECT_FALSE(SchemaAccepts(enums, R"("a")"));
  EXPECT_FALSE(SchemaAccepts(enums, R"("d")"));
  const std::string falses = R"({"type":"object","properties":{"a":{"type":"integer"},"b":false},
      "additionalProperties":false,"anyOf":[false,{"required":["a"]}]})";
  EXPECT_TRUE(SchemaAccepts(falses, R"({"a":1})"));
  EXPECT_FALSE(SchemaAccepts(falses, R"({"a":1,"b":1})"));
  EXPECT_FALSE(SchemaAccepts(falses, "{}"));
  EXPECT_TRUE(SchemaAccepts(R"({"items":false})", "[]"));
  EXPECT_FALSE(SchemaAccepts(R"({"items":false})", "[1]"));
  EXPECT_TRUE(SchemaAccepts(R"({"type":"string","maxLength":2.0})", R"("ab")"));
  EXPECT_FALSE(SchemaAccepts(R"({"type":"string","maxLength":2.0})", R"("abc")"));
}

// `not` of types or of a finite set of values.
TEST(JsonSchemaGrammarTest, NotAsAFiniteExclusion) {
  const std::string not_string = R"({"not":{"type":"string"}})";
  EXPECT_TRUE(SchemaAccepts(not_string, "1"));
  EXPECT_TRUE(SchemaAccepts(not_string, R"({"a": [null]})"));
  EXPECT_FALSE(SchemaAccepts(not_string, R"("x")"));
  const std::string words = R"({"type":"string","not":{"enum":["ab","a","b\"c"]}})";
  for (const char* ok :
       {R"("")", R"("abc")", R"("b")", R"("aa")", R"("x")", R"("ba")", R"("b\"")"}) {
    EXPECT_TRUE(SchemaAccepts(words, ok)) << ok;
  }
  for (const char* excluded : {R"("ab")", R"("a")", R"("b\"c")"})
    EXPECT_FALSE(SchemaAccepts(words, excluded)) << excluded;
  const std::string ints =
      R"({"type":"integer","minimum":0,"maximum":9,"not":{"enum":[0,4,5,"x"]}})";
  for (int v = -1; v <= 10; ++v) {
    const bool valid = v >= 0 && v <= 9 && v != 0 && v != 4 && v != 5;
    EXPECT_EQ(SchemaAccepts(ints, std::to_string(v)), valid) << v;
  }
  const std::string numbers = R"({"type":"number","minimum":0,"maximum":2,"not":{"const":1}})";
  EXPECT_TRUE(SchemaAccepts(numbers, "0.5"));
  EXPECT_TRUE(SchemaAccepts(numbers, "1.5"));
  EXPECT_TRUE(SchemaAccepts(numbers, "2"));
  EXPECT_FALSE(SchemaAccepts(numbers, "1"));
  EXPECT_FALSE(SchemaAccepts(numbers, "2.5"));
  const std::string mixed = R"({"type":["boolean","null","string"],"not":{"enum":[true,null,""]}})";
  EXPECT_TRUE(SchemaAccepts(mixed, "false"));
  EXPECT_TRUE(SchemaAccepts(mixed, R"("s")"));
  for (const char* excluded : {"true", "null", R"("")"})
    EXPECT_FALSE(SchemaAccepts(mixed, excluded)) << excluded;
  const std::string listed = R"({"enum":["a","b","c"],"not":{"const":"b"}})";
  EXPECT_TRUE(SchemaAccepts(listed, R"("a")"));
  EXPECT_FALSE(SchemaAccepts(listed, R"("b")"));
}

// prefixItems (Pydantic's tuple[int, str]) and $ref by $anchor or an escaped pointer.
TEST(JsonSchemaGrammarTest, TuplesAndAnchors) {
  const std::string pair =
      R"({"type":"array","prefixItems":[{"type":"integer"},{"type":"string"}],"minItems":2,"maxItems":2})";
  EXPECT_TRUE(SchemaAccepts(pair, R"([1, "a"])"));
  EXPECT_FALSE(SchemaAccepts(pair, R"([1])"));
  EXPECT_FALSE(SchemaAccepts(pair, R"(["a", 1])"));
  EXPECT_FALSE(SchemaAccepts(pair, R"([1, "a", 2])"));
  const std::string open = R"({"prefixItems":[{"type":"integer"}],"items":{"type":"boolean"}})";
  for (const char* ok : {"[]", "[1]", "[1, true, false]"})
    EXPECT_TRUE(SchemaAccepts(open, ok)) << ok;
  for (const char* bad : {"[true]", "[1, 2]"}) EXPECT_FALSE(SchemaAccepts(open, bad)) << bad;
  const std::string closed =
      R"({"prefixItems":[{"type":"integer"},{"type":"integer"}],"items":false})";
  for (const char* ok : {"[]", "[1]", "[1,2]"}) EXPECT_TRUE(SchemaAccepts(closed, ok)) << ok;
  EXPECT_FALSE(SchemaAccepts(closed, "[1,2,3]"));
  const std::string anchored =
      R"({"$defs":{"a":{"$anchor":"num","type":"integer"},"b~c/d%":{"type":"string"}},
      "properties":{"x":{"$ref":"#num"},"y":{"$ref":"#/$defs/b~0c~1d%25"}},"additionalProperties":false})";
  EXPECT_TRUE(SchemaAccepts(anchored, R"({"x": 1, "y": "s"})"));
  EXPECT_FALSE(SchemaAccepts(anchored, R"({"x": "1"})"));
  EXPECT_FALSE(SchemaAccepts(anchored, R"({"y": 2})"));
}

TEST(JsonSchemaGrammarTest, JsonObjectAcceptsAnyObjectOnly) {
  const GrammarSpec spec{GrammarKind::kJsonObject, ""};
  EXPECT_TRUE(testing::Accepts(spec, R"({"a": [1, 2, {"b": "c"}], "d": false})"));
  EXPECT_TRUE(testing::Accepts(spec, "{}"));
  EXPECT_FALSE(testing::Accepts(spec, "[1]"));
  EXPECT_FALSE(testing::Accepts(spec, R"({"a": 01})"));
}

}  // namespace
}  // namespace loom::common
