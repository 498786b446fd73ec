#include "common/tokenizer/pre_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <initializer_list>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/unicode.h"

namespace loom::common {
namespace {

// Unicode White_Space, as ranges for use inside a character class.
constexpr char kWhiteSpaceRanges[] =
    "\\x{09}-\\x{0D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";

// GPT-2's split regex. Hugging Face's ByteLevel adds a final `|\s+`, which changes
// nothing here because unmatched gaps are kept as pieces anyway.
constexpr std::string_view kGpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Contractions matched case-insensitively for ASCII only, as llama.cpp does.
#define LOOM_CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"

constexpr std::string_view kLlama3 =
    LOOM_CONTRACTIONS R"(|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

constexpr std::string_view kQwen2 =
    LOOM_CONTRACTIONS R"(|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

constexpr std::string_view kGpt4o =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+)" LOOM_CONTRACTIONS
    R"(?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*)" LOOM_CONTRACTIONS
    R"(?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

constexpr std::string_view kTekken =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*)"
    R"(|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

#undef LOOM_CONTRACTIONS

constexpr std::string_view kFalconGpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";

constexpr std::string_view kDeepseekLlmLetters =
    "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293"
    "\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c"
    "\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5"
    "\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77"
    "\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59"
    "\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc"
    "\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107"
    "\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139"
    "\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee"
    "\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e"
    "\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f"
    "\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2"
    "\U000118a0-\U000118df\U0001e900-\U0001e943]+";

struct Family {
  std::initializer_list<std::string_view> names;
  std::initializer_list<std::string_view> patterns;
  bool ignore_merges = false;
  bool adds_bos = false;
};

// llama.cpp's `llm_tokenizer_bpe` table (src/llama-vocab.cpp), with the regexes of the
// original tokenizer.json where PCRE2 can run them unchanged.
const Family kFamilies[] = {
    {{"gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de",
      "jina-v1-en", "jina-v2-code", "roberta-bpe", "mpt", "olmo", "jais", "trillion",
      "granite-docling", "exaone4", "a.x-4.0", "mellum", "modern-bert"},
     {kGpt2}},
    {{"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"},
     {kLlama3},
     /*ignore_merges=*/true,
     /*adds_bos=*/true},
    {{"dbrx", "smaug-bpe", "chatglm-bpe", "glm4"}, {kLlama3}},
    {{"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"},
     {R"(\p{N})", kGpt2}},
    {{"qwen2", "deepseek-r1-qwen", "stablelm2", "megrez", "hunyuan"}, {kQwen2}},
    {{"deepseek-llm"},
     {"[\\r\\n]", kDeepseekLlmLetters,
      "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+", R"(\s+$)",
      "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+", R"(\p{N}+)"}},
    {{"deepseek-coder"},
     {"[\\r\\n]", R"(\s?\p{L}+)", R"(\s?\p{P}+)", "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+",
      R"(\p{N})"}},
    {{"deepseek-v3", "hunyuan-dense"},
     {R"(\p{N}{1,3})", "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
      R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}},
    {{"falcon"}, {R"([\p{P}\$\+<=>\^~\|`]+)", kFalconGpt2, "[0-9][0-9][0-9]"}},
    {{"gpt-4o", "llama4"}, {kGpt4o}},
    {{"tekken"}, {kTekken}, /*ignore_merges=*/true, /*adds_bos=*/true},
    {{"poro-chat", "bloom", "gpt3-finnish"}, {" ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+"}},
    {{"viking"}, {" ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+", R"(\p{N})"}},
    {{"default", ""},
     {R"([\p{P}\$\+<=>\^~\|]+)", kFalconGpt2, R"(\p{N}+)", "[0-9][0-9][0-9]"}},
};

// Rewrites `\s` and `\S` into explicit White_Space classes (inside and outside `[...]`).
absl::StatusOr<std::string> ExpandWhiteSpaceEscapes(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 64);
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char next = pattern[i + 1];
      ++i;
      if (next == 's') {
        if (in_class) {
          out.append(kWhiteSpaceRanges);
        } else {
          absl::StrAppend(&out, "[", kWhiteSpaceRanges, "]");
        }
      } else if (next == 'S') {
        if (in_class) {
          return absl::InvalidArgumentError(
              absl::StrCat("\\S inside a character class is not supported: ", std::string(pattern)));
        }
        absl::StrAppend(&out, "[^", kWhiteSpaceRanges, "]");
      } else {
        out.push_back(c);
        out.push_back(next);
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out.push_back(c);
      // A ']' right after '[' or '[^' is a literal member of the class.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out.push_back(pattern[++i]);
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out.push_back(pattern[++i]);
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out.push_back(c);
  }
  return out;
}

}  // namespace

struct PreTokenizer::Regex {
  pcre2_code* code = nullptr;
  // Set for FromRules' steps (tokenizers' semantics); unset: llama.cpp's isolated split.
  std::optional<common::SplitRule> rule;
  ~Regex() { pcre2_code_free(code); }
};

std::string_view SplitBehaviorName(SplitBehavior behavior) {
  switch (behavior) {
    case SplitBehavior::kIsolated:
      return "isolated";
    case SplitBehavior::kRemoved:
      return "removed";
    case SplitBehavior::kMergedWithPrevious:
      return "merged_with_previous";
    case SplitBehavior::kMergedWithNext:
      return "merged_with_next";
    case SplitBehavior::kContiguous:
      return "contiguous";
  }
  return "isolated";
}

absl::StatusOr<SplitBehavior> ParseSplitBehavior(std::string_view name) {
  std::string lower;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    if (c >= 'A' && c <= 'Z') {
      if (i > 0) lower.push_back('_');
      lower.push_back(static_cast<char>(c - 'A' + 'a'));
    } else {
      lower.push_back(c);
    }
  }
  if (lower == "isolated") return SplitBehavior::kIsolated;
  if (lower == "removed") return SplitBehavior::kRemoved;
  if (lower == "merged_with_previous") return SplitBehavior::kMergedWithPrevious;
  if (lower == "merged_with_next") return SplitBehavior::kMergedWithNext;
  if (lower == "contiguous") return SplitBehavior::kContiguous;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown split behavior '", std::string(name),
      "' (known: isolated, removed, merged_with_previous, merged_with_next, contiguous)"));
}

PreTokenizer::~PreTokenizer() = default;

absl::StatusOr<std::unique_ptr<PreTokenizer>> PreTokenizer::FromPatterns(
    const std::vector<std::string>& patterns) {
  auto pre_tokenizer = std::unique_ptr<PreTokenizer>(new PreTokenizer());
  for (const std::string& pattern : patterns) {
    absl::StatusOr<std::string> expanded = ExpandWhiteSpaceEscapes(pattern);
    if (!expanded.ok()) return expanded.status();
    int error_code = 0;
    PCRE2_SIZE error_offset = 0;
    auto regex = std::make_unique<Regex>();
    regex->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(expanded->data()), expanded->size(),
                                PCRE2_UTF | PCRE2_MATCH_INVALID_UTF, &error_code, &error_offset,
                                nullptr);
    if (regex->code == nullptr) {
      std::array<PCRE2_UCHAR, 256> message{};
      pcre2_get_error_message(error_code, message.data(), message.size());
      return absl::InvalidArgumentError(
          absl::StrCat("bad pre-tokenizer regex '", pattern, "' at offset ", error_offset, ": ",
                       reinterpret_cast<const char*>(message.data())));
    }
    // JIT is an optimisation only: without it (unsupported CPU) matching still works.
    pcre2_jit_compile(regex->code, PCRE2_JIT_COMPLETE);
    pre_tokenizer->regexes_.push_back(std::move(regex));
  }
  return pre_tokenizer;
}

absl::StatusOr<std::unique_ptr<PreTokenizer>> PreTokenizer::FromRules(
    const std::vector<common::SplitRule>& rules, bool ignore_merges) {
  std::vector<std::string> patterns;
  for (const common::SplitRule& rule : rules) patterns.push_back(rule.pattern);
  absl::StatusOr<std::unique_ptr<PreTokenizer>> pre_tokenizer = FromPatterns(patterns);
  if (!pre_tokenizer.ok()) return pre_tokenizer.status();
  for (size_t i = 0; i < rules.size(); ++i) (*pre_tokenizer)->regexes_[i]->rule = rules[i];
  (*pre_tokenizer)->ignore_merges_ = ignore_merges;
  return pre_tokenizer;
}

absl::StatusOr<std::unique_ptr<PreTokenizer>> PreTokenizer::ForName(std::string_view name) {
  for (const Family& family : kFamilies) {
    if (std::find(family.names.begin(), family.names.end(), name) == family.names.end()) {
      continue;
    }
    std::vector<std::string> patterns(family.patterns.begin(), family.patterns.end());
    absl::StatusOr<std::unique_ptr<PreTokenizer>> pre_tokenizer = FromPatterns(patterns);
    if (!pre_tokenizer.ok()) return pre_tokenizer.status();
    (*pre_tokenizer)->ignore_merges_ = family.ignore_merges;
    (*pre_tokenizer)->adds_bos_by_default_ = family.adds_bos;
    return pre_tokenizer;
  }
  std::vector<std::string> known;
  for (const Family& family : kFamilies) {
    for (std::string_view known_name : family.names) {
      if (!known_name.empty()) known.emplace_back(known_name);
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown pre-tokenizer '", std::string(name),
                   "' (tokenizer.ggml.pre); known: ", absl::StrJoin(known, ", ")));
}

namespace {

// Per-call PCRE2 state: match data, plus a large JIT stack created only if a match
// runs out of the default one (deep backtracking over very long runs).
class MatchState {
 public:
  MatchState() : match_data_(pcre2_match_data_create(1, nullptr)) {}
  ~MatchState() {
    pcre2_match_data_free(match_data_);
    pcre2_match_context_free(context_);
    pcre2_jit_stack_free(jit_stack_);
  }
  MatchState(const MatchState&) = delete;
  MatchState& operator=(const MatchState&) = delete;

  // Returns true and the match [*start, *end) of `code` in `subject` at or after
  // `offset`; false when there is none.
  bool Find(const pcre2_code* code, std::string_view subject, size_t offset, size_t* start,
            size_t* end) {
    int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(subject.data()), subject.size(),
                         offset, 0, match_data_, context_);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && jit_stack_ == nullptr) {
      jit_stack_ = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, nullptr);
      context_ = pcre2_match_context_create(nullptr);
      pcre2_jit_stack_assign(context_, nullptr, jit_stack_);
      rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(subject.data()), subject.size(),
                       offset, 0, match_data_, context_);
    }
    if (rc < 0) return false;  // no match, or a resource limit: the rest stays one gap
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match_data_);
    *start = ovector[0];
    *end = ovector[1];
    return true;
  }

 private:
  pcre2_match_data* match_data_;
  pcre2_match_context* context_ = nullptr;
  pcre2_jit_stack* jit_stack_ = nullptr;
};

}  // namespace

void PreTokenizer::Split(std::string_view text, std::vector<TextSpan>* pieces) const {
  pieces->clear();
  if (text.empty()) return;
  pieces->push_back({0, text.size()});
  std::vector<TextSpan> next;
  for (const auto& regex : regexes_) {
    next.clear();
    next.reserve(pieces->size() * 2);
    if (regex->rule.has_value()) {
      SplitByRule(*regex, text, *pieces, &next);
    } else {
      SplitIsolated(*regex, text, *pieces, &next);
    }
    pieces->swap(next);
  }
}

void PreTokenizer::SplitIsolated(const Regex& regex, std::string_view text,
                                 const std::vector<TextSpan>& in,
                                 std::vector<TextSpan>* out) const {
  MatchState state;
  for (const TextSpan& piece : in) {
    // Each piece is matched on its own: anchors and lookarounds see its ends.
    const std::string_view subject = text.substr(piece.offset, piece.length);
    size_t gap_start = 0;
    size_t offset = 0;
    size_t match_start = 0, match_end = 0;
    while (offset < subject.size() &&
           state.Find(regex.code, subject, offset, &match_start, &match_end)) {
      if (match_end == match_start) {
        // Empty matches split nothing; step over one character and search on.
        offset = match_start + Utf8SequenceLength(static_cast<uint8_t>(subject[match_start]));
        continue;
      }
      if (match_start > gap_start)
        out->push_back({piece.offset + gap_start, match_start - gap_start});
      out->push_back({piece.offset + match_start, match_end - match_start});
      gap_start = offset = match_end;
    }
    if (gap_start < subject.size()) {
      out->push_back({piece.offset + gap_start, subject.size() - gap_start});
    }
  }
}

// tokenizers' `NormalizedString::split`: the piece is cut into matches and gaps (an empty
// match still cuts), `invert` swaps the two, the behavior folds them into pieces, and
// removed or empty pieces are dropped.
void PreTokenizer::SplitByRule(const Regex& regex, std::string_view text,
                               const std::vector<TextSpan>& in, std::vector<TextSpan>* out) const {
  struct Part {
    size_t start, end;
    bool is_match;
  };
  MatchState state;
  std::vector<Part> parts;
  std::vector<Part> folded;
  const common::SplitRule& rule = *regex.rule;
  for (const TextSpan& piece : in) {
    const std::string_view subject = text.substr(piece.offset, piece.length);
    parts.clear();
    size_t previous = 0, offset = 0;
    size_t match_start = 0, match_end = 0;
    while (offset <= subject.size() &&
           state.Find(regex.code, subject, offset, &match_start, &match_end)) {
      if (match_start != previous) parts.push_back({previous, match_start, false});
      parts.push_back({match_start, match_end, true});
      previous = match_end;
      if (match_end == match_start) {
        if (match_end >= subject.size()) break;
        offset = match_end + Utf8SequenceLength(static_cast<uint8_t>(subject[match_end]));
      } else {
        offset = match_end;
      }
    }
    if (previous != subject.size()) parts.push_back({previous, subject.size(), false});
    if (rule.invert) {
      for (Part& part : parts) part.is_match = !part.is_match;
    }
    // Folded parts carry "remove me" in is_match.
    folded.clear();
    bool previous_match = false;
    switch (rule.behavior) {
      case SplitBehavior::kIsolated:
        for (const Part& part : parts) folded.push_back({part.start, part.end, false});
        break;
      case SplitBehavior::kRemoved:
        folded = parts;
        break;
      case SplitBehavior::kContiguous:
        for (const Part& part : parts) {
          if (part.is_match == previous_match && !folded.empty()) {
            folded.back().end = part.end;
          } else {
            folded.push_back({part.start, part.end, false});
          }
          previous_match = part.is_match;
        }
        break;
      case SplitBehavior::kMergedWithPrevious:
        for (const Part& part : parts) {
          if (part.is_match && !previous_match && !folded.empty()) {
            folded.back().end = part.end;
          } else {
            folded.push_back({part.start, part.end, false});
          }
          previous_match = part.is_match;
        }
        break;
      case SplitBehavior::kMergedWithNext:
        for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
          if (it->is_match && !previous_match && !folded.empty()) {
            folded.back().start = it->start;
          } else {
            folded.push_back({it->start, it->end, false});
          }
          previous_match = it->is_match;
        }
        std::reverse(folded.begin(), folded.end());
        break;
    }
    for (const Part& part : folded) {
      if (part.is_match || part.end == part.start) continue;
      out->push_back({piece.offset + part.start, part.end - part.start});
    }
  }
}

}  // namespace loom::common
