#include "common/grammar/gbnf_parser.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/unicode.h"

namespace loom::common {
namespace {

constexpr int32_t kMaxRepeat = 10000;

bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         c == '_' || c == '-';
}

class GbnfParser {
 public:
  explicit GbnfParser(std::string_view text) : t_(text) {}

  absl::StatusOr<GrammarDefinition> Parse() {
    GrammarDefinition definition;
    SkipSpace(true);
    while (i_ < t_.size()) {
      const std::string name = Name();
      if (name.empty()) return Error("expected a rule name");
      SkipSpace(false);
      if (t_.substr(i_, 3) != "::=") return Error(absl::StrCat("expected '::=' after '", name, "'"));
      i_ += 3;
      if (definition.HasRule(name)) return Error(absl::StrCat("rule '", name, "' defined twice"));
      auto body = Alternation(/*nested=*/false);
      if (!body.ok()) return body.status();
      definition.SetRule(name, *body);
      SkipSpace(true);
    }
    if (definition.rules.empty()) return absl::InvalidArgumentError("grammar has no rules");
    return definition;
  }

 private:
  absl::Status Error(std::string_view what) const {
    const int64_t line = 1 + std::count(t_.begin(), t_.begin() + std::min(i_, t_.size()), '\n');
    return absl::InvalidArgumentError(absl::StrCat("grammar line ", line, ": ", std::string(what)));
  }

  // Skips spaces and comments; newlines too when `newlines` (inside groups and between
  // rules: a rule's body ends at a line that starts the next rule).
  void SkipSpace(bool newlines) {
    while (i_ < t_.size()) {
      const char c = t_[i_];
      if (c == '#') {
        while (i_ < t_.size() && t_[i_] != '\n') ++i_;
      } else if (c == ' ' || c == '\t' || c == '\r' || (newlines && c == '\n')) {
        ++i_;
      } else {
        break;
      }
    }
  }

  std::string Name() {
    size_t start = i_;
    while (i_ < t_.size() && IsNameChar(t_[i_])) ++i_;
    return std::string(t_.substr(start, i_ - start));
  }

  // Whether a new rule ("name ::=") starts at i_.
  bool AtRuleStart() const {
    size_t j = i_;
    while (j < t_.size() && IsNameChar(t_[j])) ++j;
    if (j == i_) return false;
    while (j < t_.size() && (t_[j] == ' ' || t_[j] == '\t')) ++j;
    return t_.substr(j, 3) == "::=";
  }

  absl::StatusOr<GrammarExprPtr> Alternation(bool nested) {
    std::vector<GrammarExprPtr> alts;
    while (true) {
      auto seq = Sequence(nested);
      if (!seq.ok()) return seq;
      alts.push_back(*seq);
      SkipSpace(true);
      if (i_ < t_.size() && t_[i_] == '|') {
        ++i_;
        continue;
      }
      return ChoiceExpr(std::move(alts));
    }
  }

  absl::StatusOr<GrammarExprPtr> Sequence(bool nested) {
    std::vector<GrammarExprPtr> parts;
    while (true) {
      const size_t before = i_;
      SkipSpace(nested);
      if (!nested && i_ < t_.size() && t_[i_] == '\n') {
        // A newline ends the body unless the next line continues it ('|' or more items
        // that are not a new rule).
        SkipSpace(true);
        if (i_ >= t_.size() || AtRuleStart() || t_[i_] == '|') break;
      }
      if (i_ >= t_.size() || t_[i_] == '|' || t_[i_] == ')') break;
      if (!nested && AtRuleStart()) {
        i_ = before;
        break;
      }
      auto atom = Atom();
      if (!atom.ok()) return atom;
      auto quantified = Quantifier(*atom);
      if (!quantified.ok()) return quantified;
      parts.push_back(*quantified);
    }
    if (parts.empty()) return EmptyExpr();
    return SequenceExpr(std::move(parts));
  }

  absl::StatusOr<uint32_t> CodePoint(bool in_class) {
    if (i_ >= t_.size()) return Error("unexpected end");
    char c = t_[i_];
    if (c == '\\') {
      ++i_;
      if (i_ >= t_.size()) return Error("trailing backslash");
      c = t_[i_++];
      auto hex = [&](int digits) -> absl::StatusOr<uint32_t> {
        if (i_ + digits > t_.size()) return Error("truncated escape");
        uint32_t v = 0;
        for (int k = 0; k < digits; ++k) {
          const char h = t_[i_++];
          v <<= 4;
          if (h >= '0' && h <= '9') v |= h - '0';
          else if (h >= 'a' && h <= 'f') v |= h - 'a' + 10;
          else if (h >= 'A' && h <= 'F') v |= h - 'A' + 10;
          else return Error("bad hex escape");
        }
        return v;
      };
      switch (c) {
        case 'n': return uint32_t{'\n'};
        case 't': return uint32_t{'\t'};
        case 'r': return uint32_t{'\r'};
        case 'x': return hex(2);
        case 'u': return hex(4);
        case 'U': return hex(8);
        case '\\': case '"': case '[': case ']': case '-': case '^': case '\'':
          return static_cast<uint32_t>(c);
        default:
          return Error(absl::StrCat("unknown escape \\", std::string(1, c)));
      }
    }
    (void)in_class;
    const unsigned char u = static_cast<unsigned char>(c);
    int len = u < 0x80 ? 1 : u < 0xE0 ? 2 : u < 0xF0 ? 3 : 4;
    if (u >= 0x80 && u < 0xC0) return Error("invalid UTF-8");
    if (i_ + len > t_.size()) return Error("truncated UTF-8");
    uint32_t cp = len == 1 ? u : len == 2 ? u & 0x1F : len == 3 ? u & 0x0F : u & 0x07;
    for (int k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(t_[i_ + k]) & 0x3F);
    i_ += len;
    return cp;
  }

  absl::StatusOr<GrammarExprPtr> Atom() {
    const char c = t_[i_];
    if (c == '"') {
      ++i_;
      std::string bytes;
      while (true) {
        if (i_ >= t_.size() || t_[i_] == '\n') return Error("unterminated string literal");
        if (t_[i_] == '"') {
          ++i_;
          break;
        }
        auto cp = CodePoint(false);
        if (!cp.ok()) return cp.status();
        AppendUtf8(*cp, bytes);
      }
      return bytes.empty() ? EmptyExpr() : LiteralExpr(std::move(bytes));
    }
    if (c == '[') {
      ++i_;
      bool negated = false;
      if (i_ < t_.size() && t_[i_] == '^') {
        negated = true;
        ++i_;
      }
      std::vector<std::pair<uint32_t, uint32_t>> ranges;
      while (true) {
        if (i_ >= t_.size()) return Error("unterminated character class");
        if (t_[i_] == ']') {
          ++i_;
          break;
        }
        auto lo = CodePoint(true);
        if (!lo.ok()) return lo.status();
        uint32_t hi = *lo;
        if (i_ + 1 < t_.size() && t_[i_] == '-' && t_[i_ + 1] != ']') {
          ++i_;
          auto h = CodePoint(true);
          if (!h.ok()) return h.status();
          hi = *h;
          if (hi < *lo) return Error("character range out of order");
        }
        ranges.emplace_back(*lo, hi);
      }
      if (ranges.empty() && !negated) return Error("empty character class");
      return CharClassExpr(std::move(ranges), negated);
    }
    if (c == '.') {
      ++i_;
      return CharClassExpr({}, /*negated=*/true);
    }
    if (c == '(') {
      ++i_;
      if (++depth_ > kMaxGrammarNesting) {
        return Error(absl::StrCat("groups nested deeper than ", kMaxGrammarNesting));
      }
      auto inner = Alternation(/*nested=*/true);
      if (!inner.ok()) return inner;
      SkipSpace(true);
      if (i_ >= t_.size() || t_[i_] != ')') return Error("missing ')'");
      ++i_;
      --depth_;
      return inner;
    }
    if (IsNameChar(c)) return RuleRefExpr(Name());
    return Error(absl::StrCat("unexpected character '", std::string(1, c), "'"));
  }

  absl::StatusOr<int32_t> Number() {
    SkipSpace(false);
    size_t start = i_;
    int64_t v = 0;
    while (i_ < t_.size() && t_[i_] >= '0' && t_[i_] <= '9') {
      v = v * 10 + (t_[i_++] - '0');
      if (v > kMaxRepeat) return Error(absl::StrCat("repetition count above ", kMaxRepeat));
    }
    if (start == i_) return Error("expected a number");
    SkipSpace(false);
    return static_cast<int32_t>(v);
  }

  // One repetition operator per item, as llama.cpp's parser takes (stacked, they nested
  // without bound).
  absl::StatusOr<GrammarExprPtr> Quantifier(GrammarExprPtr atom) {
    bool repeated = false;
    while (i_ < t_.size()) {
      const char c = t_[i_];
      if (repeated && (c == '*' || c == '+' || c == '?' || c == '{')) {
        return Error("repetition operators cannot be stacked on one item");
      }
      repeated = true;
      if (c == '*') { ++i_; atom = RepeatExpr(atom, 0, -1); }
      else if (c == '+') { ++i_; atom = RepeatExpr(atom, 1, -1); }
      else if (c == '?') { ++i_; atom = RepeatExpr(atom, 0, 1); }
      else if (c == '{') {
        ++i_;
        auto lo = Number();
        if (!lo.ok()) return lo.status();
        int32_t hi = *lo;
        if (i_ < t_.size() && t_[i_] == ',') {
          ++i_;
          SkipSpace(false);
          hi = -1;
          if (i_ < t_.size() && t_[i_] != '}') {
            auto h = Number();
            if (!h.ok()) return h.status();
            hi = *h;
          }
        }
        if (i_ >= t_.size() || t_[i_] != '}') return Error("missing '}'");
        ++i_;
        if (hi >= 0 && hi < *lo) return Error("repetition {m,n} with n < m");
        atom = RepeatExpr(atom, *lo, hi);
      } else {
        break;
      }
    }
    return atom;
  }

  std::string_view t_;
  size_t i_ = 0;
  int depth_ = 0;  // groups open at i_
};

}  // namespace

absl::StatusOr<GrammarDefinition> ParseGbnf(std::string_view text) {
  return GbnfParser(text).Parse();
}

}  // namespace loom::common
