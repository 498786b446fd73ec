// Tokenizer::FromGguf: reads `tokenizer.ggml.*` into a Vocab and builds the tokenizer
// the model names. Defaults and special-token rules follow llama.cpp's
// `llama_vocab::impl::load`, which is what GGUF files are written for.

#include "common/tokenizer/tokenizer.h"

#include <algorithm>
#include <cctype>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/tokenizer/bpe_tokenizer.h"
#include "common/tokenizer/pre_tokenizer.h"
#include "common/tokenizer/spm_tokenizer.h"
#include "common/status_macros.h"
#include "common/tokenizer/vocab.h"

namespace loom::common {
namespace {

// Token texts that end generation whatever their ids (llama.cpp's EOG list, trimmed to
// the ones in common use).
constexpr std::string_view kEndOfGenerationTexts[] = {
    "<|eot_id|>",    "<|im_end|>",    "<|end|>",       "<end_of_turn>",
    "<|endoftext|>", "<|eom_id|>",    "<EOT>",         "<|end_of_text|>",
    "<end_of_utterance>", "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",
};

// An optional key: NotFound becomes `fallback`, any other error is returned.
absl::StatusOr<int64_t> OptionalInt(const GgufFile& gguf, std::string_view key, int64_t fallback) {
  absl::StatusOr<int64_t> value = gguf.GetInt(key);
  if (absl::IsNotFound(value.status())) return fallback;
  return value;
}

absl::StatusOr<bool> OptionalBool(const GgufFile& gguf, std::string_view key, bool fallback) {
  absl::StatusOr<bool> value = gguf.GetBool(key);
  if (absl::IsNotFound(value.status())) return fallback;
  return value;
}

absl::StatusOr<std::string> OptionalString(const GgufFile& gguf, std::string_view key,
                                           std::string fallback) {
  absl::StatusOr<std::string_view> value = gguf.GetString(key);
  if (absl::IsNotFound(value.status())) return fallback;
  if (!value.ok()) return value.status();
  return std::string(*value);
}

// An array key that, when present, must have at least `min_size` elements.
absl::StatusOr<const GgufValue::Array*> OptionalArray(const GgufFile& gguf, std::string_view key,
                                                      size_t min_size) {
  absl::StatusOr<const GgufValue::Array*> array = gguf.GetArray(key);
  if (absl::IsNotFound(array.status())) return nullptr;
  if (!array.ok()) return array.status();
  if ((*array)->size() < min_size) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(key), " has ", (*array)->size(),
                                                   " entries for ", min_size, " tokens"));
  }
  return *array;
}

absl::Status ReadTokens(const GgufFile& gguf, Vocab* vocab) {
  LOOM_ASSIGN_OR_RETURN(const GgufValue::Array* tokens, gguf.GetArray("tokenizer.ggml.tokens"));
  const size_t num_tokens = tokens->size();
  if (num_tokens == 0 || num_tokens > static_cast<size_t>(INT32_MAX)) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer.ggml.tokens has ", num_tokens, " entries"));
  }
  LOOM_ASSIGN_OR_RETURN(const GgufValue::Array* types,
                        OptionalArray(gguf, "tokenizer.ggml.token_type", num_tokens));
  LOOM_ASSIGN_OR_RETURN(const GgufValue::Array* scores,
                        OptionalArray(gguf, "tokenizer.ggml.scores", num_tokens));
  vocab->texts.resize(num_tokens);
  vocab->types.assign(num_tokens, TokenType::kNormal);
  vocab->scores.assign(num_tokens, 0.0f);
  vocab->text_to_id.reserve(num_tokens);
  for (size_t id = 0; id < num_tokens; ++id) {
    absl::StatusOr<std::string_view> text = (*tokens)[id].AsString();
    if (!text.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer.ggml.tokens[", id, "]: ", text.status().message()));
    }
    // llama.cpp renames empty tokens so that every text is a unique key.
    vocab->texts[id] = text->empty() ? absl::StrCat("[EMPTY_", id, "]") : std::string(*text);
    if (!vocab->text_to_id.try_emplace(vocab->texts[id], static_cast<int32_t>(id)).second) {
      return absl::InvalidArgumentError(absl::StrCat("duplicate token '", vocab->texts[id],
                                                     "' in tokenizer.ggml.tokens at ", id));
    }
    if (types != nullptr) {
      absl::StatusOr<int64_t> type = (*types)[id].AsInt();
      if (!type.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("tokenizer.ggml.token_type[", id, "]: ", type.status().message()));
      }
      vocab->types[id] = (*type >= 0 && *type <= 6) ? static_cast<TokenType>(*type)
                                                     : TokenType::kUndefined;
    }
    if (scores != nullptr) {
      absl::StatusOr<double> score = (*scores)[id].AsDouble();
      if (!score.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("tokenizer.ggml.scores[", id, "]: ", score.status().message()));
      }
      vocab->scores[id] = static_cast<float>(*score);
    }
  }
  return absl::OkStatus();
}

// A special id from `key`, or `fallback` when absent; ids outside the vocabulary are
// ignored (llama.cpp warns and keeps the default).
absl::StatusOr<int32_t> ReadSpecialId(const GgufFile& gguf, const Vocab& vocab,
                                      std::string_view key, int32_t fallback) {
  if (!vocab.IsValid(fallback)) fallback = -1;
  LOOM_ASSIGN_OR_RETURN(int64_t id, OptionalInt(gguf, key, fallback));
  return id >= 0 && id < vocab.size() ? static_cast<int32_t>(id) : fallback;
}

absl::Status ReadSpecialTokens(const GgufFile& gguf, bool is_spm, bool adds_bos_by_default,
                               Vocab* vocab) {
  // llama.cpp's defaults: SentencePiece vocabularies put <unk>, <s>, </s> at 0, 1, 2.
  LOOM_ASSIGN_OR_RETURN(vocab->bos_id,
                        ReadSpecialId(gguf, *vocab, "tokenizer.ggml.bos_token_id", is_spm ? 1 : -1));
  LOOM_ASSIGN_OR_RETURN(vocab->eos_id,
                        ReadSpecialId(gguf, *vocab, "tokenizer.ggml.eos_token_id", is_spm ? 2 : -1));
  LOOM_ASSIGN_OR_RETURN(vocab->eot_id,
                        ReadSpecialId(gguf, *vocab, "tokenizer.ggml.eot_token_id", -1));
  LOOM_ASSIGN_OR_RETURN(vocab->eom_id,
                        ReadSpecialId(gguf, *vocab, "tokenizer.ggml.eom_token_id", -1));
  LOOM_ASSIGN_OR_RETURN(vocab->unknown_id, ReadSpecialId(gguf, *vocab,
                                                         "tokenizer.ggml.unknown_token_id",
                                                         is_spm ? 0 : -1));
  LOOM_ASSIGN_OR_RETURN(vocab->padding_id,
                        ReadSpecialId(gguf, *vocab, "tokenizer.ggml.padding_token_id", -1));

  LOOM_ASSIGN_OR_RETURN(vocab->add_bos, OptionalBool(gguf, "tokenizer.ggml.add_bos_token",
                                                     is_spm || adds_bos_by_default));
  LOOM_ASSIGN_OR_RETURN(vocab->add_eos,
                        OptionalBool(gguf, "tokenizer.ggml.add_eos_token", false));
  LOOM_ASSIGN_OR_RETURN(vocab->add_space_prefix,
                        OptionalBool(gguf, "tokenizer.ggml.add_space_prefix", is_spm));
  if (vocab->add_bos && vocab->bos_id < 0) {
    return absl::InvalidArgumentError(
        "tokenizer.ggml.add_bos_token is true, but tokenizer.ggml.bos_token_id is not set");
  }
  if (vocab->add_eos && vocab->eos_id < 0) {
    return absl::InvalidArgumentError(
        "tokenizer.ggml.add_eos_token is true, but tokenizer.ggml.eos_token_id is not set");
  }

  // End of generation: the special ids plus well-known end-of-turn texts. Like llama.cpp,
  // such a token is treated as CONTROL even where the file typed it otherwise.
  std::vector<int32_t>& eog = vocab->end_of_generation_ids;
  for (int32_t id : {vocab->eos_id, vocab->eot_id, vocab->eom_id}) {
    if (id >= 0) eog.push_back(id);
  }
  // Extra end-of-generation ids (a Hugging Face directory's generation_config.json).
  LOOM_ASSIGN_OR_RETURN(const GgufValue::Array* extra_eog,
                        OptionalArray(gguf, "tokenizer.loom.eog_token_ids", 0));
  if (extra_eog != nullptr) {
    for (const GgufValue& value : *extra_eog) {
      absl::StatusOr<int64_t> id = value.AsInt();
      if (id.ok() && *id >= 0 && *id < vocab->size()) eog.push_back(static_cast<int32_t>(*id));
    }
  }
  for (std::string_view text : kEndOfGenerationTexts) {
    const int32_t id = vocab->Find(text);
    if (id < 0) continue;
    eog.push_back(id);
    if (vocab->types[id] != TokenType::kControl) vocab->types[id] = TokenType::kControl;
  }
  // OpenAI's harmony format (gpt-oss), llama.cpp's rule: <|end|> closes a message, after
  // which the model writes the next one (its reasoning's end is not the reply's), and
  // <|return|> (the final answer) and <|call|> (a tool call) end generation.
  if (const int32_t return_id = vocab->Find("<|return|>"); return_id >= 0) {
    const int32_t end_id = vocab->Find("<|end|>");
    eog.erase(std::remove(eog.begin(), eog.end(), end_id), eog.end());
    for (const int32_t id : {return_id, vocab->Find("<|call|>")}) {
      if (id < 0) continue;
      eog.push_back(id);
      vocab->types[id] = TokenType::kControl;
    }
  }
  std::sort(eog.begin(), eog.end());
  eog.erase(std::unique(eog.begin(), eog.end()), eog.end());

  // Text that is matched before tokenization: longest first.
  for (int32_t id = 0; id < vocab->size(); ++id) {
    const TokenType type = vocab->types[id];
    if (type == TokenType::kControl || type == TokenType::kUserDefined ||
        type == TokenType::kUnknown) {
      vocab->special_token_ids.push_back(id);
    }
  }
  std::stable_sort(vocab->special_token_ids.begin(), vocab->special_token_ids.end(),
                   [&](int32_t a, int32_t b) {
                     return vocab->texts[a].size() > vocab->texts[b].size();
                   });

  // llama.cpp's per-model attribute: Phi-3 swallows whitespace after its special tokens.
  vocab->strips_right_space.assign(vocab->size(), false);
  LOOM_ASSIGN_OR_RETURN(std::string model_name, OptionalString(gguf, "general.name", ""));
  std::transform(model_name.begin(), model_name.end(), model_name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (model_name.find("phi-3") != std::string::npos ||
      model_name.find("phi3") != std::string::npos) {
    for (int32_t id : vocab->special_token_ids) vocab->strips_right_space[id] = true;
    if (int32_t id = vocab->Find("</s>"); id >= 0) vocab->strips_right_space[id] = true;
    for (std::string_view text : {"<unk>", "<s>", "<|endoftext|>"}) {
      if (int32_t id = vocab->Find(text); id >= 0) vocab->strips_right_space[id] = false;
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string Tokenizer::DecodePiece(int32_t id, bool skip_special, bool /*at_start*/) const {
  if (skip_special && IsSpecial(id)) return {};
  return TokenBytes(id);
}

bool Tokenizer::DecodePieceEndsStart(int32_t id, bool skip_special) const {
  return !DecodePiece(id, skip_special, /*at_start=*/false).empty();
}

namespace {

// A Hugging Face tokenizer.json's split steps (`tokenizer.loom.split.*`, written by
// hf_tokenizer) when present, else llama.cpp's family `tokenizer.ggml.pre`; then the
// normalization form `tokenizer.loom.normalizer`.
absl::StatusOr<std::unique_ptr<PreTokenizer>> ReadPreTokenizer(const GgufFile& gguf) {
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  if (gguf.Find("tokenizer.loom.split.patterns") != nullptr) {
    LOOM_ASSIGN_OR_RETURN(const GgufValue::Array* patterns,
                          gguf.GetArray("tokenizer.loom.split.patterns"));
    LOOM_ASSIGN_OR_RETURN(const GgufValue::Array* behaviors,
                          gguf.GetArray("tokenizer.loom.split.behaviors"));
    LOOM_ASSIGN_OR_RETURN(const GgufValue::Array* inverts,
                          gguf.GetArray("tokenizer.loom.split.inverts"));
    if (behaviors->size() != patterns->size() || inverts->size() != patterns->size()) {
      return absl::InvalidArgumentError(
          "tokenizer.loom.split.{patterns,behaviors,inverts} differ in length");
    }
    std::vector<SplitRule> rules(patterns->size());
    for (size_t i = 0; i < rules.size(); ++i) {
      LOOM_ASSIGN_OR_RETURN(std::string_view pattern, (*patterns)[i].AsString());
      LOOM_ASSIGN_OR_RETURN(std::string_view behavior, (*behaviors)[i].AsString());
      LOOM_ASSIGN_OR_RETURN(int64_t invert, (*inverts)[i].AsInt());
      rules[i].pattern = std::string(pattern);
      LOOM_ASSIGN_OR_RETURN(rules[i].behavior, ParseSplitBehavior(behavior));
      rules[i].invert = invert != 0;
    }
    bool ignore_merges = false;
    if (gguf.Find("tokenizer.loom.ignore_merges") != nullptr) {
      LOOM_ASSIGN_OR_RETURN(ignore_merges, gguf.GetBool("tokenizer.loom.ignore_merges"));
    }
    LOOM_ASSIGN_OR_RETURN(pre_tokenizer, PreTokenizer::FromRules(rules, ignore_merges));
  } else {
    LOOM_ASSIGN_OR_RETURN(std::string pre, OptionalString(gguf, "tokenizer.ggml.pre", "default"));
    LOOM_ASSIGN_OR_RETURN(pre_tokenizer, PreTokenizer::ForName(pre));
  }
  LOOM_ASSIGN_OR_RETURN(std::string normalizer,
                        OptionalString(gguf, "tokenizer.loom.normalizer", ""));
  LOOM_ASSIGN_OR_RETURN(NormalizationForm form, ParseNormalizationForm(normalizer));
  pre_tokenizer->set_normalization(form);
  return pre_tokenizer;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromGguf(const GgufFile& gguf) {
  LOOM_ASSIGN_OR_RETURN(std::string_view model, gguf.GetString("tokenizer.ggml.model"));
  const bool is_spm = model == "llama";
  if (!is_spm && model != "gpt2") {
    return absl::UnimplementedError(absl::StrCat(
        "tokenizer.ggml.model '", std::string(model), "' is not supported (only 'gpt2' and 'llama')"));
  }
  Vocab vocab;
  LOOM_RETURN_IF_ERROR(ReadTokens(gguf, &vocab));

  if (is_spm) {
    LOOM_RETURN_IF_ERROR(ReadSpecialTokens(gguf, /*is_spm=*/true, false, &vocab));
    return std::unique_ptr<Tokenizer>(SpmTokenizer::Create(std::move(vocab)));
  }

  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<PreTokenizer> pre_tokenizer, ReadPreTokenizer(gguf));
  LOOM_RETURN_IF_ERROR(
      ReadSpecialTokens(gguf, /*is_spm=*/false, pre_tokenizer->adds_bos_by_default(), &vocab));
  LOOM_ASSIGN_OR_RETURN(const GgufValue::Array* merge_values,
                        gguf.GetArray("tokenizer.ggml.merges"));
  std::vector<std::string_view> merges;
  merges.reserve(merge_values->size());
  for (size_t i = 0; i < merge_values->size(); ++i) {
    absl::StatusOr<std::string_view> merge = (*merge_values)[i].AsString();
    if (!merge.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer.ggml.merges[", i, "]: ", merge.status().message()));
    }
    merges.push_back(*merge);
  }
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<BpeTokenizer> bpe,
                        BpeTokenizer::Create(std::move(vocab), merges, std::move(pre_tokenizer)));
  return std::unique_ptr<Tokenizer>(std::move(bpe));
}

}  // namespace loom::common
