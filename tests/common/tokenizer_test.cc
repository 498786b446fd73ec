#include "common/tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "common/formats/gguf_file.h"
#include "tests/common/tokenizer_test_util.h"

namespace loom::common {
namespace {

using testing::LoadTokenizer;
using testing::LoadVocab;
using testing::ModelPath;
using testing::ReadFileOrEmpty;
using testing::TokenizerDataDir;

// One llama.cpp test case: the input text and the ids Hugging Face gave for it.
struct VocabCase {
  std::string text;
  std::vector<int32_t> expected_ids;
};

// `.inp` holds each input followed by "\n__ggml_vocab_test__\n" (so an input may itself
// start or end with newlines); `.out` holds one line of space-separated ids per input.
std::vector<VocabCase> ReadVocabCases(const std::string& name) {
  const std::string base = TokenizerDataDir() + "/ggml-vocab-" + name + ".gguf";
  const std::string inputs = ReadFileOrEmpty(base + ".inp");
  const std::string outputs = ReadFileOrEmpty(base + ".out");
  std::vector<VocabCase> cases;
  const std::string separator = "\n__ggml_vocab_test__\n";
  size_t start = 0;
  while (true) {
    const size_t end = inputs.find(separator, start);
    if (end == std::string::npos) break;
    cases.push_back({inputs.substr(start, end - start), {}});
    start = end + separator.size();
  }
  std::istringstream lines(outputs);
  std::string line;
  size_t index = 0;
  while (std::getline(lines, line)) {
    if (index >= cases.size()) {
      ADD_FAILURE() << base << ".out has more lines than .inp has inputs";
      break;
    }
    std::istringstream ids(line);
    int32_t id = 0;
    while (ids >> id) cases[index].expected_ids.push_back(id);
    ++index;
  }
  EXPECT_EQ(index, cases.size()) << base << ": .inp and .out disagree on the number of cases";
  return cases;
}

std::string Describe(const std::vector<int32_t>& ids) {
  std::string out;
  for (int32_t id : ids) out += " " + std::to_string(id);
  return out;
}

class VocabTestData : public ::testing::TestWithParam<std::string> {};

TEST_P(VocabTestData, EncodesEveryCaseAsHuggingFaceAndLlamaCpp) {
  auto tokenizer = LoadVocab(GetParam());
  ASSERT_NE(tokenizer, nullptr);
  const std::vector<VocabCase> cases = ReadVocabCases(GetParam());
  ASSERT_GE(cases.size(), 40u);
  int mismatches = 0;
  for (const VocabCase& c : cases) {
    const std::vector<int32_t> ids =
        tokenizer->Encode(c.text, /*add_special=*/false, /*parse_special=*/false);
    if (ids != c.expected_ids) {
      ++mismatches;
      ADD_FAILURE() << "input '" << c.text << "'\n  expected" << Describe(c.expected_ids)
                    << "\n  got     " << Describe(ids);
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST_P(VocabTestData, DecodeGivesBackEveryInput) {
  auto tokenizer = LoadVocab(GetParam());
  ASSERT_NE(tokenizer, nullptr);
  for (const VocabCase& c : ReadVocabCases(GetParam())) {
    auto text = tokenizer->Decode(c.expected_ids, /*skip_special=*/false);
    ASSERT_TRUE(text.ok()) << text.status();
    EXPECT_EQ(*text, c.text);
  }
}

INSTANTIATE_TEST_SUITE_P(AllVocabularies, VocabTestData,
                         ::testing::Values("gpt-2", "llama-spm", "phi-3", "deepseek-coder"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

TEST(SpmTokenizerTest, AddsBosOnlyWhenAskedForSpecialTokens) {
  auto tokenizer = LoadVocab("llama-spm");
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->bos_id(), 1);
  EXPECT_EQ(tokenizer->eos_id(), 2);
  const std::vector<int32_t> plain = tokenizer->Encode("Hello world", false, true);
  const std::vector<int32_t> with_bos = tokenizer->Encode("Hello world", true, true);
  ASSERT_EQ(with_bos.size(), plain.size() + 1);
  EXPECT_EQ(with_bos[0], 1);
  EXPECT_TRUE(std::equal(plain.begin(), plain.end(), with_bos.begin() + 1));
  EXPECT_EQ(tokenizer->Encode("", true, true), std::vector<int32_t>{1});
}

TEST(SpmTokenizerTest, PutsSpaceBeforeTextAfterSpecialTokenAndDropsItOnDecode) {
  auto tokenizer = LoadVocab("llama-spm");
  ASSERT_NE(tokenizer, nullptr);
  // "</s>" is a control token: with parse_special it is one id, and the text after it
  // gets a space prefix again, as llama.cpp does.
  const std::vector<int32_t> ids = tokenizer->Encode("Hello</s>world", false, true);
  const std::vector<int32_t> hello = tokenizer->Encode("Hello", false, true);
  const std::vector<int32_t> world = tokenizer->Encode("world", false, true);
  std::vector<int32_t> expected = hello;
  expected.push_back(2);
  expected.insert(expected.end(), world.begin(), world.end());
  EXPECT_EQ(ids, expected);
  auto decoded = tokenizer->Decode(hello, false);
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(*decoded, "Hello");
}

TEST(SpmTokenizerTest, UsesByteTokensForCharactersOutsideTheVocabulary) {
  auto tokenizer = LoadVocab("llama-spm");
  ASSERT_NE(tokenizer, nullptr);
  // U+1F9D9 (mage) has no token: its 4 UTF-8 bytes become <0xF0> <0x9F> <0xA7> <0x99>.
  const std::vector<int32_t> ids = tokenizer->Encode("\xF0\x9F\xA7\x99", false, false);
  ASSERT_EQ(ids.size(), 5u);  // "▁" then the four bytes
  EXPECT_EQ(tokenizer->TokenText(ids[1]), "<0xF0>");
  EXPECT_EQ(tokenizer->TokenBytes(ids[1]), "\xF0");
  EXPECT_EQ(tokenizer->TokenBytes(ids[4]), "\x99");
}

class SmolLm2TokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tokenizer_ = LoadTokenizer(ModelPath());
    ASSERT_NE(tokenizer_, nullptr);
  }
  std::unique_ptr<Tokenizer> tokenizer_;
};

TEST_F(SmolLm2TokenizerTest, ParsesChatMarkersAsSingleTokens) {
  const std::string text = "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n";
  const std::vector<int32_t> ids = tokenizer_->Encode(text, true, true);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.front(), 1);  // <|im_start|>; SmolLM2 adds no BOS of its own
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 1), 2);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 2), 1);
  EXPECT_EQ(tokenizer_->TokenText(1), "<|im_start|>");
  EXPECT_TRUE(tokenizer_->IsSpecial(1));
  auto decoded = tokenizer_->Decode(ids, false);
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(*decoded, text);
}

TEST_F(SmolLm2TokenizerTest, TreatsChatMarkersAsTextWithoutParseSpecial) {
  const std::string text = "<|im_start|>user";
  const std::vector<int32_t> ids = tokenizer_->Encode(text, true, false);
  EXPECT_GT(ids.size(), 2u);
  for (int32_t id : ids) EXPECT_FALSE(tokenizer_->IsSpecial(id)) << id;
  auto decoded = tokenizer_->Decode(ids, true);
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(*decoded, text);
}

TEST_F(SmolLm2TokenizerTest, SplitsNumbersIntoSingleDigits) {
  const std::vector<int32_t> ids = tokenizer_->Encode("12345", false, true);
  ASSERT_EQ(ids.size(), 5u);
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(tokenizer_->TokenBytes(ids[i]), std::string(1, static_cast<char>('1' + i)));
  }
}

TEST_F(SmolLm2TokenizerTest, DecodeSkipsSpecialTokensOnlyWhenAsked) {
  const std::vector<int32_t> ids = tokenizer_->Encode("<|im_start|>Hello<|im_end|>", false, true);
  auto kept = tokenizer_->Decode(ids, false);
  auto skipped = tokenizer_->Decode(ids, true);
  ASSERT_TRUE(kept.ok());
  ASSERT_TRUE(skipped.ok());
  EXPECT_EQ(*kept, "<|im_start|>Hello<|im_end|>");
  EXPECT_EQ(*skipped, "Hello");
}

TEST_F(SmolLm2TokenizerTest, DecodeRejectsIdsOutsideTheVocabulary) {
  EXPECT_EQ(tokenizer_->vocab_size(), 49152);
  EXPECT_FALSE(tokenizer_->Decode(std::vector<int32_t>{5, 49152}, false).ok());
  EXPECT_FALSE(tokenizer_->Decode(std::vector<int32_t>{-1}, false).ok());
  EXPECT_EQ(tokenizer_->TokenBytes(49152), "");
  EXPECT_EQ(tokenizer_->TokenText(-3), "");
}

TEST_F(SmolLm2TokenizerTest, EndsGenerationAtImEndAndEndOfText) {
  const std::vector<int32_t> eog = tokenizer_->EndOfGenerationIds();
  EXPECT_EQ(tokenizer_->eos_id(), 2);
  EXPECT_NE(std::find(eog.begin(), eog.end(), 2), eog.end());  // <|im_end|>
  EXPECT_NE(std::find(eog.begin(), eog.end(), 0), eog.end());  // <|endoftext|>
  EXPECT_EQ(std::find(eog.begin(), eog.end(), 1), eog.end());  // <|im_start|> does not end
}

TEST_F(SmolLm2TokenizerTest, EncodesLongRunsLikeShortOnes) {
  // Words longer than the short-word limit use the heap merge; the result must be the
  // same as encoding the pieces the pre-tokenizer would make anyway.
  const std::string word(300, 'a');
  const std::vector<int32_t> ids = tokenizer_->Encode(word, false, true);
  auto decoded = tokenizer_->Decode(ids, false);
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(*decoded, word);
  EXPECT_LT(ids.size(), 300u / 2);
  const std::string spaces(5000, ' ');
  auto spaces_decoded = tokenizer_->Decode(tokenizer_->Encode(spaces, false, true), false);
  ASSERT_TRUE(spaces_decoded.ok());
  EXPECT_EQ(*spaces_decoded, spaces);
}

TEST_F(SmolLm2TokenizerTest, KeepsInvalidUtf8BytesThroughARoundTrip) {
  // (SmolLM2 has no tokens for bytes that never occur in UTF-8, such as 0xFF: those are
  // dropped, as Hugging Face and llama.cpp drop them.)
  const std::string text = "ok\x80\xC3(bad\xE2\x82";
  const std::vector<int32_t> ids = tokenizer_->Encode(text, false, true);
  auto decoded = tokenizer_->Decode(ids, false);
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(*decoded, text);
}

// A minimal GGUF v3 image holding only metadata, for the factory's error paths.
class GgufBuilder {
 public:
  void AddString(const std::string& key, const std::string& value) {
    Key(key);
    U32(8);
    Str(value);
    ++count_;
  }
  void AddStringArray(const std::string& key, const std::vector<std::string>& values) {
    Key(key);
    U32(9);
    U32(8);
    U64(values.size());
    for (const std::string& value : values) Str(value);
    ++count_;
  }
  std::string Build() const {
    std::string header = "GGUF";
    auto put = [&](uint64_t value, int bytes) {
      for (int i = 0; i < bytes; ++i) header.push_back(static_cast<char>(value >> (8 * i)));
    };
    put(3, 4);       // version
    put(0, 8);       // tensors
    put(count_, 8);  // metadata entries
    return header + body_;
  }

 private:
  void U32(uint32_t value) {
    for (int i = 0; i < 4; ++i) body_.push_back(static_cast<char>(value >> (8 * i)));
  }
  void U64(uint64_t value) {
    for (int i = 0; i < 8; ++i) body_.push_back(static_cast<char>(value >> (8 * i)));
  }
  void Str(const std::string& value) {
    U64(value.size());
    body_ += value;
  }
  void Key(const std::string& key) { Str(key); }

  std::string body_;
  uint64_t count_ = 0;
};

absl::StatusOr<std::unique_ptr<Tokenizer>> TokenizerFromBuilder(const GgufBuilder& builder) {
  auto gguf = GgufFile::FromBytes(builder.Build());
  if (!gguf.ok()) return gguf.status();
  return Tokenizer::FromGguf(**gguf);
}

TEST(TokenizerFromGgufTest, RejectsAnUnknownPreTokenizerByName) {
  GgufBuilder builder;
  builder.AddString("tokenizer.ggml.model", "gpt2");
  builder.AddString("tokenizer.ggml.pre", "no-such-family");
  builder.AddStringArray("tokenizer.ggml.tokens", {"a", "b", "ab"});
  builder.AddStringArray("tokenizer.ggml.merges", {"a b"});
  auto tokenizer = TokenizerFromBuilder(builder);
  ASSERT_FALSE(tokenizer.ok());
  EXPECT_NE(tokenizer.status().message().find("no-such-family"), absl::string_view::npos)
      << tokenizer.status();
}

TEST(TokenizerFromGgufTest, RejectsAnUnsupportedModel) {
  GgufBuilder builder;
  builder.AddString("tokenizer.ggml.model", "bert");
  builder.AddStringArray("tokenizer.ggml.tokens", {"a"});
  auto tokenizer = TokenizerFromBuilder(builder);
  ASSERT_FALSE(tokenizer.ok());
  EXPECT_NE(tokenizer.status().message().find("bert"), absl::string_view::npos);
}

TEST(TokenizerFromGgufTest, RejectsDuplicateTokens) {
  GgufBuilder builder;
  builder.AddString("tokenizer.ggml.model", "gpt2");
  builder.AddStringArray("tokenizer.ggml.tokens", {"a", "b", "a"});
  builder.AddStringArray("tokenizer.ggml.merges", {});
  EXPECT_FALSE(TokenizerFromBuilder(builder).ok());
}

// llama.cpp's rule for harmony vocabularies (gpt-oss): <|end|> ends a message, not the
// reply (the final channel follows the reasoning); <|return|> and <|call|> end generation.
TEST(TokenizerFromGgufTest, HarmonyVocabularyEndsAtReturnAndCallNotEnd) {
  for (const bool harmony : {false, true}) {
    GgufBuilder builder;
    builder.AddString("tokenizer.ggml.model", "gpt2");
    builder.AddString("tokenizer.ggml.pre", "gpt-4o");
    std::vector<std::string> tokens = {"a", "<|end|>", "<|channel|>", "<|call|>"};
    if (harmony) tokens.push_back("<|return|>");
    builder.AddStringArray("tokenizer.ggml.tokens", tokens);
    builder.AddStringArray("tokenizer.ggml.merges", {});
    auto tokenizer = TokenizerFromBuilder(builder);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    const std::vector<int32_t> eog = (*tokenizer)->EndOfGenerationIds();
    const auto ends = [&](int32_t id) {
      return std::find(eog.begin(), eog.end(), id) != eog.end();
    };
    EXPECT_EQ(ends(1), !harmony) << "<|end|>";
    EXPECT_FALSE(ends(2)) << "<|channel|>";
    EXPECT_EQ(ends(3), harmony) << "<|call|>";
    if (harmony) {
      EXPECT_TRUE(ends(4)) << "<|return|>";
    }
  }
}

TEST(TokenizerFromGgufTest, BuildsAMinimalByteLevelTokenizerWithMerges) {
  GgufBuilder builder;
  builder.AddString("tokenizer.ggml.model", "gpt2");
  builder.AddString("tokenizer.ggml.pre", "gpt-2");
  builder.AddStringArray("tokenizer.ggml.tokens", {"a", "b", "ab", "\xC4\xA0", "\xC4\xA0" "ab"});
  builder.AddStringArray("tokenizer.ggml.merges", {"a b", "\xC4\xA0 ab"});
  auto tokenizer = TokenizerFromBuilder(builder);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ((*tokenizer)->Encode("ab ab a", false, false), (std::vector<int32_t>{2, 4, 3, 0}));
  EXPECT_EQ((*tokenizer)->bos_id(), -1);
}

}  // namespace
}  // namespace loom::common
