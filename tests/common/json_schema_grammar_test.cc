#include "common/grammar/json_schema_grammar.h"

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
      {R"({"type":"object","patternProperties":{"a":{}}})", "patternProperties"},
      {R"({"not":{"type":"string"}})", "not"},
      {R"({"type":"number","multipleOf":3})", "multipleOf"},
      {R"({"type":"array","items":[{"type":"string"}]})", "tuple"},
      {R"({"allOf":[{"type":"string"},{"minLength":1}]})", "allOf"},
      {R"({"type":"string","format":"hostname"})", "hostname"},
      {R"({"$ref":"https://example.com/s.json"})", "local $ref"},
      {R"({"$ref":"#/$defs/missing"})", "does not resolve"},
      {R"({"type":"strange"})", "strange"},
      {R"({"type":"number","minimum":0.5})", "minimum"},
      {"[1,2", "not valid JSON"}};
  for (const auto& [schema, what] : cases) {
    auto d = JsonSchemaGrammar(schema);
    ASSERT_FALSE(d.ok()) << schema;
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(d.status().message().find(what), std::string::npos) << schema << ": " << d.status();
  }
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
