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

// tool_choice "auto": free text until the trigger, then calls held to the schema.
TEST(ToolCallGrammarTest, TriggeredCallsAfterFreeText) {
  std::string spec = HermesSpec(true);
  spec.insert(spec.size() - 1, R"(,"trigger":"<tool_call>","trigger_at":"anywhere")");
  const GrammarSpec anywhere{GrammarKind::kToolCalls, spec};
  const std::string call =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\"}}\n</tool_call>";
  for (const std::string& text :
       {std::string(), std::string("Sure, I can help."), std::string("a <tool b <tool_cal x é😀"),
        std::string("Let me check.\n") + call, call + "\n" + call + "\n",
        std::string("<tool_cal")}) {
    EXPECT_TRUE(Accepts(anywhere, text)) << text;
  }
  for (const std::string& text :
       {std::string("<tool_call>\n{\"name\": \"other\", \"arguments\": {}}\n</tool_call>"),
        std::string("<tool_call>{\"city\": 1}"), call + " and more text",
        std::string("x<<tool_call>\n{}")}) {
    EXPECT_FALSE(Accepts(anywhere, text)) << text;
  }
  const std::string generic =
      std::string(R"({"schema":)") + kCall + R"(,"trigger":"{","trigger_at":"start"})";
  const GrammarSpec start{GrammarKind::kToolCalls, generic};
  for (const std::string& text :
       {std::string(), std::string("Plain text with {braces}."),
        std::string("\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"x\"}}\n")}) {
    EXPECT_TRUE(Accepts(start, text)) << text;
  }
  for (const std::string& text : {std::string("{\"answer\": 42}"), std::string("{not json")}) {
    EXPECT_FALSE(Accepts(start, text)) << text;
  }
  const GrammarSpec bad_at{GrammarKind::kToolCalls, std::string(R"({"schema":)") + kCall +
                                                        R"(,"trigger":"{","trigger_at":"end"})"};
  EXPECT_FALSE(CompileGrammarSpec(bad_at).ok());
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

// Qwen3-Coder's calls under tool_choice "auto": tags around bare text, each value typed by its
// parameter's schema (a string's text free but for the closing tag, others JSON).
std::string Qwen3CoderSpec(const std::string& extra = "") {
  return R"({"begin":"<tool_call>\n<function=","end":"</function>\n</tool_call>",)"
         R"("separator":"\n","repeat":true,"trigger":"<tool_call>","trigger_at":"anywhere",)"
         R"("xml":{"name_end":">\n","key_begin":"<parameter=","key_end":">\n",)"
         R"("value_end":"\n</parameter>\n","tools":[)"
         R"({"name":"get_weather","parameters":{"type":"object","properties":{)"
         R"("city":{"type":"string"},"days":{"type":"integer","minimum":1},)"
         R"("unit":{"type":"string","enum":["celsius","fahrenheit"]},"extra":{}},)"
         R"("required":["city"]}},)"
         R"({"name":"now","parameters":{"type":"object","properties":{}}}]})" +
         extra + "}";
}

TEST(ToolCallGrammarTest, XmlCallsTypeEachValueByItsSchema) {
  const GrammarSpec spec{GrammarKind::kToolCalls, Qwen3CoderSpec()};
  auto call = [](const std::string& name, const std::string& parameters) {
    return "<tool_call>\n<function=" + name + ">\n" + parameters + "</function>\n</tool_call>";
  };
  auto parameter = [](const std::string& key, const std::string& value) {
    return "<parameter=" + key + ">\n" + value + "\n</parameter>\n";
  };
  const std::string paris = call("get_weather", parameter("city", "Paris"));
  for (const std::string& text : {
           std::string(),
           std::string("Let me look that up."),
           paris,
           "Checking.\n" + paris + "\n" + call("now", ""),
           // Keys in any order; a string value spans lines and may hold tags and JSON.
           call("get_weather", parameter("days", "3") + parameter("city", "New\nYork </p> {1}")),
           call("get_weather", parameter("unit", "celsius") + parameter("extra", "[1, \"x\"]") +
                                   parameter("city", "Oslo")),
           call("get_weather", parameter("city", "")),
       }) {
    EXPECT_TRUE(Accepts(spec, text)) << text;
  }
  for (const std::string& text : {
           call("get_time", ""),                               // no such tool
           call("get_weather", parameter("town", "Paris")),    // no such parameter
           call("get_weather", parameter("days", "three")),    // not an integer
           call("get_weather", parameter("days", "0")),        // below its minimum
           call("get_weather", parameter("unit", "kelvin")),   // outside its enum
           call("now", parameter("city", "Paris")),            // now takes none
           call("get_weather", parameter("unit", "celsius")),  // city is required
           call("get_weather", parameter("city", "A") + parameter("city", "B")),  // once each
           std::string("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</function>"),
           paris + " and then more text",
       }) {
    EXPECT_FALSE(Accepts(spec, text)) << text;
  }
}

// GLM-4.5's layout, whose newlines GLM-4.7 leaves out: with optional_newlines both pass, and
// a string value stops at </arg_value> whatever follows it.
TEST(ToolCallGrammarTest, XmlCallsWithOptionalNewlines) {
  const GrammarSpec spec{
      GrammarKind::kToolCalls,
      R"({"begin":"<tool_call>","end":"</tool_call>","separator":"\n","repeat":true,)"
      R"("trigger":"<tool_call>","trigger_at":"anywhere",)"
      R"("xml":{"name_end":"\n","key_begin":"<arg_key>","key_end":"</arg_key>\n<arg_value>",)"
      R"("value_end":"</arg_value>\n","optional_newlines":true,"tools":[)"
      R"({"name":"get_weather","parameters":{"type":"object","properties":{)"
      R"("city":{"type":"string"},"days":{"type":"integer"}}}}]}})"};
  const std::string glm45 =
      "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>75001</arg_value>\n"
      "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>";
  const std::string glm47 =
      "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris\nCentre</arg_value>"
      "<arg_key>days</arg_key><arg_value>3</arg_value></tool_call>";
  for (const std::string& text : {glm45, glm47, "Sure.\n" + glm45 + "\n" + glm47, glm45 + glm47}) {
    EXPECT_TRUE(Accepts(spec, text)) << text;
  }
  for (const std::string& text : {
           std::string("<tool_call>get_weather\n<arg_key>days</arg_key>\n<arg_value>x</arg_value>"
                       "\n</tool_call>"),
           std::string("<tool_call>get_weather\n\n<arg_key>city</arg_key><arg_value>P</arg_value>"
                       "</tool_call>"),  // one newline at most
           std::string("<tool_call>get_time</tool_call>"),
       }) {
    EXPECT_FALSE(Accepts(spec, text)) << text;
  }
  EXPECT_FALSE(ToolCallGrammar(R"({"xml":{"value_end":"\n","optional_newlines":true,)"
                               R"("tools":[{"name":"f"}]}})")
                   .ok());
  EXPECT_FALSE(ToolCallGrammar(R"({"xml":{"value_end":"</p>","optional_newlines":1,)"
                               R"("tools":[{"name":"f"}]}})")
                   .ok());
}

// Seven parameters, past the any-order limit: the schema's order, each at most once, the
// required ones present; a required name the tool does not declare is not required.
TEST(ToolCallGrammarTest, XmlCallsOfManyParametersTakeTheSchemasOrder) {
  std::string properties;
  for (char key = 'a'; key <= 'g'; ++key) {
    properties += std::string(key == 'a' ? "" : ",") + "\"" + key + "\":{\"type\":\"integer\"}";
  }
  const GrammarSpec spec{
      GrammarKind::kToolCalls,
      R"({"begin":"<tool_call>","end":"</tool_call>","xml":{"name_end":"|","key_begin":"<",)"
      R"("key_end":">","value_end":"</v>","tools":[{"name":"f","parameters":{"type":"object",)"
      R"("properties":{)" +
          properties + R"(},"required":["b","f","zz"]}}]}})"};
  EXPECT_TRUE(Accepts(spec, "<tool_call>f|<b>1</v><f>2</v></tool_call>"));
  EXPECT_TRUE(Accepts(spec, "<tool_call>f|<a>0</v><b>1</v><c>5</v><f>2</v><g>3</v></tool_call>"));
  EXPECT_FALSE(Accepts(spec, "<tool_call>f|<f>2</v><b>1</v></tool_call>"));  // out of order
  EXPECT_FALSE(Accepts(spec, "<tool_call>f|<b>1</v></tool_call>"));          // no f
  EXPECT_FALSE(Accepts(spec, "<tool_call>f|<b>1</v><b>1</v><f>2</v></tool_call>"));
}

TEST(ToolCallGrammarTest, MalformedXmlSpecsAreErrors) {
  EXPECT_FALSE(ToolCallGrammar(R"({"xml":[]})").ok());
  EXPECT_FALSE(ToolCallGrammar(R"({"xml":{"value_end":"</p>","tools":[]}})").ok());
  EXPECT_FALSE(ToolCallGrammar(R"({"xml":{"value_end":"","tools":[{"name":"f"}]}})").ok());
  EXPECT_FALSE(ToolCallGrammar(R"({"xml":{"value_end":"</p>","tools":[{"parameters":{}}]}})").ok());
  absl::StatusOr<GrammarDefinition> bad = ToolCallGrammar(
      R"({"xml":{"value_end":"</p>","tools":[{"name":"f","parameters":{"properties":)"
      R"({"a":{"type":"object","not":{}}}}}]}})");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'not'"), std::string::npos) << bad.status();
  EXPECT_TRUE(ToolCallGrammar(R"({"xml":{"value_end":"</p>","tools":[{"name":"f"}]}})").ok());
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
