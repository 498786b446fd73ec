#include "common/jinja/jinja_string.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace loom::common::jinja {
namespace {

constexpr char32_t kEscapeBase = 0xDC00;  // surrogateescape: byte b -> U+DC00 + b

// Simple (one-to-one) case pairs; multi-character mappings are handled by the callers.
char32_t ToUpperChar(char32_t c) {
  if (c >= 'a' && c <= 'z') return c - 32;
  if (c < 0x80) return c;
  if (c == 0xB5) return 0x39C;
  if ((c >= 0xE0 && c <= 0xFE && c != 0xF7)) return c - 0x20;
  if (c == 0xFF) return 0x178;
  if ((c >= 0x100 && c <= 0x12F) || (c >= 0x132 && c <= 0x137) || (c >= 0x14A && c <= 0x177)) {
    return (c % 2 == 1) ? c - 1 : c;
  }
  if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) return (c % 2 == 0) ? c - 1 : c;
  if (c == 0x131) return 'I';
  if (c == 0x17F) return 'S';
  if ((c >= 0x3B1 && c <= 0x3C1) || (c >= 0x3C3 && c <= 0x3C9)) return c - 0x20;
  if (c == 0x3C2) return 0x3A3;
  if (c == 0x3AC) return 0x386;
  if (c >= 0x3AD && c <= 0x3AF) return c - 0x25;
  if (c == 0x3CC) return 0x38C;
  if (c == 0x3CD || c == 0x3CE) return c - 0x3F;
  if (c >= 0x430 && c <= 0x44F) return c - 0x20;
  if (c >= 0x450 && c <= 0x45F) return c - 0x50;
  if ((c >= 0x460 && c <= 0x481) || (c >= 0x48A && c <= 0x4BF)) return (c % 2 == 1) ? c - 1 : c;
  return c;
}

char32_t ToLowerChar(char32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if (c < 0x80) return c;
  if (c >= 0xC0 && c <= 0xDE && c != 0xD7) return c + 0x20;
  if (c == 0x178) return 0xFF;
  if ((c >= 0x100 && c <= 0x12F) || (c >= 0x132 && c <= 0x137) || (c >= 0x14A && c <= 0x177)) {
    return (c % 2 == 0) ? c + 1 : c;
  }
  if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) return (c % 2 == 1) ? c + 1 : c;
  if ((c >= 0x391 && c <= 0x3A1) || (c >= 0x3A3 && c <= 0x3A9)) return c + 0x20;
  if (c == 0x386) return 0x3AC;
  if (c >= 0x388 && c <= 0x38A) return c + 0x25;
  if (c == 0x38C) return 0x3CC;
  if (c == 0x38E || c == 0x38F) return c + 0x3F;
  if (c >= 0x410 && c <= 0x42F) return c + 0x20;
  if (c >= 0x400 && c <= 0x40F) return c + 0x50;
  if ((c >= 0x460 && c <= 0x481) || (c >= 0x48A && c <= 0x4BF)) return (c % 2 == 0) ? c + 1 : c;
  return c;
}

bool IsCased(char32_t c) {
  return ToUpperChar(c) != c || ToLowerChar(c) != c || c == 0xDF || c == 0x130 || c == 0x149 ||
         c == 0x3C2;
}

void AppendUpper(char32_t c, std::u32string& out) {
  if (c == 0xDF) {
    out += U"SS";
  } else if (c == 0x149) {
    out += U"\u02BCN";
  } else {
    out += ToUpperChar(c);
  }
}

void AppendLower(const std::u32string& text, size_t i, std::u32string& out) {
  char32_t c = text[i];
  if (c == 0x130) {
    out += U"i\u0307";
    return;
  }
  if (c == 0x3A3) {
    // Final sigma: preceded by a cased letter and not followed by one.
    bool before = false;
    for (size_t j = i; j > 0; --j) {
      if (IsCased(text[j - 1])) {
        before = true;
        break;
      }
      if (text[j - 1] != 0x27 && text[j - 1] != 0xAD) break;
    }
    bool after = false;
    for (size_t j = i + 1; j < text.size(); ++j) {
      if (IsCased(text[j])) {
        after = true;
        break;
      }
      if (text[j] != 0x27 && text[j] != 0xAD) break;
    }
    out += (before && !after) ? char32_t{0x3C2} : char32_t{0x3C3};
    return;
  }
  out += ToLowerChar(c);
}

bool IsPrintable(char32_t c) {
  if (c < 0x20 || c == 0x7F) return false;
  if (c < 0x7F) return true;
  if (c <= 0xA0 || c == 0xAD) return false;
  if (c == 0x1680 || (c >= 0x2000 && c <= 0x200F) || (c >= 0x2028 && c <= 0x202F)) return false;
  if ((c >= 0x205F && c <= 0x206F) || c == 0x3000 || c == 0xFEFF) return false;
  if ((c >= 0xD800 && c <= 0xF8FF) || (c >= 0xFFF9 && c <= 0xFFFB) || c == 0xFFFE || c == 0xFFFF) {
    return false;
  }
  if (c >= 0xF0000) return false;
  return true;
}

std::u32string Decode(absl::string_view text) { return DecodeUtf8(text); }

bool InChars(char32_t c, const std::u32string* chars) {
  if (chars == nullptr) return IsPySpace(c);
  return chars->find(c) != std::u32string::npos;
}

}  // namespace

std::u32string DecodeUtf8(absl::string_view text) {
  std::u32string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    auto byte = static_cast<unsigned char>(text[i]);
    int extra = 0;
    char32_t cp = 0;
    if (byte < 0x80) {
      out += byte;
      ++i;
      continue;
    } else if ((byte & 0xE0) == 0xC0 && byte >= 0xC2) {
      extra = 1;
      cp = byte & 0x1F;
    } else if ((byte & 0xF0) == 0xE0) {
      extra = 2;
      cp = byte & 0x0F;
    } else if ((byte & 0xF8) == 0xF0 && byte <= 0xF4) {
      extra = 3;
      cp = byte & 0x07;
    } else {
      out += kEscapeBase + byte;
      ++i;
      continue;
    }
    bool valid = i + static_cast<size_t>(extra) < text.size();
    for (int k = 1; valid && k <= extra; ++k) {
      auto next = static_cast<unsigned char>(text[i + k]);
      if ((next & 0xC0) != 0x80) {
        valid = false;
      } else {
        cp = (cp << 6) | (next & 0x3F);
      }
    }
    if (valid && ((extra == 2 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
                  (extra == 3 && (cp < 0x10000 || cp > 0x10FFFF)))) {
      valid = false;
    }
    if (!valid) {
      out += kEscapeBase + byte;
      ++i;
      continue;
    }
    out += cp;
    i += extra + 1;
  }
  return out;
}

void AppendUtf8(char32_t c, std::string& out) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c >= kEscapeBase + 0x80 && c <= kEscapeBase + 0xFF) {
    out += static_cast<char>(c - kEscapeBase);
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

std::string EncodeUtf8(std::u32string_view code_points) {
  std::string out;
  out.reserve(code_points.size());
  for (char32_t c : code_points) AppendUtf8(c, out);
  return out;
}

int64_t CodePointLength(absl::string_view text) {
  return static_cast<int64_t>(DecodeUtf8(text).size());
}

bool IsPySpace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

std::string PyStrip(absl::string_view text, const std::string* chars, bool left, bool right) {
  std::u32string cps = Decode(text);
  std::u32string char_set;
  if (chars != nullptr) char_set = Decode(*chars);
  const std::u32string* set = chars != nullptr ? &char_set : nullptr;
  size_t begin = 0;
  size_t end = cps.size();
  if (left) {
    while (begin < end && InChars(cps[begin], set)) ++begin;
  }
  if (right) {
    while (end > begin && InChars(cps[end - 1], set)) --end;
  }
  return EncodeUtf8(std::u32string_view(cps).substr(begin, end - begin));
}

std::string PyUpper(absl::string_view text) {
  std::u32string out;
  for (char32_t c : Decode(text)) AppendUpper(c, out);
  return EncodeUtf8(out);
}

std::string PyLower(absl::string_view text) {
  std::u32string cps = Decode(text);
  std::u32string out;
  for (size_t i = 0; i < cps.size(); ++i) AppendLower(cps, i, out);
  return EncodeUtf8(out);
}

std::string PyTitle(absl::string_view text) {
  std::u32string cps = Decode(text);
  std::u32string out;
  bool previous_cased = false;
  for (size_t i = 0; i < cps.size(); ++i) {
    if (previous_cased) {
      AppendLower(cps, i, out);
    } else {
      char32_t c = cps[i];
      // Title case of the ligature-free letters we map equals upper case, except ß.
      if (c == 0xDF) {
        out += U"Ss";
      } else {
        AppendUpper(c, out);
      }
    }
    previous_cased = IsCased(cps[i]);
  }
  return EncodeUtf8(out);
}

std::string PyCapitalize(absl::string_view text) {
  std::u32string cps = Decode(text);
  std::u32string out;
  for (size_t i = 0; i < cps.size(); ++i) {
    if (i == 0) {
      if (cps[0] == 0xDF) {
        out += U"Ss";
      } else {
        AppendUpper(cps[0], out);
      }
    } else {
      AppendLower(cps, i, out);
    }
  }
  return EncodeUtf8(out);
}

std::vector<std::string> PySplitLines(absl::string_view text) {
  std::u32string cps = Decode(text);
  std::vector<std::string> lines;
  size_t start = 0;
  size_t i = 0;
  while (i < cps.size()) {
    char32_t c = cps[i];
    bool is_break = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D ||
                    c == 0x1E || c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!is_break) {
      ++i;
      continue;
    }
    lines.push_back(EncodeUtf8(std::u32string_view(cps).substr(start, i - start)));
    if (c == '\r' && i + 1 < cps.size() && cps[i + 1] == '\n') ++i;
    ++i;
    start = i;
  }
  if (start < cps.size()) lines.push_back(EncodeUtf8(std::u32string_view(cps).substr(start)));
  return lines;
}

std::vector<std::string> PySplit(absl::string_view text, const std::string* sep, int64_t maxsplit) {
  std::vector<std::string> parts;
  if (sep != nullptr) {
    size_t start = 0;
    while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
      size_t found = text.find(*sep, start);
      if (found == absl::string_view::npos) break;
      parts.emplace_back(text.substr(start, found - start));
      start = found + sep->size();
    }
    parts.emplace_back(text.substr(start));
    return parts;
  }
  std::u32string cps = Decode(text);
  size_t i = 0;
  while (true) {
    while (i < cps.size() && IsPySpace(cps[i])) ++i;
    if (i >= cps.size()) break;
    if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
      size_t end = cps.size();
      while (end > i && IsPySpace(cps[end - 1])) --end;
      parts.push_back(EncodeUtf8(std::u32string_view(cps).substr(i, end - i)));
      break;
    }
    size_t start = i;
    while (i < cps.size() && !IsPySpace(cps[i])) ++i;
    parts.push_back(EncodeUtf8(std::u32string_view(cps).substr(start, i - start)));
  }
  return parts;
}

std::vector<std::string> PyRSplit(absl::string_view text, const std::string* sep,
                                  int64_t maxsplit) {
  if (maxsplit < 0) return PySplit(text, sep, maxsplit);
  std::vector<std::string> parts;
  if (sep != nullptr) {
    size_t end = text.size();
    while (static_cast<int64_t>(parts.size()) < maxsplit) {
      if (end < sep->size()) break;
      size_t found = text.rfind(*sep, end - sep->size());
      if (found == absl::string_view::npos) break;
      parts.emplace_back(text.substr(found + sep->size(), end - found - sep->size()));
      end = found;
    }
    parts.emplace_back(text.substr(0, end));
  } else {
    std::u32string cps = Decode(text);
    size_t i = cps.size();
    while (true) {
      while (i > 0 && IsPySpace(cps[i - 1])) --i;
      if (i == 0) break;
      if (static_cast<int64_t>(parts.size()) == maxsplit) {
        size_t begin = 0;
        while (begin < i && IsPySpace(cps[begin])) ++begin;
        parts.push_back(EncodeUtf8(std::u32string_view(cps).substr(begin, i - begin)));
        break;
      }
      size_t end = i;
      while (i > 0 && !IsPySpace(cps[i - 1])) --i;
      parts.push_back(EncodeUtf8(std::u32string_view(cps).substr(i, end - i)));
    }
  }
  return {parts.rbegin(), parts.rend()};
}

std::string PyReplace(absl::string_view text, absl::string_view old_text,
                      absl::string_view new_text, int64_t count) {
  std::string out;
  if (old_text.empty()) {
    // Python inserts `new` before every code point and at the end.
    std::u32string cps = Decode(text);
    int64_t done = 0;
    for (char32_t c : cps) {
      if (count < 0 || done < count) {
        out.append(new_text.data(), new_text.size());
        ++done;
      }
      AppendUtf8(c, out);
    }
    if (count < 0 || done < count) out.append(new_text.data(), new_text.size());
    return out;
  }
  size_t start = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t found = text.find(old_text, start);
    if (found == absl::string_view::npos) break;
    out.append(text.substr(start, found - start).data(), found - start);
    out.append(new_text.data(), new_text.size());
    start = found + old_text.size();
    ++done;
  }
  out.append(text.data() + start, text.size() - start);
  return out;
}

std::string PyRepr(absl::string_view text) {
  std::u32string cps = Decode(text);
  bool has_single = cps.find(U'\'') != std::u32string::npos;
  bool has_double = cps.find(U'"') != std::u32string::npos;
  char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  char buf[16];
  for (char32_t c : cps) {
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (IsPrintable(c)) {
      AppendUtf8(c, out);
    } else if (c < 0x100) {
      std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned>(c));
      out += buf;
    } else if (c < 0x10000) {
      std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
      out += buf;
    } else {
      std::snprintf(buf, sizeof(buf), "\\U%08x", static_cast<unsigned>(c));
      out += buf;
    }
  }
  out += quote;
  return out;
}

void AppendJsonString(absl::string_view text, bool ensure_ascii, std::string& out) {
  out += '"';
  char buf[16];
  auto append_escape = [&](char32_t c) {
    std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
    out += buf;
  };
  for (char32_t c : Decode(text)) {
    switch (c) {
      case '"':
        out += "\\\"";
        continue;
      case '\\':
        out += "\\\\";
        continue;
      case '\n':
        out += "\\n";
        continue;
      case '\r':
        out += "\\r";
        continue;
      case '\t':
        out += "\\t";
        continue;
      case '\b':
        out += "\\b";
        continue;
      case '\f':
        out += "\\f";
        continue;
      default:
        break;
    }
    if (c < 0x20) {
      append_escape(c);
    } else if (c < 0x80 || !ensure_ascii) {
      AppendUtf8(c, out);
    } else if (c < 0x10000) {
      append_escape(c);
    } else {
      char32_t v = c - 0x10000;
      append_escape(0xD800 + (v >> 10));
      append_escape(0xDC00 + (v & 0x3FF));
    }
  }
  out += '"';
}

std::string PyFloatRepr(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char buf[64];
  auto result = std::to_chars(buf, buf + sizeof(buf), value, std::chars_format::scientific);
  std::string sci(buf, result.ptr);
  // sci: [-]d[.ddd]e(+|-)XX
  bool negative = sci[0] == '-';
  if (negative) sci.erase(0, 1);
  size_t e_pos = sci.find('e');
  std::string mantissa = sci.substr(0, e_pos);
  int exponent = std::atoi(sci.c_str() + e_pos + 1);
  std::string digits;
  for (char c : mantissa) {
    if (c != '.') digits += c;
  }
  std::string out = negative ? "-" : "";
  if (exponent < -4 || exponent >= 16) {
    out += digits[0];
    if (digits.size() > 1) {
      out += '.';
      out += digits.substr(1);
    }
    std::snprintf(buf, sizeof(buf), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    out += buf;
    return out;
  }
  if (exponent < 0) {
    out += "0.";
    out += std::string(static_cast<size_t>(-exponent - 1), '0');
    out += digits;
    return out;
  }
  size_t int_digits = static_cast<size_t>(exponent) + 1;
  if (digits.size() <= int_digits) {
    out += digits;
    out += std::string(int_digits - digits.size(), '0');
    out += ".0";
  } else {
    out += digits.substr(0, int_digits);
    out += '.';
    out += digits.substr(int_digits);
  }
  return out;
}

std::string HtmlEscape(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

}  // namespace loom::common::jinja
