#include "common/grammar/tool_call_grammar.h"

#include <string>

#include "common/grammar/grammar_spec.h"
#include "gtest/gtest.h"
#include "tests/common/grammar_test_util.h"

namespace loom::common {
namespace {

using testing::Accepts;

constexpr char kCall[] =
    R"({"type":"object","properties":{"name":{"const":"get_weather"},)"
    R"("arguments":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}},)"
    R"("required":["name","arguments"],"additionalProperties":false})";

std::string HermesSpec(bool repeat) {
  return std::string(R"({"schema":)") + kCall +
         R"(,"begin":"<tool_call>\n","end":"\n</tool_call>","separator":"\n","repeat":)" +
         (repeat ? "true" : "false") + "}";
}

TEST(ToolCallGrammarTest, HermesFramesEachCall) {
  const GrammarSpec one{GrammarKind::kToolCalls, HermesSpec(false)};
  const std::string call =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\"}}\n</tool_call>";
  EXPECT_TRUE(Accepts(one, call));
  EXPECT_FALSE(Accepts(one, call + "\n" + call));  // one call only
  EXPECT_FALSE(Accepts(one, "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}"));
  EXPECT_FALSE(Accepts(
      one, "<tool_call>\n{\"name\": \"other\", \"arguments\": {\"city\": \"x\"}}\n</tool_call>"));
  EXPECT_FALSE(
      Accepts(one, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>"));
  const GrammarSpec many{GrammarKind::kToolCalls, HermesSpec(true)};
  EXPECT_TRUE(Accepts(many, call));
  EXPECT_TRUE(Accepts(many, call + "\n" + call));
  EXPECT_FALSE(Accepts(many, call + call));  // the separator is required
}

TEST(ToolCallGrammarTest, MistralMarkerBeforeTheArray) {
  const GrammarSpec spec{GrammarKind::kToolCalls,
                         std::string(R"({"schema":{"type":"array","items":)") + kCall +
                             R"(,"minItems":1},"begin":"[TOOL_CALLS]"})"};
  EXPECT_TRUE(Accepts(
      spec, "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}]"));
  EXPECT_FALSE(Accepts(spec, "[TOOL_CALLS][]"));
  EXPECT_FALSE(Accepts(spec, "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}]"));
}

TEST(ToolCallGrammarTest, MalformedSpecsAndUnsupportedSchemasAreErrorsNamingTheConstruct) {
  EXPECT_FALSE(ToolCallGrammar("[]").ok());
  EXPECT_FALSE(ToolCallGrammar(R"({"begin":"x"})").ok());
  EXPECT_FALSE(ToolCallGrammar(R"({"schema":{},"begin":1})").ok());
  EXPECT_FALSE(ToolCallGrammar(R"({"schema":{},"repeat":"yes"})").ok());
  absl::StatusOr<GrammarDefinition> bad =
      ToolCallGrammar(R"({"schema":{"type":"object","properties":{"a":{"not":{}}}}})");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'not'"), std::string::npos) << bad.status();
}

}  // namespace
}  // namespace loom::common
