#pragma once

#include <string>

#include "absl/status/status.h"
#include "common/formats/gguf_metadata_builder.h"

namespace loom::common {

/// The tokenizer files of a Hugging Face model directory (their text; empty when absent).
struct HfTokenizerFiles {
  std::string tokenizer_json;          // tokenizer.json (required)
  std::string tokenizer_config_json;   // tokenizer_config.json
  std::string generation_config_json;  // generation_config.json
  std::string chat_template_jinja;     // chat_template.jinja (newer exports keep it apart)
};

/// Translates a BPE `tokenizer.json` into the `tokenizer.ggml.*` keys Tokenizer::FromGguf
/// reads, so one tokenizer code path serves both formats:
///  * byte-level BPE (ByteLevel decoder) becomes `gpt2` with the pre-tokenizer family its
///    pre_tokenizer names (ByteLevel alone: gpt-2; Digits + ByteLevel: smollm; Split with
///    the Llama 3 or Qwen2 regex + ByteLevel: llama-bpe / qwen2);
///  * SentencePiece-style BPE (Prepend/Replace "▁" normalizer or Metaspace, byte fallback)
///    becomes `llama` with scores from the merge ranks and <0xNN> byte tokens;
///  * added tokens keep their ids (special ones are control tokens);
///  * tokenizer_config.json: chat_template (string or named list), bos/eos/unk/pad tokens,
///    add_bos_token/add_eos_token (else the post-processor's template decides);
///  * generation_config.json: its eos_token_id(s) end generation too
///    (`tokenizer.loom.eog_token_ids`).
/// Unimplemented naming the component (model type, pre-tokenizer, normalizer, regex)
/// Loom cannot reproduce; InvalidArgument for malformed files. Thread-safe.
absl::Status HfTokenizerToGguf(const HfTokenizerFiles& files, GgufMetadataBuilder& metadata);

}  // namespace loom::common
