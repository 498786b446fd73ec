#include "common/jinja/jinja_lexer.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/jinja/jinja_string.h"

namespace loom::common::jinja {
namespace {

// Length of the UTF-8 sequence at `pos` if it is one Python whitespace code point.
size_t SpaceLengthAt(absl::string_view s, size_t pos) {
  auto byte = static_cast<unsigned char>(s[pos]);
  size_t len = byte < 0x80 ? 1 : (byte >> 5) == 0x6 ? 2 : (byte >> 4) == 0xE ? 3 : 4;
  if (pos + len > s.size()) return 0;
  std::u32string cp = DecodeUtf8(s.substr(pos, len));
  return (cp.size() == 1 && IsPySpace(cp[0])) ? len : 0;
}

size_t SkipSpace(absl::string_view s, size_t pos) {
  while (pos < s.size()) {
    size_t len = SpaceLengthAt(s, pos);
    if (len == 0) break;
    pos += len;
  }
  return pos;
}

bool AllSpace(absl::string_view s) { return SkipSpace(s, 0) == s.size(); }

bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsNameChar(char c) { return IsNameStart(c) || IsDigit(c); }

class Lexer {
 public:
  explicit Lexer(std::string source) : src_(std::move(source)) {}

  absl::StatusOr<std::vector<Token>> Run() {
    bool line_starting = true;
    while (pos_ < src_.size()) {
      size_t tag = FindTagStart(pos_);
      if (tag == absl::string_view::npos) {
        Emit(Token::Type::kText, src_.substr(pos_), pos_);
        pos_ = src_.size();
        break;
      }
      char kind = src_[tag + 1];  // '{', '%' or '#'
      size_t after = tag + 2;
      char sign =
          (after < src_.size() && (src_[after] == '-' || src_[after] == '+')) ? src_[after] : '\0';
      if (sign != '\0') ++after;
      std::string text = src_.substr(pos_, tag - pos_);
      if (sign == '-') {
        text = PyStrip(text, nullptr, false, true);
      } else if (sign != '+' && kind != '{') {
        text = LStripBlock(text, line_starting);
      }
      Emit(Token::Type::kText, text, pos_);
      size_t raw_body = 0;
      if (kind == '%' && MatchRawBegin(after, &raw_body)) {
        auto status = LexRaw(raw_body, &line_starting);
        if (!status.ok()) return status;
        continue;
      }
      if (kind == '#') {
        auto status = LexComment(tag, after, &line_starting);
        if (!status.ok()) return status;
        continue;
      }
      auto status = LexTag(kind == '%', tag, after, &line_starting);
      if (!status.ok()) return status;
    }
    Token end{Token::Type::kEnd, "", 0, 0, 0, 0};
    SetPosition(end, src_.size());
    tokens_.push_back(std::move(end));
    return std::move(tokens_);
  }

 private:
  size_t FindTagStart(size_t from) const {
    for (size_t i = from; i + 1 < src_.size(); ++i) {
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) {
        return i;
      }
    }
    return absl::string_view::npos;
  }

  // lstrip_blocks: drop the whitespace between the line start and a block tag.
  static std::string LStripBlock(const std::string& text, bool line_starting) {
    size_t nl = text.rfind('\n');
    size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
    if (l_pos > 0 || line_starting) {
      absl::string_view tail = absl::string_view(text).substr(l_pos);
      if (!tail.empty() && AllSpace(tail)) return text.substr(0, l_pos);
    }
    return text;
  }

  // `{%[-+]? raw [-]%}`; on success `body` is where the raw text starts.
  bool MatchRawBegin(size_t after, size_t* body) const {
    size_t p = SkipSpace(src_, after);
    if (src_.compare(p, 3, "raw") != 0) return false;
    p = SkipSpace(src_, p + 3);
    if (src_.compare(p, 3, "-%}") == 0) {
      *body = SkipSpace(src_, p + 3);
      return true;
    }
    if (src_.compare(p, 2, "%}") == 0) {
      *body = p + 2;
      return true;
    }
    return false;
  }

  absl::Status LexRaw(size_t body, bool* line_starting) {
    for (size_t i = body; i + 1 < src_.size(); ++i) {
      if (src_[i] != '{' || src_[i + 1] != '%') continue;
      size_t p = i + 2;
      char sign = '\0';
      if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) sign = src_[p++];
      p = SkipSpace(src_, p);
      if (src_.compare(p, 6, "endraw") != 0) continue;
      p = SkipSpace(src_, p + 6);
      size_t end = 0;
      if (!MatchTagEnd('%', p, &end)) continue;
      std::string text = src_.substr(body, i - body);
      if (sign == '-') {
        text = PyStrip(text, nullptr, false, true);
      } else if (sign != '+') {
        text = LStripBlock(text, *line_starting);
      }
      Emit(Token::Type::kText, text, body);
      *line_starting = src_[end - 1] == '\n';
      pos_ = end;
      return absl::OkStatus();
    }
    return Error(body, "Missing end of raw directive");
  }

  // Block/comment end at `p` (`+%}`, `-%}` + whitespace, `%}` + trim_blocks newline).
  bool MatchTagEnd(char kind, size_t p, size_t* end) const {
    std::string close = std::string(1, kind) + "}";
    if (kind != '}' && src_.compare(p, 3, "+" + close) == 0) {
      *end = p + 3;
      return true;
    }
    if (src_.compare(p, 3, "-" + close) == 0) {
      *end = SkipSpace(src_, p + 3);
      return true;
    }
    if (src_.compare(p, 2, close) == 0) {
      *end = p + 2;
      if (kind != '}' && *end < src_.size() && src_[*end] == '\n') ++*end;
      return true;
    }
    return false;
  }

  absl::Status LexComment(size_t tag, size_t after, bool* line_starting) {
    for (size_t p = after; p < src_.size(); ++p) {
      size_t end = 0;
      if (MatchTagEnd('#', p, &end)) {
        *line_starting = src_[end - 1] == '\n';
        pos_ = end;
        return absl::OkStatus();
      }
    }
    return Error(tag, "Missing end of comment tag");
  }

  absl::Status LexTag(bool block, size_t tag, size_t after, bool* line_starting) {
    Emit(block ? Token::Type::kBlockBegin : Token::Type::kVarBegin, "", tag, true);
    const char kind = block ? '%' : '}';
    std::vector<char> balancing;
    size_t p = after;
    while (p < src_.size()) {
      size_t end = 0;
      if (balancing.empty() && MatchTagEnd(kind, p, &end)) {
        Emit(block ? Token::Type::kBlockEnd : Token::Type::kVarEnd, "", p, true);
        *line_starting = src_[end - 1] == '\n';
        pos_ = end;
        return absl::OkStatus();
      }
      size_t space = SpaceLengthAt(src_, p);
      if (space > 0) {
        p += space;
        continue;
      }
      char c = src_[p];
      if (IsDigit(c)) {
        auto status = LexNumber(&p);
        if (!status.ok()) return status;
        continue;
      }
      if (IsNameStart(c)) {
        size_t start = p;
        while (p < src_.size() && IsNameChar(src_[p])) ++p;
        Emit(Token::Type::kName, src_.substr(start, p - start), start, true);
        continue;
      }
      if (c == '\'' || c == '"') {
        auto status = LexString(&p);
        if (!status.ok()) return status;
        continue;
      }
      static constexpr absl::string_view kTwoCharOps[] = {"//", "**", "==", "!=", ">=", "<="};
      std::string op;
      for (absl::string_view two : kTwoCharOps) {
        if (src_.compare(p, 2, two.data(), two.size()) == 0) op = std::string(two);
      }
      if (op.empty() &&
          absl::string_view("+-/*%~[](){}><=.:|,;").find(c) != absl::string_view::npos) {
        op = std::string(1, c);
      }
      if (op.empty()) return Error(p, absl::StrCat("unexpected char '", std::string(1, c), "'"));
      if (op == "(" || op == "[" || op == "{") {
        balancing.push_back(op == "(" ? ')' : op == "[" ? ']' : '}');
      } else if (op == ")" || op == "]" || op == "}") {
        if (balancing.empty()) return Error(p, absl::StrCat("unexpected '", op, "'"));
        if (balancing.back() != op[0]) {
          return Error(p, absl::StrCat("unexpected '", op, "', expected '",
                                       std::string(1, balancing.back()), "'"));
        }
        balancing.pop_back();
      }
      Emit(Token::Type::kOperator, op, p, true);
      p += op.size();
    }
    return Error(tag, block ? "unexpected end of template: block tag '{%' is not closed"
                            : "unexpected end of template: '{{' is not closed");
  }

  size_t Digits(size_t p) const {
    // (\d+_)*\d+
    size_t q = p;
    while (q < src_.size() && (IsDigit(src_[q]) || (src_[q] == '_' && q + 1 < src_.size() &&
                                                    IsDigit(src_[q + 1]) && q > p))) {
      ++q;
    }
    return q;
  }

  absl::Status LexNumber(size_t* p) {
    size_t start = *p;
    size_t int_end = Digits(start);
    size_t q = int_end;
    bool is_float = false;
    if (q + 1 < src_.size() && src_[q] == '.' && IsDigit(src_[q + 1])) {
      q = Digits(q + 1);
      is_float = true;
    }
    if (q < src_.size() && (src_[q] == 'e' || src_[q] == 'E')) {
      size_t e = q + 1;
      if (e < src_.size() && (src_[e] == '+' || src_[e] == '-')) ++e;
      if (e < src_.size() && IsDigit(src_[e])) {
        q = Digits(e);
        is_float = true;
      }
    }
    std::string text;
    if (is_float) {
      for (size_t i = start; i < q; ++i) {
        if (src_[i] != '_') text += src_[i];
      }
      Token token{Token::Type::kFloat,
                  src_.substr(start, q - start),
                  0,
                  std::strtod(text.c_str(), nullptr),
                  0,
                  0};
      SetPosition(token, start);
      tokens_.push_back(std::move(token));
      *p = q;
      return absl::OkStatus();
    }
    int base = 10;
    size_t digits_start = start;
    if (src_[start] == '0' && start + 1 < src_.size()) {
      char prefix = static_cast<char>(src_[start + 1] | 0x20);
      if (prefix == 'x' || prefix == 'o' || prefix == 'b') {
        base = prefix == 'x' ? 16 : prefix == 'o' ? 8 : 2;
        digits_start = start + 2;
      }
    }
    if (base == 10) {
      q = Digits(start);
    } else {
      q = digits_start;
      while (q < src_.size() &&
             (std::isxdigit(static_cast<unsigned char>(src_[q])) || src_[q] == '_')) {
        ++q;
      }
    }
    for (size_t i = digits_start; i < q; ++i) {
      if (src_[i] != '_') text += src_[i];
    }
    errno = 0;
    char* end = nullptr;
    long long value = std::strtoll(text.c_str(), &end, base);
    if (text.empty() || *end != '\0' || errno == ERANGE) {
      return Error(
          start, absl::StrCat("unsupported integer literal '", src_.substr(start, q - start), "'"));
    }
    Token token{Token::Type::kInteger, src_.substr(start, q - start), value, 0, 0, 0};
    SetPosition(token, start);
    tokens_.push_back(std::move(token));
    *p = q;
    return absl::OkStatus();
  }

  absl::Status LexString(size_t* p) {
    const size_t start = *p;
    const char quote = src_[start];
    std::string value;
    size_t q = start + 1;
    while (true) {
      if (q >= src_.size()) return Error(start, "unterminated string literal");
      char c = src_[q];
      if (c == quote) break;
      if (c != '\\') {
        value += c;
        ++q;
        continue;
      }
      if (q + 1 >= src_.size()) return Error(start, "unterminated string literal");
      char e = src_[q + 1];
      q += 2;
      switch (e) {
        case '\n':
          break;
        case '\\':
          value += '\\';
          break;
        case '\'':
          value += '\'';
          break;
        case '"':
          value += '"';
          break;
        case 'a':
          value += '\a';
          break;
        case 'b':
          value += '\b';
          break;
        case 'f':
          value += '\f';
          break;
        case 'n':
          value += '\n';
          break;
        case 'r':
          value += '\r';
          break;
        case 't':
          value += '\t';
          break;
        case 'v':
          value += '\v';
          break;
        case 'x':
        case 'u':
        case 'U': {
          size_t len = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          std::string hex = src_.substr(q, len);
          bool ok = hex.size() == len;
          for (char h : hex) ok = ok && std::isxdigit(static_cast<unsigned char>(h));
          if (!ok) return Error(q - 2, absl::StrCat("truncated \\", std::string(1, e), " escape"));
          unsigned long cp = std::strtoul(hex.c_str(), nullptr, 16);
          if (cp > 0x10FFFF) return Error(q - 2, "illegal Unicode character");
          AppendUtf8(static_cast<char32_t>(cp), value);
          q += len;
          break;
        }
        case 'N':
          return Error(q - 2, "\\N{...} escapes are not supported");
        default:
          if (e >= '0' && e <= '7') {
            unsigned cp = static_cast<unsigned>(e - '0');
            for (int k = 0; k < 2 && q < src_.size() && src_[q] >= '0' && src_[q] <= '7'; ++k) {
              cp = cp * 8 + static_cast<unsigned>(src_[q++] - '0');
            }
            AppendUtf8(cp, value);
          } else {
            value += '\\';
            value += e;
          }
      }
    }
    Emit(Token::Type::kString, value, start, true);
    *p = q + 1;
    return absl::OkStatus();
  }

  void SetPosition(Token& token, size_t offset) {
    // Tokens are emitted in source order, so the line count advances incrementally.
    while (line_offset_ < offset && line_offset_ < src_.size()) {
      if (src_[line_offset_] == '\n') {
        ++line_;
        line_start_ = line_offset_ + 1;
      }
      ++line_offset_;
    }
    token.line = line_;
    token.column = static_cast<int>(offset - line_start_) + 1;
  }

  void Emit(Token::Type type, std::string value, size_t offset, bool keep_empty = false) {
    if (value.empty() && !keep_empty) return;
    Token token{type, std::move(value), 0, 0, 0, 0};
    SetPosition(token, offset);
    tokens_.push_back(std::move(token));
  }

  absl::Status Error(size_t offset, absl::string_view message) {
    Token where{Token::Type::kEnd, "", 0, 0, 0, 0};
    // Positions may go backwards for errors; recompute from the start.
    line_ = 1;
    line_start_ = 0;
    line_offset_ = 0;
    SetPosition(where, offset);
    return absl::InvalidArgumentError(
        absl::StrCat("line ", where.line, ", column ", where.column, ": ", message));
  }

  std::string src_;
  size_t pos_ = 0;
  std::vector<Token> tokens_;
  int line_ = 1;
  size_t line_start_ = 0;
  size_t line_offset_ = 0;
};

// jinja2 treats \r\n, \r and \n as line breaks, writes them as \n and drops one
// trailing newline (keep_trailing_newline=False).
std::string NormalizeNewlines(absl::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out += source[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

}  // namespace

absl::StatusOr<std::vector<Token>> Tokenize(absl::string_view source) {
  return Lexer(NormalizeNewlines(source)).Run();
}

}  // namespace loom::common::jinja
