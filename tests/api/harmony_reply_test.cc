#include "api/harmony_reply.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace loom::api {
namespace {

const std::string kCall =
    "<|channel|>analysis<|message|>Need the weather; call the tool.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    "<|message|>{\"city\": \"Paris\", \"days\": 2}<|call|>";
const std::string kAnswer =
    "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>commentary"
    "<|message|>Checking... <|end|><|start|>assistant<|channel|>final<|message|>It is "
    "sunny.<|return|>";
// The recipient in the role header, and a reply that ends right after the arguments
// (<|call|> is an end-of-generation token, absent from the text).
const std::string kHeaderRecipient =
    "<|channel|>analysis<|message|>x<|end|><|start|>assistant to=functions.get_time"
    "<|channel|>commentary json<|message|>{\"tz\":\"UTC\"}";

TEST(HarmonyReplyTest, ChannelsAreReasoningContentAndCalls) {
  ParsedReply call = ParseHarmony(kCall);
  ASSERT_EQ(call.calls.size(), 1u);
  EXPECT_EQ(call.calls[0].name, "get_weather");
  EXPECT_EQ(call.calls[0].arguments, R"({"city":"Paris","days":2})");
  EXPECT_EQ(call.reasoning, "Need the weather; call the tool.");
  EXPECT_EQ(call.content, "");

  ParsedReply answer = ParseHarmony(kAnswer);
  EXPECT_TRUE(answer.calls.empty());
  EXPECT_EQ(answer.reasoning, "Easy.");
  EXPECT_EQ(answer.content, "Checking... It is sunny.");  // the preamble is shown too

  ParsedReply header = ParseHarmony(kHeaderRecipient);
  ASSERT_EQ(header.calls.size(), 1u);
  EXPECT_EQ(header.calls[0].name, "get_time");
  EXPECT_EQ(header.calls[0].arguments, R"({"tz":"UTC"})");

  // No channels: the model did not speak harmony, all of it is content.
  ParsedReply plain = ParseHarmony("Just text.");
  EXPECT_FALSE(plain.content.has_value());
  EXPECT_EQ(plain.content_end, 10u);
  // A call cut short of its arguments is no call.
  EXPECT_TRUE(ParseHarmony(kCall.substr(0, kCall.find("\"days\""))).calls.empty());
  EXPECT_EQ(ToolCallFormatOf("... <|start|>assistant<|channel|>final<|message|> ..."),
            ToolCallFormat::kGptOss);
}

// Every prefix: content and reasoning only grow, never show part of a special token, and
// end as the whole parse; call arguments are prefixes of the parsed ones.
TEST(HarmonyReplyTest, StreamedTextAndCallsOnlyGrow) {
  for (const std::string& text : {kCall, kAnswer, kHeaderRecipient}) {
    const ParsedReply whole = ParseHarmony(text);
    HarmonyText last;
    for (size_t cut = 0; cut <= text.size(); ++cut) {
      const std::string_view prefix = std::string_view(text).substr(0, cut);
      HarmonyText now = HarmonySoFar(prefix);
      ASSERT_EQ(now.content.compare(0, last.content.size(), last.content), 0) << cut;
      ASSERT_EQ(now.reasoning.compare(0, last.reasoning.size(), last.reasoning), 0) << cut;
      ASSERT_EQ(now.content.find("<|"), std::string::npos) << cut << ": " << now.content;
      ASSERT_EQ(now.reasoning.find("<|"), std::string::npos) << cut << ": " << now.reasoning;
      last = now;
      for (size_t i = 0; i < HarmonyPartialCalls(prefix).size(); ++i) {
        const PartialToolCall call = HarmonyPartialCalls(prefix)[i];
        ASSERT_LT(i, whole.calls.size());
        EXPECT_EQ(call.name, whole.calls[i].name);
        ASSERT_EQ(whole.calls[i].arguments.compare(0, call.arguments.size(), call.arguments), 0)
            << cut << ": " << call.arguments;
      }
    }
    EXPECT_EQ(last.content, whole.content.value_or(""));
    EXPECT_EQ(last.reasoning, whole.reasoning.value_or(""));
  }
}

}  // namespace
}  // namespace loom::api
