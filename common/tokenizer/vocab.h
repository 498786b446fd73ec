#pragma once

// The vocabulary a tokenizer works over, as stored in GGUF metadata
// (`tokenizer.ggml.tokens`, `.token_type`, `.scores` and the special-token keys).

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"

namespace loom::common {

/// `tokenizer.ggml.token_type` values (llama.cpp's `llama_token_type`).
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

/// Token texts with their types and scores, the special ids and the encoding flags.
/// Built once by Tokenizer::FromGguf, then read-only (thread-safe to share).
struct Vocab {
  /// Number of tokens; `texts`, `types` and `scores` all have this size.
  int32_t size() const { return static_cast<int32_t>(texts.size()); }
  /// Id of the token whose text is exactly `text`, or -1.
  int32_t Find(std::string_view text) const {
    // Debian's Abseil has its own string_view type; heterogeneous look-up needs it.
    auto it = text_to_id.find(absl::string_view(text.data(), text.size()));
    return it == text_to_id.end() ? -1 : it->second;
  }
  bool IsValid(int32_t id) const { return id >= 0 && id < size(); }
  TokenType type(int32_t id) const { return types[id]; }

  std::vector<std::string> texts;  // [size]; unique and non-empty
  std::vector<TokenType> types;    // [size]
  std::vector<float> scores;       // [size]; SentencePiece log-probabilities, 0 if absent
  absl::flat_hash_map<std::string, int32_t> text_to_id;  // inverse of `texts`

  // Special ids, -1 when the model has none; each is a valid id otherwise.
  int32_t bos_id = -1;
  int32_t eos_id = -1;
  int32_t eot_id = -1;
  int32_t eom_id = -1;
  int32_t unknown_id = -1;
  int32_t padding_id = -1;

  bool add_bos = false;           // Encode(add_special) prepends bos_id (then bos_id >= 0)
  bool add_eos = false;           // Encode(add_special) appends eos_id (then eos_id >= 0)
  bool add_space_prefix = false;  // SentencePiece: a space is put before the text

  /// Tokens that are matched in the raw text before tokenization (CONTROL, USER_DEFINED
  /// and UNKNOWN types), longest text first.
  std::vector<int32_t> special_token_ids;
  /// Per token: whitespace to the right of it in the text is dropped when it is matched
  /// (llama.cpp's RSTRIP attribute; set for Phi-3's special tokens).
  std::vector<bool> strips_right_space;  // [size]
  /// Ids that end generation: EOS, EOT, EOM and tokens like "<|im_end|>", ascending.
  std::vector<int32_t> end_of_generation_ids;
};

}  // namespace loom::common
