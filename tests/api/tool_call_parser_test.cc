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

TEST(ToolCallParserTest, StreamableContentHoldsWhatMayBecomeACall) {
  EXPECT_EQ(StreamableContent(ToolCallFormat::kHermes, "Sure.<tool"), 5u);
  EXPECT_EQ(StreamableContent(ToolCallFormat::kHermes, "Sure.<b>"), 8u);
  EXPECT_EQ(StreamableContent(ToolCallFormat::kHermes, "Sure.<tool_call>\n{"), 5u);
  EXPECT_EQ(StreamableContent(ToolCallFormat::kMistral, "ok [TOOL"), 3u);
  EXPECT_EQ(StreamableContent(ToolCallFormat::kGeneric, "  {\"tool"), 0u);
  EXPECT_EQ(StreamableContent(ToolCallFormat::kGeneric, "\n"), 0u);
  EXPECT_EQ(StreamableContent(ToolCallFormat::kGeneric, "Hello {"), 7u);
  EXPECT_EQ(StreamableContent(ToolCallFormat::kLlama3Json, "<|python_tag|>"), 0u);
}

TEST(ToolCallParserTest, FormatFromTheTemplate) {
  EXPECT_EQ(ToolCallFormatOf("{{ '<tool_call>\\n' }}{{ tool_call | tojson }}"),
            ToolCallFormat::kHermes);
  EXPECT_EQ(ToolCallFormatOf("{{ '[TOOL_CALLS]' }}"), ToolCallFormat::kMistral);
  EXPECT_EQ(ToolCallFormatOf("{{- '<|python_tag|>' }}"), ToolCallFormat::kLlama3Json);
  EXPECT_EQ(ToolCallFormatOf("{% for m in messages %}{{ m.content }}{% endfor %}"),
            ToolCallFormat::kGeneric);
  EXPECT_NE(NewToolCallId(), NewToolCallId());
  EXPECT_EQ(NewToolCallId().size(), 29u);
}

}  // namespace
}  // namespace loom::api
