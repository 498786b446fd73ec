#pragma once

// Regex pre-tokenization for byte-level BPE: the text is cut into pieces ("words") and
// BPE merges never cross a piece boundary. Each `tokenizer.ggml.pre` family has a list
// of regexes, applied in order as llama.cpp and Hugging Face `tokenizers` do: every regex
// splits each piece the previous one produced into its matches and the unmatched gaps
// between them (both are kept).

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace loom::common {

/// A byte range of a text.
struct TextSpan {
  size_t offset = 0;
  size_t length = 0;
};

/// A compiled list of PCRE2 (UTF mode, JIT) regexes. In the patterns `\s` and `\S`
/// mean Unicode White_Space and its complement (what llama.cpp and Oniguruma use; PCRE2's
/// own `\s` differs for U+0085 and U+180E). Immutable after creation; thread-safe.
class PreTokenizer {
 public:
  /// The regexes llama.cpp uses for `tokenizer.ggml.pre` = `name` ("gpt-2", "llama-bpe",
  /// "smollm", "qwen2", "deepseek-coder", ...). "default" and "" give llama.cpp's default
  /// list. InvalidArgument naming `name` for families this build does not know.
  static absl::StatusOr<std::unique_ptr<PreTokenizer>> ForName(std::string_view name);

  /// Compiles `patterns`; InvalidArgument with PCRE2's message for a bad pattern.
  static absl::StatusOr<std::unique_ptr<PreTokenizer>> FromPatterns(
      const std::vector<std::string>& patterns);

  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  /// Replaces `pieces` with consecutive, non-empty spans that cover `text` exactly.
  /// Bytes that are not valid UTF-8 never match a regex and end up in gap pieces.
  /// Thread-safe.
  void Split(std::string_view text, std::vector<TextSpan>* pieces) const;

  /// For llama-3 style families: a piece that is itself a vocabulary entry is emitted as
  /// that token without running the merges (llama.cpp's `ignore_merges`).
  bool ignore_merges() const { return ignore_merges_; }
  /// Whether the family adds BOS unless `tokenizer.ggml.add_bos_token` says otherwise.
  bool adds_bos_by_default() const { return adds_bos_by_default_; }

 private:
  struct Regex;
  PreTokenizer() = default;

  std::vector<std::unique_ptr<Regex>> regexes_;  // applied in order
  bool ignore_merges_ = false;
  bool adds_bos_by_default_ = false;
};

}  // namespace loom::common
