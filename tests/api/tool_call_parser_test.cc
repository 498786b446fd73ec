#include "api/tool_call_parser.h"

#include <string>

#include "gtest/gtest.h"

namespace loom::api {
namespace {

// Replies as the models of each family write them (recorded from Qwen2.5-7B-Instruct,
// Llama-3.1-8B-Instruct and Mistral-Nemo-Instruct-2407 under vLLM).
TEST(ToolCallParserTest, HermesCallsAfterContent) {
  const std::string text =
      "Let me check both.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\", \"unit\": \"celsius\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", "
      "\"arguments\": {\"tz\": \"Europe/Paris\"}}\n</tool_call>";
  ParsedReply reply = ParseToolCalls(ToolCallFormat::kHermes, text);
  ASSERT_EQ(reply.calls.size(), 2u);
  EXPECT_EQ(reply.calls[0].name, "get_weather");
  EXPECT_EQ(reply.calls[0].arguments, R"({"city":"Paris","unit":"celsius"})");  // key order kept
  EXPECT_EQ(reply.calls[1].name, "get_time");
  EXPECT_EQ(text.substr(0, reply.content_end), "Let me check both.\n");
}

TEST(ToolCallParserTest, HermesLastCallMayLackItsClosingTag) {
  ParsedReply reply = ParseToolCalls(ToolCallFormat::kHermes,
                                     "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n");
  ASSERT_EQ(reply.calls.size(), 1u);
  EXPECT_EQ(reply.calls[0].arguments, "{}");
  EXPECT_EQ(reply.content_end, 0u);
}

TEST(ToolCallParserTest, MalformedCallsStayContent) {
  for (const char* text : {"<tool_call>\n{\"name\": \"f\", \"arguments\": {\n</tool_call>",
                           "<tool_call>\n{\"arguments\": {}}\n</tool_call>", "plain answer"}) {
    ParsedReply reply = ParseToolCalls(ToolCallFormat::kHermes, text);
    EXPECT_TRUE(reply.calls.empty()) << text;
    EXPECT_EQ(reply.content_end, std::string(text).size());
  }
  EXPECT_TRUE(ParseToolCalls(ToolCallFormat::kGeneric, "{\"answer\": 42}").calls.empty());
  EXPECT_TRUE(ParseToolCalls(ToolCallFormat::kLlama3Json, "The weather is nice.").calls.empty());
  EXPECT_TRUE(ParseToolCalls(ToolCallFormat::kMistral, "[TOOL_CALLS] not json").calls.empty());
  EXPECT_TRUE(ParseToolCalls(ToolCallFormat::kGranite, "<|tool_call|> not json").calls.empty());
  // Each list format takes its own marker only.
  EXPECT_TRUE(
      ParseToolCalls(ToolCallFormat::kGranite, R"([TOOL_CALLS][{"name": "f"}])").calls.empty());
}

TEST(ToolCallParserTest, Llama3JsonWithParameters) {
  ParsedReply reply = ParseToolCalls(
      ToolCallFormat::kLlama3Json,
      "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"San Francisco, CA\"}}");
  ASSERT_EQ(reply.calls.size(), 1u);
  EXPECT_EQ(reply.calls[0].name, "get_weather");
  EXPECT_EQ(reply.calls[0].arguments, R"({"city":"San Francisco, CA"})");
  EXPECT_EQ(reply.content_end, 0u);
  // The python tag (kept with skip_special_tokens false) and ';'-separated calls.
  reply = ParseToolCalls(ToolCallFormat::kLlama3Json,
                         "<|python_tag|>{\"name\": \"a\", \"parameters\": {\"q\": \"x;y\"}}; "
                         "{\"name\": \"b\", \"parameters\": {}}");
  ASSERT_EQ(reply.calls.size(), 2u);
  EXPECT_EQ(reply.calls[0].arguments, R"({"q":"x;y"})");
  EXPECT_EQ(reply.calls[1].name, "b");
}

TEST(ToolCallParserTest, MistralArrayAfterTheMarker) {
  const std::string text =
      "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}, "
      "{\"name\": \"get_time\", \"arguments\": \"{\\\"tz\\\": \\\"CET\\\"}\"}]";
  ParsedReply reply = ParseToolCalls(ToolCallFormat::kMistral, text);
  ASSERT_EQ(reply.calls.size(), 2u);
  EXPECT_EQ(reply.calls[0].arguments, R"({"city":"Oslo"})");
  EXPECT_EQ(reply.calls[1].arguments, R"({"tz": "CET"})");  // a string stays as sent
  EXPECT_EQ(reply.content_end, 0u);
}

// Granite 3.x: Mistral's list after <|tool_call|>, content before it.
TEST(ToolCallParserTest, GraniteArrayAfterItsMarker) {
  ParsedReply reply = ParseToolCalls(
      ToolCallFormat::kGranite,
      R"(Let me look.<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Oslo"}}])");
  ASSERT_EQ(reply.calls.size(), 1u);
  EXPECT_EQ(reply.calls[0].name, "get_weather");
  EXPECT_EQ(reply.calls[0].arguments, R"({"city":"Oslo"})");
  EXPECT_EQ(reply.content_end, 12u);
  EXPECT_EQ(ToolCallFormatOf("{%- if tools %}<|start_of_role|>available_tools<|end_of_role|>"
                             "{{ tools | tojson }}{% endif %}... <|tool_call|>"),
            ToolCallFormat::kGranite);
  EXPECT_STREQ(ToolCallFormatName(ToolCallFormat::kGranite), "granite");
}

TEST(ToolCallParserTest, GenericShapes) {
  for (const char* text : {R"({"tool_calls": [{"name": "f", "arguments": {"x": 1}}]})",
                           R"(  {"tool_call": {"name": "f", "arguments": {"x": 1}}})",
                           "```json\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n```"}) {
    ParsedReply reply = ParseToolCalls(ToolCallFormat::kGeneric, text);
    ASSERT_EQ(reply.calls.size(), 1u) << text;
    EXPECT_EQ(reply.calls[0].name, "f");
    EXPECT_EQ(reply.calls[0].arguments, R"({"x":1})");
  }
}

// Qwen3-Coder's XML form (its chat template's own example of a call).
TEST(ToolCallParserTest, Qwen3CoderXmlCalls) {
  const std::string text =
      "I'll look it up.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSan "
      "Francisco, CA\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=detailed>\n"
      "true\n</parameter>\n<parameter=units>\n{\"temp\": \"C\"}\n</parameter>\n</function>\n"
      "</tool_call>\n<tool_call>\n<function=get_time>\n</function>\n</tool_call>";
  ParsedReply reply = ParseToolCalls(ToolCallFormat::kQwen3Coder, text);
  ASSERT_EQ(reply.calls.size(), 2u);
  EXPECT_EQ(reply.calls[0].name, "get_weather");
  EXPECT_EQ(reply.calls[0].arguments,
            R"({"city":"San Francisco, CA","days":3,"detailed":true,"units":{"temp":"C"}})");
  EXPECT_EQ(reply.calls[1].name, "get_time");
  EXPECT_EQ(reply.calls[1].arguments, "{}");
  EXPECT_EQ(text.substr(0, reply.content_end), "I'll look it up.\n");
  // Cut off inside a value: what was written is the call.
  ParsedReply cut = ParseToolCalls(ToolCallFormat::kQwen3Coder,
                                   "<tool_call>\n<function=f>\n<parameter=q>\nhello");
  ASSERT_EQ(cut.calls.size(), 1u);
  EXPECT_EQ(cut.calls[0].arguments, R"({"q":"hello"})");
  // No function tag: all content.
  EXPECT_TRUE(ParseToolCalls(ToolCallFormat::kQwen3Coder, "<tool_call> nope").calls.empty());
}

// GLM-4.5's tags (its chat template's layout), values typed by the tools' schemas.
TEST(ToolCallParserTest, Glm45Calls) {
  const std::string text =
      "I'll look it up.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris"
      "</arg_value>\n<arg_key>zip</arg_key>\n<arg_value>75001</arg_value>\n<arg_key>days</arg_key>"
      "\n<arg_value>3</arg_value>\n<arg_key>units</arg_key>\n<arg_value>{\"temp\": \"C\"}"
      "</arg_value>\n</tool_call>\n<tool_call>get_time\n</tool_call>";
  // Without the tools' schemas a value is what it reads as.
  ParsedReply reply = ParseToolCalls(ToolCallFormat::kGlm45, text);
  ASSERT_EQ(reply.calls.size(), 2u);
  EXPECT_EQ(reply.calls[0].name, "get_weather");
  EXPECT_EQ(reply.calls[0].arguments,
            R"({"city":"Paris","zip":75001,"days":3,"units":{"temp":"C"}})");
  EXPECT_EQ(reply.calls[1].name, "get_time");
  EXPECT_EQ(reply.calls[1].arguments, "{}");
  EXPECT_EQ(text.substr(0, reply.content_end), "I'll look it up.\n");
  // A parameter declared a string stays one.
  reply = ParseToolCalls(ToolCallFormat::kGlm45, text, {{"get_weather", {"city", "zip"}}});
  EXPECT_EQ(reply.calls[0].arguments,
            R"({"city":"Paris","zip":"75001","days":3,"units":{"temp":"C"}})");
  // GLM-4.7 writes no newlines.
  reply = ParseToolCalls(ToolCallFormat::kGlm45,
                         "<tool_call>f<arg_key>q</arg_key><arg_value>true</arg_value></tool_call>");
  ASSERT_EQ(reply.calls.size(), 1u);
  EXPECT_EQ(reply.calls[0].name, "f");
  EXPECT_EQ(reply.calls[0].arguments, R"({"q":true})");
  // Cut inside a value: what was written is the call. Cut inside the name, or a key
  // without its value tag: content.
  reply = ParseToolCalls(ToolCallFormat::kGlm45, "<tool_call>f\n<arg_key>q</arg_key><arg_value>hi");
  ASSERT_EQ(reply.calls.size(), 1u);
  EXPECT_EQ(reply.calls[0].arguments, R"({"q":"hi"})");
  EXPECT_TRUE(ParseToolCalls(ToolCallFormat::kGlm45, "<tool_call>get_wea").calls.empty());
  EXPECT_TRUE(
      ParseToolCalls(ToolCallFormat::kGlm45, "<tool_call>f\n<arg_key>q</arg_key>x</tool_call>")
          .calls.empty());
  EXPECT_EQ(StreamableContent(ToolCallFormat::kGlm45, "ok <tool_"), 3u);
}

TEST(ToolCallParserTest, DeepSeekV3AndV31Calls) {
  const std::string v3 =
      "Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
      "```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜><｜tool▁call▁begin｜>function<｜tool▁"
      "sep｜>get_time\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
  ParsedReply reply = ParseToolCalls(ToolCallFormat::kDeepSeekV3, v3);
  ASSERT_EQ(reply.calls.size(), 2u);
  EXPECT_EQ(reply.calls[0].name, "get_weather");
  EXPECT_EQ(reply.calls[0].arguments, R"({"city":"Paris"})");
  EXPECT_EQ(reply.calls[1].name, "get_time");
  EXPECT_EQ(v3.substr(0, reply.content_end), "Checking.");
  const std::string v31 =
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Rome\"}"
      "<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
  reply = ParseToolCalls(ToolCallFormat::kDeepSeekV3, v31);
  ASSERT_EQ(reply.calls.size(), 1u);
  EXPECT_EQ(reply.calls[0].arguments, R"({"city":"Rome"})");
  EXPECT_EQ(reply.content_end, 0u);
  EXPECT_TRUE(ParseToolCalls(ToolCallFormat::kDeepSeekV3,
                             "<｜tool▁call▁begin｜>f<｜tool▁sep｜>not json<｜tool▁call▁end｜>")
                  .calls.empty());
}

TEST(ToolCallParserTest, PythonicCalls) {
  ParsedReply reply = ParseToolCalls(
      ToolCallFormat::kPythonic,
      "[get_weather(city='San Francisco', days=3, metric=True, extra=None), "
      "search(query=\"a \\\"quoted\\\" word\", tags=['x', \"y\"], opts={'k': 1.5, 'n': (1, 2)})]");
  ASSERT_EQ(reply.calls.size(), 2u);
  EXPECT_EQ(reply.calls[0].name, "get_weather");
  EXPECT_EQ(reply.calls[0].arguments,
            R"({"city":"San Francisco","days":3,"metric":true,"extra":null})");
  EXPECT_EQ(reply.calls[1].arguments,
            R"({"query":"a \"quoted\" word","tags":["x","y"],"opts":{"k":1.5,"n":[1,2]}})");
  EXPECT_EQ(reply.content_end, 0u);
  // One call without brackets, after Llama's python tag.
  reply = ParseToolCalls(ToolCallFormat::kPythonic, "<|python_tag|>get_time(zone=\"UTC\")");
  ASSERT_EQ(reply.calls.size(), 1u);
  EXPECT_EQ(reply.calls[0].arguments, R"({"zone":"UTC"})");
  // Not calls: prose, positional arguments, expressions, trailing text.
  for (const char* content : {"The weather is nice.", "[f(1)]", "[f(x=y)]", "[f(x=1)] and more",
                              "[f(x='open)]"}) {
    ParsedReply plain = ParseToolCalls(ToolCallFormat::kPythonic, content);
    EXPECT_TRUE(plain.calls.empty()) << content;
    EXPECT_EQ(plain.content_end, std::string(content).size()) << content;
  }
}

TEST(ToolCallParserTest, StreamableContentHoldsWhatMayBecomeACall) {
  EXPECT_EQ(StreamableContent(ToolCallFormat::kHermes, "Sure.<tool"), 5u);
  EXPECT_EQ(StreamableContent(ToolCallFormat::kHermes, "Sure.<b>"), 8u);
  EXPECT_EQ(StreamableContent(ToolCallFormat::kHermes, "Sure.<tool_call>\n{"), 5u);
  EXPECT_EQ(StreamableContent(ToolCallFormat::kMistral, "ok [TOOL"), 3u);
  EXPECT_EQ(StreamableContent(ToolCallFormat::kGranite, "ok <|tool_c"), 3u);
  EXPECT_EQ(StreamableContent(ToolCallFormat::kGranite, "ok <b>"), 6u);
  EXPECT_EQ(StreamableContent(ToolCallFormat::kGeneric, "  {\"tool"), 0u);
  EXPECT_EQ(StreamableContent(ToolCallFormat::kGeneric, "\n"), 0u);
  EXPECT_EQ(StreamableContent(ToolCallFormat::kGeneric, "Hello {"), 7u);
  EXPECT_EQ(StreamableContent(ToolCallFormat::kLlama3Json, "<|python_tag|>"), 0u);
  EXPECT_EQ(StreamableContent(ToolCallFormat::kPythonic, "[get_"), 0u);
  EXPECT_EQ(StreamableContent(ToolCallFormat::kPythonic, "Sure"), 4u);
  EXPECT_EQ(StreamableContent(ToolCallFormat::kQwen3Coder, "ok <tool_"), 3u);
  EXPECT_EQ(StreamableContent(ToolCallFormat::kQwen3Coder, "ok <function=f>"), 3u);
  EXPECT_EQ(StreamableContent(ToolCallFormat::kDeepSeekV3, "ok<｜tool▁calls▁begin｜>"), 2u);
}

TEST(ToolCallParserTest, FormatFromTheTemplate) {
  EXPECT_EQ(ToolCallFormatOf("{{ '<tool_call>\\n' }}{{ tool_call | tojson }}"),
            ToolCallFormat::kHermes);
  EXPECT_EQ(ToolCallFormatOf("{{ '[TOOL_CALLS]' }}"), ToolCallFormat::kMistral);
  EXPECT_EQ(ToolCallFormatOf("{{- '<|python_tag|>' }}"), ToolCallFormat::kLlama3Json);
  EXPECT_EQ(ToolCallFormatOf("{{ '<tool_call>\\n<function=' + name + '>' }}{{ '<parameter=' }}"),
            ToolCallFormat::kQwen3Coder);
  EXPECT_EQ(ToolCallFormatOf("{{ '\\n<tool_call>' + tc.name }}<arg_key>{{ k }}</arg_key>"),
            ToolCallFormat::kGlm45);
  EXPECT_STREQ(ToolCallFormatName(ToolCallFormat::kGlm45), "glm45");
  EXPECT_EQ(ToolCallFormatOf("{{'<｜tool▁calls▁begin｜>'}}"), ToolCallFormat::kDeepSeekV3);
  EXPECT_EQ(ToolCallFormatOf("respond in the format [func_name1(params_name1=params_value1)]"),
            ToolCallFormat::kPythonic);
  EXPECT_EQ(ToolCallFormatOf("{% for m in messages %}{{ m.content }}{% endfor %}"),
            ToolCallFormat::kGeneric);
  EXPECT_NE(NewToolCallId(), NewToolCallId());
  EXPECT_EQ(NewToolCallId().size(), 29u);
}

}  // namespace
}  // namespace loom::api
