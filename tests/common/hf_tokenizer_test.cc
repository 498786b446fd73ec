#include "common/tokenizer/hf_tokenizer.h"

#include <string>
#include <vector>

#include "common/tokenizer/pre_tokenizer.h"
#include "common/tokenizer/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::common {
namespace {

using ::testing::HasSubstr;

// A byte-level vocabulary: the bytes of "hello world" as GPT-2 byte characters, merges that
// build "hello" and "Ġworld", and two added special tokens.
constexpr char kByteLevel[] = R"({
  "model": {"type": "BPE", "vocab": {"h": 0, "e": 1, "l": 2, "o": 3, "Ġ": 4, "w": 5, "r": 6,
    "d": 7, "he": 8, "ll": 9, "hell": 10, "hello": 11, "Ġw": 12, "or": 13, "Ġwor": 14,
    "ld": 15, "Ġworld": 16},
    "merges": ["h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "l d", ["Ġwor", "ld"]]},
  "added_tokens": [{"id": 17, "content": "<|im_start|>", "special": true},
                   {"id": 18, "content": "<|im_end|>", "special": true}],
  "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
  "decoder": {"type": "ByteLevel"}})";

absl::StatusOr<std::unique_ptr<GgufFile>> View(const HfTokenizerFiles& files) {
  GgufMetadataBuilder metadata;
  absl::Status status = HfTokenizerToGguf(files, metadata);
  if (!status.ok()) return status;
  return GgufFile::FromParts(std::move(metadata.entries()), {}, {}, nullptr);
}

TEST(HfTokenizerTest, ByteLevelBpeEncodesThroughTheGgufTokenizer) {
  HfTokenizerFiles files;
  files.tokenizer_json = kByteLevel;
  files.tokenizer_config_json = R"({"eos_token": "<|im_end|>", "add_bos_token": false,
    "chat_template": [{"name": "default", "template": "{{ messages }}"},
                      {"name": "tool_use", "template": "tools"}]})";
  files.generation_config_json = R"({"eos_token_id": [18, 17]})";
  auto view = View(files);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(*(*view)->GetString("tokenizer.ggml.pre"), "gpt-2");
  EXPECT_EQ(*(*view)->GetString("tokenizer.chat_template"), "{{ messages }}");
  EXPECT_EQ(*(*view)->GetString("tokenizer.chat_template.tool_use"), "tools");
  auto tokenizer = Tokenizer::FromGguf(**view);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ((*tokenizer)->Encode("hello world", false, true), (std::vector<int32_t>{11, 16}));
  EXPECT_EQ((*tokenizer)->Encode("<|im_start|>hello", false, true), (std::vector<int32_t>{17, 11}));
  EXPECT_EQ((*tokenizer)->eos_id(), 18);
  // generation_config.json's extra EOS id ends generation too.
  EXPECT_THAT((*tokenizer)->EndOfGenerationIds(), ::testing::Contains(17));
}

TEST(HfTokenizerTest, TemplateProcessingDecidesBosWhenTheConfigIsSilent) {
  std::string json = kByteLevel;
  json.insert(json.rfind('}'), R"(, "post_processor": {"type": "TemplateProcessing",
    "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}},
               {"Sequence": {"id": "A", "type_id": 0}}]})");
  HfTokenizerFiles files;
  files.tokenizer_json = json;
  auto view = View(files);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_TRUE(*(*view)->GetBool("tokenizer.ggml.add_bos_token"));
  EXPECT_EQ(*(*view)->GetInt("tokenizer.ggml.bos_token_id"), 17);
}

TEST(HfTokenizerTest, SentencePieceStyleBpeGetsMergeRankScores) {
  HfTokenizerFiles files;
  files.tokenizer_json = R"({
    "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
      {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
    "model": {"type": "BPE", "byte_fallback": true, "unk_token": "<unk>",
      "vocab": {"<unk>": 0, "<s>": 1, "</s>": 2, "<0x41>": 3, "▁": 4, "a": 5, "b": 6, "▁a": 7,
                "▁ab": 8},
      "merges": ["▁ a", "▁a b"]},
    "added_tokens": [{"id": 1, "content": "<s>", "special": true},
                     {"id": 2, "content": "</s>", "special": true}],
    "decoder": {"type": "Sequence", "decoders": [{"type": "ByteFallback"}]}})";
  files.tokenizer_config_json =
      R"({"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": true})";
  auto view = View(files);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(*(*view)->GetString("tokenizer.ggml.model"), "llama");
  auto tokenizer = Tokenizer::FromGguf(**view);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ((*tokenizer)->Encode("ab", true, true), (std::vector<int32_t>{1, 8}));
}

TEST(HfTokenizerTest, RefusesWhatItCannotReproduceByName) {
  HfTokenizerFiles files;
  files.tokenizer_json = R"({"model": {"type": "Unigram", "vocab": []}})";
  EXPECT_THAT(std::string(View(files).status().message()), HasSubstr("'Unigram'"));
  std::string split = kByteLevel;
  split.replace(
      split.find(R"({"type": "ByteLevel", "add_prefix_space")"), 0,
      R"({"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "(?<=x+)y"},
                   "behavior": "Isolated", "invert": false}, )");
  split.replace(split.find(R"("use_regex": true})"), 18, R"("use_regex": false}]})");
  files.tokenizer_json = split;
  // Any regex PCRE2 compiles is served; one it cannot (variable-length lookbehind) is
  // refused naming the pattern, as is an unknown behavior or pre-tokenizer.
  EXPECT_THAT(std::string(View(files).status().message()), HasSubstr("regex '(?<=x+)y'"));
  std::string behavior = split;
  behavior.replace(behavior.find("Isolated"), 8, "Sideways");
  files.tokenizer_json = behavior;
  EXPECT_THAT(std::string(View(files).status().message()), HasSubstr("'Sideways'"));
  std::string whitespace = split;
  whitespace.replace(whitespace.find(R"("type": "Split")"), 15, R"("type": "WhitespaceSplit")");
  files.tokenizer_json = whitespace;
  EXPECT_THAT(std::string(View(files).status().message()), HasSubstr("'WhitespaceSplit'"));
  files.tokenizer_json = kByteLevel;
  files.tokenizer_config_json = R"({"eos_token": "<nope>"})";
  EXPECT_THAT(std::string(View(files).status().message()), HasSubstr("'<nope>'"));
}

// tokenizers' SplitDelimiterBehavior and invert, on "a,b,,c" split at ",".
TEST(PreTokenizerRulesTest, SplitBehaviorsFollowTokenizers) {
  auto pieces = [](SplitBehavior behavior, bool invert) {
    auto pre = PreTokenizer::FromRules({{",", behavior, invert}}, false);
    EXPECT_TRUE(pre.ok()) << pre.status();
    const std::string text = "a,b,,c";
    std::vector<TextSpan> spans;
    (*pre)->Split(text, &spans);
    std::vector<std::string> out;
    for (const TextSpan& span : spans) out.push_back(text.substr(span.offset, span.length));
    return out;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(pieces(SplitBehavior::kIsolated, false), (V{"a", ",", "b", ",", ",", "c"}));
  EXPECT_EQ(pieces(SplitBehavior::kRemoved, false), (V{"a", "b", "c"}));
  EXPECT_EQ(pieces(SplitBehavior::kMergedWithPrevious, false), (V{"a,", "b,", ",", "c"}));
  EXPECT_EQ(pieces(SplitBehavior::kMergedWithNext, false), (V{"a", ",b", ",", ",c"}));
  EXPECT_EQ(pieces(SplitBehavior::kContiguous, false), (V{"a", ",", "b", ",,", "c"}));
  EXPECT_EQ(pieces(SplitBehavior::kRemoved, true), (V{",", ",", ","}));
}

TEST(PreTokenizerRulesTest, NormalizesBeforeSplitting) {
  auto pre = PreTokenizer::FromRules({}, false);
  ASSERT_TRUE(pre.ok());
  (*pre)->set_normalization(NormalizationForm::kNfc);
  std::string storage;
  EXPECT_EQ((*pre)->Normalize("e\u0301", &storage), "\u00e9");
  (*pre)->set_normalization(NormalizationForm::kNfkd);
  EXPECT_EQ((*pre)->Normalize("\ufb01\u00e9", &storage), "fie\u0301");
}

}  // namespace
}  // namespace loom::common
