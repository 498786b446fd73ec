#include "common/tokenizer/hf_tokenizer.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/tokenizer/pre_tokenizer.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace loom::common {
namespace {

using nlohmann::json;

// GGUF token types (llama.cpp's llama_token_type).
constexpr int64_t kNormal = 1;
constexpr int64_t kUnknown = 2;
constexpr int64_t kControl = 3;
constexpr int64_t kUserDefined = 4;
constexpr int64_t kUnused = 5;
constexpr int64_t kByte = 6;

constexpr int64_t kMaxTokens = int64_t{1} << 24;

// The Split regexes of the original tokenizer.json files, and llama.cpp's family names.
constexpr std::string_view kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// tokenizers' ByteLevel pre-tokenizer with use_regex (GPT-2's pattern plus `|\s+`).
constexpr std::string_view kByteLevelRegex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

absl::StatusOr<json> ParseObject(const std::string& text, const char* file) {
  json parsed = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded() || !parsed.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": not a JSON object"));
  }
  return parsed;
}

std::string TypeOf(const json& component) {
  if (!component.is_object()) return "";
  auto type = component.find("type");
  return type != component.end() && type->is_string() ? type->get<std::string>() : "";
}

// A component and, for a Sequence, its members in order.
std::vector<const json*> Flatten(const json& component, const char* list_key) {
  std::vector<const json*> out;
  if (component.is_null()) return out;
  if (TypeOf(component) == "Sequence") {
    auto members = component.find(list_key);
    if (members != component.end() && members->is_array()) {
      for (const json& member : *members) {
        for (const json* leaf : Flatten(member, list_key)) out.push_back(leaf);
      }
    }
    return out;
  }
  out.push_back(&component);
  return out;
}

bool BoolField(const json& object, const char* name, bool fallback) {
  auto it = object.find(name);
  return it != object.end() && it->is_boolean() ? it->get<bool>() : fallback;
}

// tokenizer_config.json's special token entries are a string or {"content": ...}.
std::optional<std::string> TokenText(const json& config, const char* name) {
  auto it = config.find(name);
  if (it == config.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    auto content = it->find("content");
    if (content != it->end() && content->is_string()) return content->get<std::string>();
  }
  return std::nullopt;
}

// `text` as a PCRE2 pattern matching it literally (a Split's {"String": ...} pattern).
std::string LiteralPattern(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (std::string_view("\\^$.|?*+()[]{}-/").find(c) != std::string_view::npos)
      out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

// A byte-level BPE tokenizer's pre_tokenizer as split rules: each Split (Regex or String
// pattern, behavior, invert) and Digits step in order, then ByteLevel's own regex when
// use_regex. `family` is llama.cpp's name for the common rule lists ("" for others).
struct ByteLevelSplits {
  std::vector<SplitRule> rules;
  std::string family;
};

absl::StatusOr<ByteLevelSplits> ByteLevelRules(const json& tokenizer) {
  const json& pre = tokenizer.contains("pre_tokenizer") ? tokenizer["pre_tokenizer"] : json();
  std::vector<const json*> parts = Flatten(pre, "pretokenizers");
  std::vector<std::string> types;
  for (const json* part : parts) types.push_back(TypeOf(*part));
  const std::string described = absl::StrCat("[", absl::StrJoin(types, ", "), "]");
  if (parts.empty() || types.back() != "ByteLevel") {
    return absl::UnimplementedError(absl::StrCat("tokenizer.json: byte-level pre_tokenizer ",
                                                 described,
                                                 " does not end with ByteLevel (not supported)"));
  }
  const json& byte_level = *parts.back();
  if (BoolField(byte_level, "add_prefix_space", false)) {
    return absl::UnimplementedError(
        "tokenizer.json: ByteLevel add_prefix_space true is not supported");
  }
  ByteLevelSplits out;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    const json& part = *parts[i];
    SplitRule rule;
    if (types[i] == "Digits") {
      rule.pattern = BoolField(part, "individual_digits", false) ? R"(\p{N})" : R"(\p{N}+)";
    } else if (types[i] == "Split") {
      auto pattern = part.find("pattern");
      if (pattern != part.end() && pattern->is_object() && pattern->contains("Regex") &&
          (*pattern)["Regex"].is_string()) {
        rule.pattern = (*pattern)["Regex"].get<std::string>();
      } else if (pattern != part.end() && pattern->is_object() && pattern->contains("String") &&
                 (*pattern)["String"].is_string()) {
        rule.pattern = LiteralPattern((*pattern)["String"].get<std::string>());
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("tokenizer.json: Split pre-tokenizer without a Regex or String pattern: ",
                         part.dump()));
      }
      auto behavior = ParseSplitBehavior(part.value("behavior", ""));
      if (!behavior.ok()) {
        return absl::UnimplementedError(
            absl::StrCat("tokenizer.json: Split pre-tokenizer: ", behavior.status().message()));
      }
      rule.behavior = *behavior;
      rule.invert = BoolField(part, "invert", false);
    } else {
      return absl::UnimplementedError(absl::StrCat("tokenizer.json: pre_tokenizer ", described,
                                                   ": '", types[i],
                                                   "' is not supported (only Split and Digits "
                                                   "before ByteLevel)"));
    }
    out.rules.push_back(std::move(rule));
  }
  const bool byte_level_regex = BoolField(byte_level, "use_regex", true);
  if (byte_level_regex) out.rules.push_back({std::string(kByteLevelRegex)});
  // llama.cpp's family names, for GGUF readers other than Loom.
  auto only = [&](std::string_view pattern) {
    return out.rules.size() == 1 && out.rules[0].pattern == pattern &&
           out.rules[0].behavior == SplitBehavior::kIsolated && !out.rules[0].invert;
  };
  if (byte_level_regex && parts.size() == 1) out.family = "gpt-2";
  if (byte_level_regex && parts.size() == 2 && types[0] == "Digits" &&
      BoolField(*parts[0], "individual_digits", false)) {
    out.family = "smollm";
  }
  if (!byte_level_regex && only(kLlama3Regex)) out.family = "llama-bpe";
  if (!byte_level_regex && only(kQwen2Regex)) out.family = "qwen2";
  return out;
}

}  // namespace

namespace {

// Token texts and types by id: the vocabulary, then the added tokens; unused ids padded.
struct Vocabulary {
  std::vector<std::string> texts;
  std::vector<int64_t> types;
  absl::flat_hash_map<std::string, int64_t> id_of;
};

absl::StatusOr<Vocabulary> ReadVocabulary(const json& tokenizer, const json& vocab) {
  Vocabulary out;
  std::vector<std::string>& texts = out.texts;
  std::vector<int64_t>& types = out.types;
  auto place = [&](const std::string& text, const json& id_value, int64_t type) -> absl::Status {
    if (!id_value.is_number_integer() || id_value.get<int64_t>() < 0 ||
        id_value.get<int64_t>() >= kMaxTokens) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer.json: token '", text, "' has id ", id_value.dump()));
    }
    const auto id = static_cast<size_t>(id_value.get<int64_t>());
    if (id >= texts.size()) {
      texts.resize(id + 1);
      types.resize(id + 1, kUnused);
    }
    if (types[id] != kUnused && texts[id] != text) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer.json: id ", id, " is both '", texts[id], "' and '", text, "'"));
    }
    texts[id] = text;
    types[id] = type;
    return absl::OkStatus();
  };
  for (const auto& [text, id] : vocab.items()) LOOM_RETURN_IF_ERROR(place(text, id, kNormal));
  if (auto added = tokenizer.find("added_tokens"); added != tokenizer.end() && added->is_array()) {
    for (const json& token : *added) {
      if (!token.is_object() || !token.contains("content") || !token["content"].is_string() ||
          !token.contains("id")) {
        return absl::InvalidArgumentError(
            absl::StrCat("tokenizer.json: malformed added token ", token.dump()));
      }
      LOOM_RETURN_IF_ERROR(place(token["content"].get<std::string>(), token["id"],
                                 BoolField(token, "special", false) ? kControl : kUserDefined));
    }
  }
  if (texts.empty()) return absl::InvalidArgumentError("tokenizer.json: empty vocabulary");
  for (size_t id = 0; id < texts.size(); ++id) {
    if (types[id] == kUnused && texts[id].empty()) texts[id] = absl::StrCat("[PAD", id, "]");
  }
  for (size_t id = 0; id < texts.size(); ++id) out.id_of.try_emplace(texts[id], id);

  return out;
}

// BPE merges: "a b" strings or ["a", "b"] pairs.
absl::StatusOr<std::vector<std::string>> ReadMerges(const json& list) {
  std::vector<std::string> merges;
  merges.reserve(list.size());
  for (const json& merge : list) {
    if (merge.is_string()) {
      merges.push_back(merge.get<std::string>());
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
               merge[1].is_string()) {
      merges.push_back(absl::StrCat(merge[0].get<std::string>(), " ", merge[1].get<std::string>()));
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer.json: malformed merge ", merge.dump()));
    }
  }

  return merges;
}

// Byte-level (GPT-2 style) or SentencePiece style, from the decoder, normalizers and
// pre-tokenizers; a Unicode normalization form for byte-level models.
struct TokenizerStyle {
  bool byte_level = false;
  bool space_prefix = false;
  bool spm_style = false;
  std::string normalization;
};

absl::StatusOr<TokenizerStyle> ReadStyle(const json& tokenizer, const json& model) {
  const json null_json;
  const json& decoder = tokenizer.contains("decoder") ? tokenizer["decoder"] : null_json;
  const json& normalizer = tokenizer.contains("normalizer") ? tokenizer["normalizer"] : null_json;
  const json& pre = tokenizer.contains("pre_tokenizer") ? tokenizer["pre_tokenizer"] : null_json;
  bool byte_level = false;
  for (const json* part : Flatten(decoder, "decoders")) byte_level |= TypeOf(*part) == "ByteLevel";
  bool space_prefix = false;
  bool spm_style = BoolField(model, "byte_fallback", false);
  std::string normalization;
  for (const json* part : Flatten(normalizer, "normalizers")) {
    const std::string type = TypeOf(*part);
    if (type == "Prepend" && part->value("prepend", "") == "\u2581") {
      space_prefix = spm_style = true;
    } else if (type == "Replace") {
      spm_style = true;  // " " -> "▁": SentencePiece's whitespace escape
    } else if ((type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") && byte_level) {
      // Applied (libutf8proc) to the text between special tokens before splitting. Two
      // forms in a row equal the last one only for some pairs: refuse them.
      if (!normalization.empty()) {
        return absl::UnimplementedError(absl::StrCat("tokenizer.json: normalizers ", normalization,
                                                     " then ", type,
                                                     " are not supported (one form only)"));
      }
      normalization = type;
    } else {
      return absl::UnimplementedError(
          absl::StrCat("tokenizer.json: normalizer '", type, "' is not supported"));
    }
  }
  for (const json* part : Flatten(pre, "pretokenizers")) {
    if (TypeOf(*part) == "Metaspace") {
      spm_style = true;
      space_prefix = part->value("prepend_scheme", "always") != "never" &&
                     BoolField(*part, "add_prefix_space", true);
    }
  }

  TokenizerStyle out;
  out.byte_level = byte_level;
  out.space_prefix = space_prefix;
  out.spm_style = spm_style;
  out.normalization = normalization;
  return out;
}

// A byte-level model's metadata: gpt2, its pre-tokenizer family and split rules.
absl::Status WriteByteLevel(const json& tokenizer, const json& model,
                            const std::string& normalization, GgufMetadataBuilder& metadata) {
  LOOM_ASSIGN_OR_RETURN(ByteLevelSplits splits, ByteLevelRules(tokenizer));
  // Compile the rules now: a pattern PCRE2 cannot run is refused when loading, by name.
  if (absl::StatusOr<std::unique_ptr<PreTokenizer>> compiled =
          PreTokenizer::FromRules(splits.rules, false);
      !compiled.ok()) {
    return absl::UnimplementedError(
        absl::StrCat("tokenizer.json: pre_tokenizer: ", compiled.status().message()));
  }
  metadata.String("tokenizer.ggml.model", "gpt2");
  if (!splits.family.empty()) metadata.String("tokenizer.ggml.pre", splits.family);
  std::vector<std::string> patterns, behaviors;
  std::vector<int64_t> inverts;
  for (const SplitRule& rule : splits.rules) {
    patterns.push_back(rule.pattern);
    behaviors.emplace_back(SplitBehaviorName(rule.behavior));
    inverts.push_back(rule.invert ? 1 : 0);
  }
  metadata.StringArray("tokenizer.loom.split.patterns", patterns);
  metadata.StringArray("tokenizer.loom.split.behaviors", behaviors);
  metadata.IntArray("tokenizer.loom.split.inverts", inverts);
  metadata.Bool("tokenizer.loom.ignore_merges", BoolField(model, "ignore_merges", false));
  if (!normalization.empty()) metadata.String("tokenizer.loom.normalizer", normalization);
  return absl::OkStatus();
}

// A SentencePiece-style model's metadata, scores (merge ranks) and byte/unknown types.
void WriteSentencePiece(const json& model, bool space_prefix,
                        const std::vector<std::string>& merges, Vocabulary& vocabulary,
                        std::vector<float>& scores, GgufMetadataBuilder& metadata) {
  const std::vector<std::string>& texts = vocabulary.texts;
  std::vector<int64_t>& types = vocabulary.types;
  const absl::flat_hash_map<std::string, int64_t>& id_of = vocabulary.id_of;
  metadata.String("tokenizer.ggml.model", "llama");
  metadata.Bool("tokenizer.ggml.add_space_prefix", space_prefix);
  // SentencePiece BPE merges the pair whose result scores highest: the merge rank,
  // negated, makes it pick the pair tokenizers' BPE picks.
  scores.assign(texts.size(), 0.0f);
  std::vector<bool> scored(texts.size(), false);
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const size_t space = merges[rank].find(' ');
    if (space == std::string::npos) continue;
    std::string merged = merges[rank].substr(0, space) + merges[rank].substr(space + 1);
    auto it = id_of.find(merged);
    if (it == id_of.end() || scored[it->second]) continue;
    scores[it->second] = -static_cast<float>(rank) - 1.0f;
    scored[it->second] = true;
  }
  for (size_t id = 0; id < texts.size(); ++id) {
    const std::string& text = texts[id];
    if (text.size() == 6 && text.rfind("<0x", 0) == 0 && text.back() == '>') types[id] = kByte;
  }
  if (auto unk = model.find("unk_token"); unk != model.end() && unk->is_string()) {
    if (auto it = id_of.find(unk->get<std::string>()); it != id_of.end()) {
      types[it->second] = kUnknown;
      metadata.Int("tokenizer.ggml.unknown_token_id", it->second);
    }
  }
}

// bos/eos/pad ids from tokenizer_config.json's texts, and whether to add BOS.
absl::Status WriteSpecialTokens(const json& tokenizer, const json& config,
                                const absl::flat_hash_map<std::string, int64_t>& id_of,
                                GgufMetadataBuilder& metadata) {
  const json null_json;
  // Special tokens: tokenizer_config.json names them by text.
  auto special = [&](const char* field, const char* key) -> absl::Status {
    std::optional<std::string> text = TokenText(config, field);
    if (!text) return absl::OkStatus();
    auto it = id_of.find(*text);
    if (it == id_of.end()) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer_config.json: ", field, " '", *text,
                                                     "' is not in the vocabulary"));
    }
    metadata.Int(key, it->second);
    return absl::OkStatus();
  };
  LOOM_RETURN_IF_ERROR(special("bos_token", "tokenizer.ggml.bos_token_id"));
  LOOM_RETURN_IF_ERROR(special("eos_token", "tokenizer.ggml.eos_token_id"));
  LOOM_RETURN_IF_ERROR(special("pad_token", "tokenizer.ggml.padding_token_id"));

  // BOS: tokenizer_config.json's add_bos_token, else whether the post-processor's
  // single-sequence template starts with a special token (Llama 3's TemplateProcessing).
  bool add_bos = false;
  std::optional<int64_t> template_bos;
  const json& post = tokenizer.contains("post_processor") ? tokenizer["post_processor"] : null_json;
  for (const json* part : Flatten(post, "processors")) {
    if (TypeOf(*part) != "TemplateProcessing") continue;
    auto single = part->find("single");
    if (single == part->end() || !single->is_array() || single->empty()) continue;
    const json& first = (*single)[0];
    if (first.is_object() && first.contains("SpecialToken")) {
      const std::string text = first["SpecialToken"].value("id", "");
      if (auto it = id_of.find(text); it != id_of.end()) template_bos = it->second;
    }
  }
  if (auto flag = config.find("add_bos_token"); flag != config.end() && flag->is_boolean()) {
    add_bos = flag->get<bool>();
  } else {
    add_bos = template_bos.has_value();
  }
  if (add_bos && !metadata.Has("tokenizer.ggml.bos_token_id") && template_bos) {
    metadata.Int("tokenizer.ggml.bos_token_id", *template_bos);
  }
  metadata.Bool("tokenizer.ggml.add_bos_token", add_bos);
  metadata.Bool("tokenizer.ggml.add_eos_token", BoolField(config, "add_eos_token", false));

  return absl::OkStatus();
}

absl::Status WriteChatTemplate(const json& config, const HfTokenizerFiles& files,
                               GgufMetadataBuilder& metadata) {
  // Chat template: a string, or a list of {name, template} (the "default" one is the
  // template; the others keep their names as llama.cpp's GGUF converter stores them).
  if (auto chat = config.find("chat_template"); chat != config.end() && !chat->is_null()) {
    if (chat->is_string()) {
      metadata.String("tokenizer.chat_template", chat->get<std::string>());
    } else if (chat->is_array()) {
      for (const json& entry : *chat) {
        if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() ||
            !entry.contains("template") || !entry["template"].is_string()) {
          return absl::InvalidArgumentError(
              "tokenizer_config.json: chat_template list entries need 'name' and 'template'");
        }
        const std::string name = entry["name"].get<std::string>();
        metadata.String(name == "default" ? std::string("tokenizer.chat_template")
                                          : absl::StrCat("tokenizer.chat_template.", name),
                        entry["template"].get<std::string>());
      }
    } else {
      return absl::InvalidArgumentError(
          "tokenizer_config.json: chat_template is neither a string nor a list");
    }
  } else if (!files.chat_template_jinja.empty()) {
    metadata.String("tokenizer.chat_template", files.chat_template_jinja);
  }

  return absl::OkStatus();
}

absl::Status WriteEndOfGeneration(const json& generation, size_t vocab_size,
                                  GgufMetadataBuilder& metadata) {
  // generation_config.json's EOS ids (one or a list) end generation, as vLLM applies them.
  if (auto eos = generation.find("eos_token_id"); eos != generation.end() && !eos->is_null()) {
    std::vector<int64_t> ids;
    json listed = json::array();
    if (eos->is_array()) {
      listed = *eos;
    } else {
      listed.push_back(*eos);
    }
    for (const json& id : listed) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
          id.get<int64_t>() >= static_cast<int64_t>(vocab_size)) {
        return absl::InvalidArgumentError(
            absl::StrCat("generation_config.json: eos_token_id ", id.dump(), " is not a token id"));
      }
      ids.push_back(id.get<int64_t>());
    }
    if (!metadata.Has("tokenizer.ggml.eos_token_id") && !ids.empty()) {
      metadata.Int("tokenizer.ggml.eos_token_id", ids[0]);
    }
    metadata.IntArray("tokenizer.loom.eog_token_ids", ids);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status HfTokenizerToGguf(const HfTokenizerFiles& files, GgufMetadataBuilder& metadata) {
  LOOM_ASSIGN_OR_RETURN(json tokenizer, ParseObject(files.tokenizer_json, "tokenizer.json"));
  json config = json::object();
  if (!files.tokenizer_config_json.empty()) {
    LOOM_ASSIGN_OR_RETURN(config,
                          ParseObject(files.tokenizer_config_json, "tokenizer_config.json"));
  }
  json generation = json::object();
  if (!files.generation_config_json.empty()) {
    LOOM_ASSIGN_OR_RETURN(generation,
                          ParseObject(files.generation_config_json, "generation_config.json"));
  }

  auto model_it = tokenizer.find("model");
  if (model_it == tokenizer.end() || !model_it->is_object()) {
    return absl::InvalidArgumentError("tokenizer.json: no 'model' object");
  }
  const json& model = *model_it;
  const std::string model_type = TypeOf(model);
  if (model_type != "BPE") {
    return absl::UnimplementedError(
        absl::StrCat("tokenizer.json: model type '", model_type, "' is not supported (only BPE)"));
  }
  auto vocab_it = model.find("vocab");
  auto merges_it = model.find("merges");
  if (vocab_it == model.end() || !vocab_it->is_object() || merges_it == model.end() ||
      !merges_it->is_array()) {
    return absl::InvalidArgumentError("tokenizer.json: BPE model needs 'vocab' and 'merges'");
  }

  LOOM_ASSIGN_OR_RETURN(Vocabulary vocabulary, ReadVocabulary(tokenizer, *vocab_it));
  LOOM_ASSIGN_OR_RETURN(std::vector<std::string> merges, ReadMerges(*merges_it));
  LOOM_ASSIGN_OR_RETURN(TokenizerStyle style, ReadStyle(tokenizer, model));
  std::vector<float> scores;
  if (style.byte_level) {
    LOOM_RETURN_IF_ERROR(WriteByteLevel(tokenizer, model, style.normalization, metadata));
  } else if (style.spm_style) {
    WriteSentencePiece(model, style.space_prefix, merges, vocabulary, scores, metadata);
  } else {
    return absl::UnimplementedError(
        "tokenizer.json: neither byte-level (ByteLevel decoder) nor SentencePiece-style "
        "(Prepend/Replace normalizer, Metaspace, byte_fallback) BPE");
  }
  metadata.StringArray("tokenizer.ggml.tokens", vocabulary.texts);
  metadata.IntArray("tokenizer.ggml.token_type", vocabulary.types);
  if (!scores.empty()) metadata.FloatArray("tokenizer.ggml.scores", scores);
  metadata.StringArray("tokenizer.ggml.merges", merges);
  LOOM_RETURN_IF_ERROR(WriteSpecialTokens(tokenizer, config, vocabulary.id_of, metadata));
  LOOM_RETURN_IF_ERROR(WriteChatTemplate(config, files, metadata));
  return WriteEndOfGeneration(generation, vocabulary.texts.size(), metadata);
}

}  // namespace loom::common
