#include "common/unicode.h"

namespace loom::common {
namespace {

bool IsContinuation(uint8_t byte) { return (byte & 0xC0) == 0x80; }

// Valid range of the second byte of a sequence led by `lead` (Unicode table 3-7): this
// rules out overlong forms, surrogates and code points above U+10FFFF.
void SecondByteRange(uint8_t lead, uint8_t* low, uint8_t* high) {
  *low = 0x80;
  *high = 0xBF;
  if (lead == 0xE0) *low = 0xA0;
  if (lead == 0xED) *high = 0x9F;
  if (lead == 0xF0) *low = 0x90;
  if (lead == 0xF4) *high = 0x8F;
}

// Sequence length for a lead byte that can start a well-formed sequence, else 0.
int ValidLeadLength(uint8_t lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}

}  // namespace

void AppendUtf8(uint32_t code_point, std::string& out) {
  if (code_point < 0x80) {
    out.push_back(static_cast<char>(code_point));
  } else if (code_point < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (code_point >> 6)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  } else if (code_point < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (code_point >> 12)));
    out.push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (code_point >> 18)));
    out.push_back(static_cast<char>(0x80 | ((code_point >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  }
}

bool DecodeUtf8(std::string_view text, size_t* pos, uint32_t* code_point) {
  const size_t start = *pos;
  const uint8_t lead = static_cast<uint8_t>(text[start]);
  const int length = ValidLeadLength(lead);
  if (length == 0) {
    *pos = start + 1;
    return false;
  }
  if (length == 1) {
    *code_point = lead;
    *pos = start + 1;
    return true;
  }
  uint32_t value = lead & (0xFF >> (length + 1));
  for (int i = 1; i < length; ++i) {
    if (start + i >= text.size()) {
      *pos = start + i;
      return false;
    }
    const uint8_t byte = static_cast<uint8_t>(text[start + i]);
    uint8_t low = 0x80, high = 0xBF;
    if (i == 1) SecondByteRange(lead, &low, &high);
    if (byte < low || byte > high) {
      *pos = start + i;
      return false;
    }
    value = (value << 6) | (byte & 0x3F);
  }
  *code_point = value;
  *pos = start + length;
  return true;
}

size_t CompleteUtf8PrefixLength(std::string_view bytes) {
  // A character is at most 4 bytes, so an incomplete one starts in the last 3 bytes.
  const size_t size = bytes.size();
  for (size_t back = 1; back <= 3 && back <= size; ++back) {
    const size_t start = size - back;
    const uint8_t lead = static_cast<uint8_t>(bytes[start]);
    if (IsContinuation(lead)) continue;
    const int length = ValidLeadLength(lead);
    if (length <= static_cast<int>(back)) return size;  // complete, or not a lead at all
    // Hold the tail back only if every byte so far can still belong to a valid character.
    for (size_t i = 1; i < back; ++i) {
      const uint8_t byte = static_cast<uint8_t>(bytes[start + i]);
      uint8_t low = 0x80, high = 0xBF;
      if (i == 1) SecondByteRange(lead, &low, &high);
      if (byte < low || byte > high) return size;
    }
    return start;
  }
  return size;
}

bool IsValidUtf8(std::string_view text) {
  size_t pos = 0;
  uint32_t code_point = 0;
  while (pos < text.size()) {
    if (static_cast<uint8_t>(text[pos]) < 0x80) {
      ++pos;
      continue;
    }
    if (!DecodeUtf8(text, &pos, &code_point)) return false;
  }
  return true;
}

std::string SanitizeUtf8(std::string_view text) {
  if (IsValidUtf8(text)) return std::string(text);
  std::string out;
  out.reserve(text.size() + 8);
  size_t pos = 0;
  uint32_t code_point = 0;
  while (pos < text.size()) {
    const size_t start = pos;
    if (DecodeUtf8(text, &pos, &code_point)) {
      out.append(text.substr(start, pos - start));
    } else {
      out.append(kReplacementCharacter);
    }
  }
  return out;
}

}  // namespace loom::common
