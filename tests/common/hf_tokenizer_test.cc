#include "common/hf_tokenizer.h"

#include <string>
#include <vector>

#include "common/tokenizer.h"
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
      R"({"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "x+"},
                   "behavior": "Isolated", "invert": false}, )");
  split.replace(split.find(R"("use_regex": true})"), 18, R"("use_regex": false}]})");
  files.tokenizer_json = split;
  EXPECT_THAT(std::string(View(files).status().message()), HasSubstr("regex 'x+'"));
  files.tokenizer_json = kByteLevel;
  files.tokenizer_config_json = R"({"eos_token": "<nope>"})";
  EXPECT_THAT(std::string(View(files).status().message()), HasSubstr("'<nope>'"));
}

}  // namespace
}  // namespace loom::common
