#include "api/reasoning_parser.h"

#include <string>

#include "gtest/gtest.h"

namespace loom::api {
namespace {

TEST(ReasoningParserTest, NamesAreVllms) {
  EXPECT_EQ(*ParseReasoningFormat(""), ReasoningFormat::kNone);
  EXPECT_EQ(*ParseReasoningFormat("deepseek_r1"), ReasoningFormat::kThinkTags);
  EXPECT_EQ(*ParseReasoningFormat("qwen3"), ReasoningFormat::kThinkTags);
  const absl::Status unknown = ParseReasoningFormat("granite").status();
  EXPECT_NE(unknown.message().find("deepseek_r1, qwen3 or glm45"), std::string::npos) << unknown;
  EXPECT_EQ(*ParseReasoningFormat("glm45"), ReasoningFormat::kThinkTags);
}

TEST(ReasoningParserTest, ThePromptSaysWhereTheReplyStarts) {
  EXPECT_TRUE(ReasoningStartsInside("<|im_start|>assistant\n<think>\n"));
  EXPECT_FALSE(ReasoningStartsInside("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(ReasoningStartsInside("<|im_start|>assistant\n"));
  // An earlier turn's closed thinking, then a new one opened.
  EXPECT_TRUE(ReasoningStartsInside("<think>a</think>b<think>"));
  // A user's literal <think> is not the template opening the reply's thinking.
  EXPECT_FALSE(ReasoningStartsInside("user: what does <think> do?\nassistant:"));
}

TEST(ReasoningParserTest, SplitsAWholeReply) {
  ReasoningSplit inside = SplitReasoning("let me see</think>\n\nIt is 4.", true);
  EXPECT_EQ(inside.reasoning, "let me see");
  EXPECT_EQ(inside.content, "\n\nIt is 4.");
  // A model that opens the thinking its template already opened.
  EXPECT_EQ(SplitReasoning("<think>\nhm</think>ok", true).reasoning, "\nhm");
  // Outside: only a reply that opens with <think> reasons.
  ReasoningSplit opens = SplitReasoning("\n<think>x</think>y", false);
  EXPECT_EQ(opens.reasoning, "x");
  EXPECT_EQ(opens.content, "y");
  ReasoningSplit plain = SplitReasoning("no thinking </think> here", false);
  EXPECT_FALSE(plain.reasoning.has_value());
  EXPECT_EQ(plain.content, "no thinking </think> here");
  // Cut off while thinking: all reasoning.
  ReasoningSplit cut = SplitReasoning("still thinking </thi", true);
  EXPECT_EQ(cut.reasoning, "still thinking </thi");
  EXPECT_EQ(cut.content, "");
}

// Every way of cutting the reply into deltas gives the whole reply's split, and no delta
// carries part of a tag.
TEST(ReasoningParserTest, StreamingEqualsWholeForEveryCut) {
  for (const bool inside : {true, false}) {
    for (const std::string reply :
         {"abc</think>def", "<think>x</think>\ny", " <think>a<b</think>c</think>d", "plain text",
          "<thinking>not a tag", "a</think", "<thi"}) {
      const ReasoningSplit whole = SplitReasoning(reply, inside);
      for (size_t cut = 0; cut <= reply.size(); ++cut) {
        ReasoningStream stream(inside);
        std::string reasoning;
        std::string content;
        for (const std::string& piece : {reply.substr(0, cut), reply.substr(cut)}) {
          ReasoningStream::Delta delta = stream.Add(piece);
          EXPECT_EQ(delta.reasoning.find("</"), std::string::npos) << reply << " at " << cut;
          reasoning += delta.reasoning;
          content += delta.content;
        }
        ReasoningStream::Delta last = stream.Finish();
        reasoning += last.reasoning;
        content += last.content;
        EXPECT_EQ(reasoning, whole.reasoning.value_or("")) << reply << " at " << cut;
        EXPECT_EQ(content, whole.content) << reply << " at " << cut;
        EXPECT_EQ(stream.reasoned(), whole.reasoning.has_value());
      }
    }
  }
}

TEST(ReasoningParserTest, CharacterByCharacter) {
  ReasoningStream stream(true);
  std::string reasoning;
  std::string content;
  for (const char c : std::string("step 1, step 2</think>Answer")) {
    ReasoningStream::Delta delta = stream.Add(std::string(1, c));
    reasoning += delta.reasoning;
    content += delta.content;
  }
  EXPECT_EQ(reasoning, "step 1, step 2");
  EXPECT_EQ(content, "Answer");
  EXPECT_TRUE(stream.Finish().content.empty());
}

}  // namespace
}  // namespace loom::api
