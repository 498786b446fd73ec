#include "common/tokenizer/incremental_decoder.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/unicode.h"
#include "tests/common/tokenizer_test_util.h"

namespace loom::common {
namespace {

using testing::LoadTokenizer;
using testing::LoadVocab;
using testing::ModelPath;

TEST(IncrementalDecoderTest, HoldsBytesOfACharacterSplitAcrossByteTokens) {
  auto tokenizer = LoadVocab("llama-spm");
  ASSERT_NE(tokenizer, nullptr);
  // "🧙" has no token: "▁" then four byte tokens.
  const std::vector<int32_t> ids = tokenizer->Encode("\xF0\x9F\xA7\x99!", false, false);
  ASSERT_GE(ids.size(), 6u);
  IncrementalDecoder decoder(*tokenizer, /*skip_special=*/false);
  EXPECT_EQ(decoder.Append(ids[0]), "");  // the prefix space is dropped at the start
  EXPECT_EQ(decoder.Append(ids[1]), "");
  EXPECT_EQ(decoder.Append(ids[2]), "");
  EXPECT_EQ(decoder.Append(ids[3]), "");
  EXPECT_EQ(decoder.Append(ids[4]), "\xF0\x9F\xA7\x99");
  std::string rest;
  for (size_t i = 5; i < ids.size(); ++i) rest += decoder.Append(ids[i]);
  EXPECT_EQ(rest, "!");
  EXPECT_EQ(decoder.Flush(), "");
}

TEST(IncrementalDecoderTest, ConcatenatedOutputEqualsFullDecodeAndIsAlwaysValidUtf8) {
  for (const char* vocab : {"gpt-2", "llama-spm", "phi-3", "deepseek-coder"}) {
    auto tokenizer = LoadVocab(vocab);
    ASSERT_NE(tokenizer, nullptr);
    const std::string text =
        " Hello wörld! 你好，世界 🦙🦙 😶\u200d🌫️ кириллица\n\tcode(x) == 42 ✅ ﷽";
    const std::vector<int32_t> ids = tokenizer->Encode(text, true, false);
    IncrementalDecoder decoder(*tokenizer, /*skip_special=*/true);
    std::string streamed;
    for (int32_t id : ids) {
      const std::string piece = decoder.Append(id);
      EXPECT_TRUE(IsValidUtf8(piece)) << vocab << " after id " << id;
      streamed += piece;
    }
    streamed += decoder.Flush();
    auto full = tokenizer->Decode(ids, /*skip_special=*/true);
    ASSERT_TRUE(full.ok());
    EXPECT_EQ(streamed, *full) << vocab;
    EXPECT_EQ(streamed, text) << vocab;
  }
}

TEST(IncrementalDecoderTest, FlushTurnsAnIncompleteCharacterIntoOneReplacementCharacter) {
  auto tokenizer = LoadVocab("llama-spm");
  ASSERT_NE(tokenizer, nullptr);
  const std::vector<int32_t> ids = tokenizer->Encode("\xF0\x9F\xA7\x99", false, false);
  ASSERT_EQ(ids.size(), 5u);
  IncrementalDecoder decoder(*tokenizer, false);
  std::string out;
  for (size_t i = 0; i < 3; ++i) out += decoder.Append(ids[i]);  // "▁", F0, 9F
  EXPECT_EQ(out, "");
  EXPECT_EQ(decoder.Flush(), kReplacementCharacter);
  EXPECT_EQ(decoder.Flush(), "");
}

TEST(IncrementalDecoderTest, ReplacesABytethatCanNeverStartACharacterAtOnce) {
  auto tokenizer = LoadVocab("llama-spm");
  ASSERT_NE(tokenizer, nullptr);
  const int32_t byte_ff = 3 + 0xFF;  // <0xFF>: byte tokens follow <unk>, <s>, </s>
  ASSERT_EQ(tokenizer->TokenText(byte_ff), "<0xFF>");
  IncrementalDecoder decoder(*tokenizer, false);
  EXPECT_EQ(decoder.Append(byte_ff), kReplacementCharacter);
  EXPECT_EQ(decoder.Flush(), "");
}

TEST(IncrementalDecoderTest, SkipsSpecialTokensOnlyWhenAsked) {
  auto tokenizer = LoadTokenizer(ModelPath());
  ASSERT_NE(tokenizer, nullptr);
  const std::vector<int32_t> ids = tokenizer->Encode("<|im_start|>hi<|im_end|>", false, true);
  IncrementalDecoder skipping(*tokenizer, true);
  IncrementalDecoder keeping(*tokenizer, false);
  std::string skipped, kept;
  for (int32_t id : ids) {
    skipped += skipping.Append(id);
    kept += keeping.Append(id);
  }
  EXPECT_EQ(skipped, "hi");
  EXPECT_EQ(kept, "<|im_start|>hi<|im_end|>");
}

TEST(IncrementalDecoderTest, IgnoresIdsOutsideTheVocabulary) {
  auto tokenizer = LoadVocab("gpt-2");
  ASSERT_NE(tokenizer, nullptr);
  IncrementalDecoder decoder(*tokenizer, false);
  EXPECT_EQ(decoder.Append(-5), "");
  EXPECT_EQ(decoder.Append(tokenizer->vocab_size()), "");
  EXPECT_EQ(decoder.Flush(), "");
}

}  // namespace
}  // namespace loom::common
