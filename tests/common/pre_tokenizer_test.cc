#include "common/tokenizer/pre_tokenizer.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace loom::common {
namespace {

std::vector<std::string> SplitWith(const std::string& family, const std::string& text) {
  auto pre_tokenizer = PreTokenizer::ForName(family);
  EXPECT_TRUE(pre_tokenizer.ok()) << pre_tokenizer.status();
  if (!pre_tokenizer.ok()) return {};
  std::vector<TextSpan> spans;
  (*pre_tokenizer)->Split(text, &spans);
  std::vector<std::string> pieces;
  size_t covered = 0;
  for (const TextSpan& span : spans) {
    EXPECT_EQ(span.offset, covered) << "pieces must be consecutive";
    EXPECT_GT(span.length, 0u);
    covered = span.offset + span.length;
    pieces.push_back(text.substr(span.offset, span.length));
  }
  EXPECT_EQ(covered, text.size());
  return pieces;
}

using Pieces = std::vector<std::string>;

TEST(PreTokenizerTest, Gpt2LeavesTheLastSpaceOfARunToTheNextWord) {
  EXPECT_EQ(SplitWith("gpt-2", "a   b"), (Pieces{"a", "  ", " b"}));
  EXPECT_EQ(SplitWith("gpt-2", "Hello world!!"), (Pieces{"Hello", " world", "!!"}));
  EXPECT_EQ(SplitWith("gpt-2", "end  "), (Pieces{"end", "  "}));
  EXPECT_EQ(SplitWith("gpt-2", "I've 42"), (Pieces{"I", "'ve", " 42"}));
}

TEST(PreTokenizerTest, TreatsNextLineAndNoBreakSpaceAsWhiteSpace) {
  // U+0085 and U+00A0 are White_Space: "\s+(?!\S)" takes all but the last.
  EXPECT_EQ(SplitWith("gpt-2", "a\xC2\x85\xC2\xA0" "b"), (Pieces{"a", "\xC2\x85", "\xC2\xA0", "b"}));
}

TEST(PreTokenizerTest, SmolLmIsolatesEveryDigitBeforeTheGpt2Regex) {
  EXPECT_EQ(SplitWith("smollm", "x  123"), (Pieces{"x", "  ", "1", "2", "3"}));
  EXPECT_EQ(SplitWith("smollm", "v2.0"), (Pieces{"v", "2", ".", "0"}));
}

TEST(PreTokenizerTest, Llama3GroupsDigitsByThreeAndAttachesPunctuationToLetters) {
  EXPECT_EQ(SplitWith("llama-bpe", "12345 (abc)"), (Pieces{"123", "45", " (", "abc", ")"}));
  EXPECT_EQ(SplitWith("llama-bpe", "don'T\n\n"), (Pieces{"don", "'T", "\n\n"}));
}

TEST(PreTokenizerTest, KeepsInvalidUtf8InGapPieces) {
  const std::string text = "ab\xFF" "cd \xC3";
  const Pieces pieces = SplitWith("gpt-2", text);
  std::string joined;
  for (const std::string& piece : pieces) joined += piece;
  EXPECT_EQ(joined, text);
}

TEST(PreTokenizerTest, SurvivesVeryLongWhiteSpaceRuns) {
  const std::string text = "a" + std::string(1 << 20, ' ') + "b";
  const Pieces pieces = SplitWith("gpt-2", text);
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[1].size(), (1u << 20) - 1);
}

TEST(PreTokenizerTest, RejectsUnknownFamilyByName) {
  auto pre_tokenizer = PreTokenizer::ForName("martian");
  ASSERT_FALSE(pre_tokenizer.ok());
  EXPECT_NE(pre_tokenizer.status().message().find("martian"), absl::string_view::npos);
}

TEST(PreTokenizerTest, CompilesEveryKnownFamily) {
  for (const char* name : {"gpt-2", "llama-bpe", "smollm", "starcoder", "qwen2", "deepseek-llm",
                           "deepseek-coder", "deepseek-v3", "falcon", "gpt-4o", "tekken",
                           "bloom", "viking", "default", "chatglm-bpe"}) {
    auto pre_tokenizer = PreTokenizer::ForName(name);
    EXPECT_TRUE(pre_tokenizer.ok()) << name << ": " << pre_tokenizer.status();
  }
}

}  // namespace
}  // namespace loom::common
