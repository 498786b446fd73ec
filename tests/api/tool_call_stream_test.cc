#include "api/tool_call_stream.h"

#include <string>
#include <vector>

#include "api/tool_call_parser.h"
#include "gtest/gtest.h"

namespace loom::api {
namespace {

struct Reply {
  ToolCallFormat format;
  std::string text;
  StringParameters string_parameters = {};
};

// Replies in each JSON format, with what makes compacting hard: spaces, escapes (\/, \u
// with a surrogate pair, control characters), non-ASCII text, numbers nlohmann rewrites
// (1.50, 1e2, -0), nested values, string arguments, arguments before the name.
std::vector<Reply> Replies() {
  return {
      {ToolCallFormat::kGeneric,
       R"({"tool_calls": [{"name": "get_weather", "arguments": {"city": "Saint-\u00c9tienne \ud83d\ude00",)"
       R"( "unit" : "celsius", "days": [1.50, 1e2, -0, true, null], "x": {"a\/b": "t\tab\u0001"}}},)"
       "\n {\"arguments\": {\"tz\": \"CET\"}, \"name\": \"get_time\"}]}"},
      {ToolCallFormat::kGeneric,
       "```json\n{\"name\": \"f\", \"arguments\": {\"q\": \"é€ 😀\"}}\n```"},
      {ToolCallFormat::kHermes,
       "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
       "\"Paris\", "
       "\"n\": 3}}\n</tool_call>\n<tool_call>\n{\"function\": {\"name\": \"get_time\", "
       "\"arguments\": "
       "\"{\\\"tz\\\": \\\"UTC\\\"}\"}}\n</tool_call>"},
      {ToolCallFormat::kMistral,
       R"([TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo"}}, {"name": "noop", "arguments": null}])"},
      {ToolCallFormat::kGranite,
       R"(Checking.<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Oslo"}}, {"name": "get_time", "arguments": {}}])"},
      {ToolCallFormat::kQwen3Coder,
       "Sure.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Francisco, "
       "CA\n</parameter>\n"
       "<parameter=days>\n3\n</parameter>\n<parameter=opts>\n{\"a\": [1, "
       "2]}\n</parameter>\n</function>\n"
       "</tool_call>\n<tool_call>\n<function=get_time>\n</function>\n</tool_call>"},
      // GLM-4.5 (its template's layout; "94110" a zip code the tool declares a string), and
      // GLM-4.7's (no newlines) with spaces where a model put them.
      {ToolCallFormat::kGlm45,
       "Let me check.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>San "
       "Francisco</arg_value>\n<arg_key>zip</arg_key>\n<arg_value>94110</arg_value>\n"
       "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>\n<tool_call>get_time\n"
       "</tool_call>",
       {{"get_weather", {"city", "zip"}}}},
      {ToolCallFormat::kGlm45,
       "<tool_call>ls <arg_key>path</arg_key> <arg_value>src</arg_value><arg_key>opts</arg_key>"
       "<arg_value>{\"all\": true}</arg_value> </tool_call><tool_call>pwd</tool_call>"},
      {ToolCallFormat::kDeepSeekV3,
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
       "{\"city\": \"Paris\", \"n\": 2.50}\n```<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time"
       "<｜tool▁sep｜>{\"tz\": \"UTC\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"},
      {ToolCallFormat::kLlama3Json,
       R"(<|python_tag|>{"name": "search", "parameters": {"query": "a;b", "k": 10}}; {"name": "other", "parameters": {}})"},
  };
}

// Every prefix of every reply: the calls seen so far have the final names, in order, and
// arguments that are a prefix of the final arguments (so deltas concatenate to them); the
// whole reply gives exactly the parsed calls.
TEST(ToolCallStreamTest, ArgumentsOnlyGrowAndEndAsTheParsedCalls) {
  for (const Reply& reply : Replies()) {
    const ParsedReply parsed = ParseToolCalls(reply.format, reply.text, reply.string_parameters);
    ASSERT_FALSE(parsed.calls.empty()) << reply.text;
    std::vector<size_t> seen(parsed.calls.size(), 0);
    size_t reported = 0;
    for (size_t cut = 0; cut <= reply.text.size(); ++cut) {
      const std::vector<PartialToolCall> calls = PartialToolCalls(
          reply.format, std::string_view(reply.text).substr(0, cut), reply.string_parameters);
      ASSERT_LE(calls.size(), parsed.calls.size()) << cut;
      ASSERT_GE(calls.size(), reported) << "cut " << cut << ": a call seen before disappeared";
      reported = calls.size();
      for (size_t i = 0; i < calls.size(); ++i) {
        ASSERT_EQ(calls[i].name, parsed.calls[i].name) << cut;
        const std::string& whole = parsed.calls[i].arguments;
        ASSERT_EQ(whole.compare(0, calls[i].arguments.size(), calls[i].arguments), 0)
            << "cut " << cut << ": '" << calls[i].arguments << "' is not a prefix of '" << whole
            << "'";
        ASSERT_GE(calls[i].arguments.size(), seen[i]) << cut;  // never shrinks
        seen[i] = calls[i].arguments.size();
        if (calls[i].complete) {
          ASSERT_EQ(calls[i].arguments, whole) << cut;
        }
      }
    }
    const std::vector<PartialToolCall> final_calls =
        PartialToolCalls(reply.format, reply.text, reply.string_parameters);
    ASSERT_EQ(final_calls.size(), parsed.calls.size()) << reply.text;
    for (size_t i = 0; i < final_calls.size(); ++i) {
      EXPECT_TRUE(final_calls[i].complete) << reply.text;
      EXPECT_EQ(final_calls[i].arguments, parsed.calls[i].arguments);
    }
  }
}

TEST(ToolCallStreamTest, ArgumentsStreamBeforeTheCallEnds) {
  const std::string text =
      R"({"tool_calls": [{"name": "write", "arguments": {"body": "a long text)";
  const std::vector<PartialToolCall> calls = PartialToolCalls(ToolCallFormat::kGeneric, text);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].name, "write");
  EXPECT_EQ(calls[0].arguments, R"({"body":"a long text)");
  EXPECT_FALSE(calls[0].complete);
  // A number is held until it ends; an escape until it is whole.
  EXPECT_EQ(PartialToolCalls(ToolCallFormat::kGeneric, R"({"name": "f", "arguments": {"n": 12)")[0]
                .arguments,
            R"({"n":)");
  EXPECT_EQ(
      PartialToolCalls(ToolCallFormat::kGeneric, R"({"name": "f", "arguments": {"s": "x\u00)")[0]
          .arguments,
      R"({"s":"x)");
}

TEST(ToolCallStreamTest, DeepNestingStopsTheScanNotTheProcess) {
  const std::string deep = R"({"name": "f", "arguments": {"a": )" + std::string(100000, '[');
  const std::vector<PartialToolCall> calls = PartialToolCalls(ToolCallFormat::kGeneric, deep);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_FALSE(calls[0].complete);
  EXPECT_LT(calls[0].arguments.size(), 200u);
}

TEST(ToolCallStreamTest, TextAndOtherFormatsHaveNoPartialCalls) {
  EXPECT_TRUE(PartialToolCalls(ToolCallFormat::kGeneric, "It is sunny.").empty());
  EXPECT_TRUE(PartialToolCalls(ToolCallFormat::kGeneric, R"({"tool_calls": [{"arguments": {"a": 1)")
                  .empty());
  EXPECT_TRUE(PartialToolCalls(ToolCallFormat::kHermes, "No call here <tool_").empty());
  EXPECT_TRUE(PartialToolCalls(ToolCallFormat::kPythonic, "[f(a=1)]").empty());
  EXPECT_TRUE(PartialToolCalls(ToolCallFormat::kQwen3Coder, "<tool_call>\n<function=f").empty());
  EXPECT_TRUE(PartialToolCalls(ToolCallFormat::kGlm45, "<tool_call>get_wea").empty());
}

// GLM-4.5: a call once its name's line ends; each argument once its value closes.
TEST(ToolCallStreamTest, Glm45ArgumentsGrowByWholeValues) {
  const std::string head = "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Par";
  std::vector<PartialToolCall> calls = PartialToolCalls(ToolCallFormat::kGlm45, head);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].name, "get_weather");
  EXPECT_EQ(calls[0].arguments, "{");
  EXPECT_FALSE(calls[0].complete);
  calls = PartialToolCalls(ToolCallFormat::kGlm45, head + "is</arg_value>\n<arg_key>da");
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].arguments, R"({"city":"Paris")");
}

}  // namespace
}  // namespace loom::api
