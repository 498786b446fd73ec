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
#include "common/tokenizer/unicode_normalization.h"

namespace loom::common {

/// A byte range of a text.
struct TextSpan {
  size_t offset = 0;
  size_t length = 0;
};

/// What a Split step does with the regex's matches (tokenizer.json's
/// SplitDelimiterBehavior): keep each as its own piece (isolated), drop them (removed),
/// append each to the piece before it (merged_with_previous) or prepend it to the piece
/// after it (merged_with_next), or join runs of matches and of gaps (contiguous).
enum class SplitBehavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext, kContiguous };

/// "isolated", "removed", "merged_with_previous", "merged_with_next", "contiguous", or
/// tokenizer.json's CamelCase spellings; InvalidArgument naming anything else.
absl::StatusOr<SplitBehavior> ParseSplitBehavior(std::string_view name);

/// The snake_case name ParseSplitBehavior reads.
std::string_view SplitBehaviorName(SplitBehavior behavior);

/// One split step of a tokenizer.json pre_tokenizer: a PCRE2 pattern (see PreTokenizer on
/// `\s`), what happens to its matches, and `invert` (the gaps become the matches).
struct SplitRule {
  std::string pattern;
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
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

  /// Compiles tokenizer.json-style split steps, applied in order to every piece the
  /// previous step produced, with Hugging Face `tokenizers`' semantics (an empty match
  /// marks a boundary; empty pieces are dropped). InvalidArgument as FromPatterns.
  static absl::StatusOr<std::unique_ptr<PreTokenizer>> FromRules(
      const std::vector<SplitRule>& rules, bool ignore_merges);

  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  /// Replaces `pieces` with consecutive, non-empty spans that cover `text` exactly.
  /// Bytes that are not valid UTF-8 never match a regex and end up in gap pieces.
  /// Thread-safe.
  void Split(std::string_view text, std::vector<TextSpan>* pieces) const;

  /// Sets the Unicode normalization applied before splitting (tokenizer.json's NFC/NFD/
  /// NFKC/NFKD normalizer); not thread-safe: call before sharing.
  void set_normalization(NormalizationForm form) { normalization_ = form; }
  NormalizationForm normalization() const { return normalization_; }
  /// `text` normalized: `text` itself without a normalization, else `*storage` holding
  /// the normalized text. Thread-safe.
  std::string_view Normalize(std::string_view text, std::string* storage) const {
    if (normalization_ == NormalizationForm::kNone) return text;
    *storage = common::Normalize(text, normalization_);
    return *storage;
  }

  /// For llama-3 style families: a piece that is itself a vocabulary entry is emitted as
  /// that token without running the merges (llama.cpp's `ignore_merges`).
  bool ignore_merges() const { return ignore_merges_; }
  /// Whether the family adds BOS unless `tokenizer.ggml.add_bos_token` says otherwise.
  bool adds_bos_by_default() const { return adds_bos_by_default_; }

 private:
  struct Regex;
  PreTokenizer() = default;
  void SplitIsolated(const Regex& regex, std::string_view text, const std::vector<TextSpan>& in,
                     std::vector<TextSpan>* out) const;
  void SplitByRule(const Regex& regex, std::string_view text, const std::vector<TextSpan>& in,
                   std::vector<TextSpan>* out) const;

  std::vector<std::unique_ptr<Regex>> regexes_;  // applied in order
  bool ignore_merges_ = false;
  bool adds_bos_by_default_ = false;
  NormalizationForm normalization_ = NormalizationForm::kNone;
};

}  // namespace loom::common
