#include "common/grammar/regex_grammar.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/unicode.h"

namespace loom::common {
namespace {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;
constexpr int32_t kMaxRepeat = 1000;

const Ranges kDigit = {{'0', '9'}};
const Ranges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const Ranges kSpace = {{'\t', '\r'}, {' ', ' '}};

Ranges Complement(const Ranges& in) {
  Ranges sorted = in;
  std::sort(sorted.begin(), sorted.end());
  Ranges out;
  uint32_t next = 0;
  for (const auto& r : sorted) {
    if (r.first > next) out.emplace_back(next, r.first - 1);
    next = std::max(next, r.second + 1);
  }
  if (next <= 0x10FFFF) out.emplace_back(next, 0x10FFFF);
  return out;
}

// Removes the characters a JSON string cannot hold raw.
Ranges JsonSafe(const Ranges& in) {
  Ranges out;
  for (auto r : in) {
    if (r.first < 0x20) r.first = 0x20;
    if (r.first > r.second) continue;
    for (uint32_t bad : {uint32_t{'"'}, uint32_t{'\\'}}) {
      if (r.first <= bad && bad <= r.second) {
        if (r.first < bad) out.emplace_back(r.first, bad - 1);
        r.first = bad + 1;
      }
    }
    if (r.first <= r.second) out.push_back(r);
  }
  return out;
}

class RegexParser {
 public:
  RegexParser(std::string_view pattern, const RegexOptions& options)
      : p_(pattern), options_(options) {}

  absl::StatusOr<GrammarExprPtr> Parse() {
    bool anchored_start = false, anchored_end = false;
    if (!p_.empty() && p_[0] == '^') {
      anchored_start = true;
      ++i_;
    }
    auto body = ParseAlternation();
    if (!body.ok()) return body;
    if (i_ < p_.size() && p_[i_] == '$' && i_ + 1 == p_.size()) {
      anchored_end = true;
      ++i_;
    }
    if (i_ != p_.size()) return Error(p_[i_] == ')' ? "unbalanced ')'" : "unexpected character");
    if (!options_.search) return body;
    std::vector<GrammarExprPtr> parts;
    if (!anchored_start) parts.push_back(RepeatExpr(AnyChar(), 0, -1));
    parts.push_back(*body);
    if (!anchored_end) parts.push_back(RepeatExpr(AnyChar(), 0, -1));
    return SequenceExpr(std::move(parts));
  }

 private:
  absl::Status Error(std::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("regex '", std::string(p_), "': ", std::string(what), " at offset ", i_));
  }

  GrammarExprPtr Class(Ranges ranges) const {
    if (options_.json_string) ranges = JsonSafe(ranges);
    return CharClassExpr(std::move(ranges));
  }
  GrammarExprPtr AnyChar() const { return Class(Complement({{'\n', '\n'}})); }

  GrammarExprPtr Char(uint32_t cp) const {
    std::string bytes;
    if (options_.json_string && (cp < 0x20 || cp == '"' || cp == '\\')) {
      switch (cp) {
        case '"': bytes = "\\\""; break;
        case '\\': bytes = "\\\\"; break;
        case '\n': bytes = "\\n"; break;
        case '\t': bytes = "\\t"; break;
        case '\r': bytes = "\\r"; break;
        default: {
          static const char* kHex = "0123456789abcdef";
          bytes = absl::StrCat("\\u00", std::string(1, kHex[cp >> 4]), std::string(1, kHex[cp & 15]));
        }
      }
      return LiteralExpr(std::move(bytes));
    }
    AppendUtf8(cp, bytes);
    return LiteralExpr(std::move(bytes));
  }

  // One UTF-8 code point from the pattern.
  absl::StatusOr<uint32_t> NextCodePoint() {
    const unsigned char c = static_cast<unsigned char>(p_[i_]);
    int len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (c >= 0x80 && c < 0xC0) return Error("invalid UTF-8");
    if (i_ + len > p_.size()) return Error("truncated UTF-8");
    uint32_t cp = len == 1 ? c : len == 2 ? c & 0x1F : len == 3 ? c & 0x0F : c & 0x07;
    for (int k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(p_[i_ + k]) & 0x3F);
    i_ += len;
    return cp;
  }

  absl::StatusOr<uint32_t> Hex(int digits) {
    if (i_ + digits > p_.size()) return Error("truncated hex escape");
    uint32_t v = 0;
    for (int k = 0; k < digits; ++k) {
      const char c = p_[i_++];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= c - '0';
      else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
      else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
      else return Error("bad hex escape");
    }
    return v;
  }

  // After a backslash: the ranges it stands for (a class escape or one character).
  absl::StatusOr<Ranges> Escape() {
    if (i_ >= p_.size()) return Error("trailing backslash");
    const char c = p_[i_++];
    switch (c) {
      case 'd': return kDigit;
      case 'D': return Complement(kDigit);
      case 'w': return kWord;
      case 'W': return Complement(kWord);
      case 's': return kSpace;
      case 'S': return Complement(kSpace);
      case 'n': return Ranges{{'\n', '\n'}};
      case 't': return Ranges{{'\t', '\t'}};
      case 'r': return Ranges{{'\r', '\r'}};
      case 'f': return Ranges{{'\f', '\f'}};
      case 'v': return Ranges{{'\v', '\v'}};
      case '0': return Ranges{{0, 0}};
      case 'x': {
        auto v = Hex(2);
        if (!v.ok()) return v.status();
        return Ranges{{*v, *v}};
      }
      case 'u': {
        auto v = Hex(4);
        if (!v.ok()) return v.status();
        return Ranges{{*v, *v}};
      }
      case 'b': case 'B': case 'A': case 'Z': case 'z': case 'G':
        --i_;
        return Error(absl::StrCat("unsupported anchor \\", std::string(1, c)));
      case 'p': case 'P':
        --i_;
        return Error("unsupported Unicode property class");
      default:
        if (c >= '1' && c <= '9') {
          --i_;
          return Error("unsupported backreference");
        }
        if (static_cast<unsigned char>(c) >= 0x80) {
          --i_;
          auto cp = NextCodePoint();
          if (!cp.ok()) return cp.status();
          return Ranges{{*cp, *cp}};
        }
        return Ranges{{static_cast<uint32_t>(c), static_cast<uint32_t>(c)}};
    }
  }

  absl::StatusOr<GrammarExprPtr> ParseAlternation() {
    std::vector<GrammarExprPtr> alts;
    while (true) {
      auto seq = ParseSequence();
      if (!seq.ok()) return seq;
      alts.push_back(*seq);
      if (i_ < p_.size() && p_[i_] == '|') {
        ++i_;
        continue;
      }
      return ChoiceExpr(std::move(alts));
    }
  }

  absl::StatusOr<GrammarExprPtr> ParseSequence() {
    std::vector<GrammarExprPtr> parts;
    while (i_ < p_.size() && p_[i_] != '|' && p_[i_] != ')') {
      if (p_[i_] == '$' && i_ + 1 == p_.size()) break;
      auto atom = ParseAtom();
      if (!atom.ok()) return atom;
      auto quantified = ParseQuantifier(*atom);
      if (!quantified.ok()) return quantified;
      parts.push_back(*quantified);
    }
    if (parts.empty()) return EmptyExpr();
    return SequenceExpr(std::move(parts));
  }

  absl::StatusOr<GrammarExprPtr> ParseAtom() {
    const char c = p_[i_];
    switch (c) {
      case '(': {
        ++i_;
        if (++depth_ > kMaxGrammarNesting) {
          return Error(absl::StrCat("groups nested deeper than ", kMaxGrammarNesting));
        }
        if (i_ < p_.size() && p_[i_] == '?') {
          if (p_.substr(i_, 2) == "?:") {
            i_ += 2;
          } else if (p_.substr(i_, 2) == "?P" && p_.substr(i_, 3) == "?P<") {
            i_ = p_.find('>', i_);
            if (i_ == std::string_view::npos) return Error("unterminated group name");
            ++i_;
          } else if (p_.substr(i_, 2) == "?<" && i_ + 2 < p_.size() && p_[i_ + 2] != '=' &&
                     p_[i_ + 2] != '!') {
            i_ = p_.find('>', i_);
            if (i_ == std::string_view::npos) return Error("unterminated group name");
            ++i_;
          } else {
            return Error("unsupported group (lookaround or flags)");
          }
        }
        auto inner = ParseAlternation();
        if (!inner.ok()) return inner;
        if (i_ >= p_.size() || p_[i_] != ')') return Error("missing ')'");
        ++i_;
        --depth_;
        return inner;
      }
      case '[':
        return ParseClass();
      case '.':
        ++i_;
        return AnyChar();
      case '\\': {
        ++i_;
        auto ranges = Escape();
        if (!ranges.ok()) return ranges.status();
        if (ranges->size() == 1 && (*ranges)[0].first == (*ranges)[0].second) {
          return Char((*ranges)[0].first);
        }
        return Class(*ranges);
      }
      case '^':
        return Error("unsupported '^' inside the pattern");
      case '$':
        return Error("unsupported '$' inside the pattern");
      case '*': case '+': case '?': case '{':
        return Error("quantifier without an expression");
      default: {
        auto cp = NextCodePoint();
        if (!cp.ok()) return cp.status();
        return Char(*cp);
      }
    }
  }

  absl::StatusOr<GrammarExprPtr> ParseClass() {
    ++i_;  // '['
    bool negated = false;
    if (i_ < p_.size() && p_[i_] == '^') {
      negated = true;
      ++i_;
    }
    Ranges ranges;
    bool first = true;
    while (true) {
      if (i_ >= p_.size()) return Error("missing ']'");
      if (p_[i_] == ']' && !first) {
        ++i_;
        break;
      }
      first = false;
      Ranges item;
      if (p_[i_] == '\\') {
        ++i_;
        auto r = Escape();
        if (!r.ok()) return r.status();
        item = *r;
      } else if (p_[i_] == '[' && i_ + 1 < p_.size() && p_[i_ + 1] == ':') {
        return Error("unsupported POSIX class");
      } else {
        auto cp = NextCodePoint();
        if (!cp.ok()) return cp.status();
        item = {{*cp, *cp}};
      }
      if (item.size() == 1 && item[0].first == item[0].second && i_ + 1 < p_.size() &&
          p_[i_] == '-' && p_[i_ + 1] != ']') {
        ++i_;
        uint32_t hi;
        if (p_[i_] == '\\') {
          ++i_;
          auto r = Escape();
          if (!r.ok()) return r.status();
          if (r->size() != 1 || (*r)[0].first != (*r)[0].second) return Error("bad class range");
          hi = (*r)[0].first;
        } else {
          auto cp = NextCodePoint();
          if (!cp.ok()) return cp.status();
          hi = *cp;
        }
        if (hi < item[0].first) return Error("class range out of order");
        item[0].second = hi;
      }
      ranges.insert(ranges.end(), item.begin(), item.end());
    }
    if (negated) ranges = Complement(ranges);
    return Class(std::move(ranges));
  }

  absl::StatusOr<int32_t> Number() {
    size_t start = i_;
    int64_t v = 0;
    while (i_ < p_.size() && p_[i_] >= '0' && p_[i_] <= '9') {
      v = v * 10 + (p_[i_++] - '0');
      if (v > kMaxRepeat) return Error(absl::StrCat("repetition count above ", kMaxRepeat));
    }
    if (i_ == start) return Error("expected a number");
    return static_cast<int32_t>(v);
  }

  // One repetition per atom (with its lazy / possessive suffix): a second is "multiple
  // repeat", as Python's re and JavaScript refuse it (stacked, they nested without bound).
  absl::StatusOr<GrammarExprPtr> ParseQuantifier(GrammarExprPtr atom) {
    bool repeated = false;
    while (i_ < p_.size()) {
      int32_t lo, hi;
      const char c = p_[i_];
      if (c == '*') { lo = 0; hi = -1; ++i_; }
      else if (c == '+') { lo = 1; hi = -1; ++i_; }
      else if (c == '?') { lo = 0; hi = 1; ++i_; }
      else if (c == '{') {
        ++i_;
        auto a = Number();
        if (!a.ok()) return a.status();
        lo = hi = *a;
        if (i_ < p_.size() && p_[i_] == ',') {
          ++i_;
          hi = -1;
          if (i_ < p_.size() && p_[i_] != '}') {
            auto b = Number();
            if (!b.ok()) return b.status();
            hi = *b;
          }
        }
        if (i_ >= p_.size() || p_[i_] != '}') return Error("missing '}'");
        ++i_;
        if (hi >= 0 && hi < lo) return Error("repetition {m,n} with n < m");
      } else {
        break;
      }
      if (repeated) return Error("multiple repeat");
      repeated = true;
      if (i_ < p_.size() && (p_[i_] == '?' || p_[i_] == '+')) ++i_;  // lazy/possessive
      atom = RepeatExpr(atom, lo, hi);
    }
    return atom;
  }

  std::string_view p_;
  RegexOptions options_;
  size_t i_ = 0;
  int depth_ = 0;  // groups open at i_
};

}  // namespace

absl::StatusOr<GrammarExprPtr> RegexToExpr(std::string_view pattern, const RegexOptions& options) {
  return RegexParser(pattern, options).Parse();
}

absl::StatusOr<GrammarDefinition> RegexGrammar(std::string_view pattern) {
  auto expr = RegexToExpr(pattern);
  if (!expr.ok()) return expr.status();
  GrammarDefinition definition;
  definition.SetRule("root", *expr);
  return definition;
}

}  // namespace loom::common
