#include "common/tokenizer/byte_level.h"

#include <array>

#include "common/unicode.h"

namespace loom::common {
namespace {

struct ByteLevelTables {
  std::array<uint32_t, 256> byte_to_code_point;
  std::array<int16_t, 324> code_point_to_byte;  // every mapped code point is < 324

  ByteLevelTables() {
    code_point_to_byte.fill(-1);
    // Printable Latin-1 bytes map to themselves; the others (control characters, space,
    // 0x7F-0xA0, 0xAD) are moved to 256, 257, ... in byte order.
    uint32_t next_code_point = 256;
    for (int byte = 0; byte < 256; ++byte) {
      const bool printable = (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) ||
                             (byte >= 0xAE && byte <= 0xFF);
      const uint32_t code_point = printable ? static_cast<uint32_t>(byte) : next_code_point++;
      byte_to_code_point[byte] = code_point;
      code_point_to_byte[code_point] = static_cast<int16_t>(byte);
    }
  }
};

const ByteLevelTables& Tables() {
  static const ByteLevelTables* tables = new ByteLevelTables();
  return *tables;
}

}  // namespace

uint32_t ByteToUnicode(uint8_t byte) { return Tables().byte_to_code_point[byte]; }

int UnicodeToByte(uint32_t code_point) {
  const auto& table = Tables().code_point_to_byte;
  return code_point < table.size() ? table[code_point] : -1;
}

std::string ByteLevelEncode(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) AppendUtf8(ByteToUnicode(static_cast<uint8_t>(c)), out);
  return out;
}

std::string ByteLevelDecode(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t start = pos;
    uint32_t code_point = 0;
    if (DecodeUtf8(text, &pos, &code_point)) {
      const int byte = UnicodeToByte(code_point);
      if (byte >= 0) {
        out.push_back(static_cast<char>(byte));
        continue;
      }
    }
    out.append(text.substr(start, pos - start));
  }
  return out;
}

}  // namespace loom::common
