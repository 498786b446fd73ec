#pragma once

// GPT-2's byte-level alphabet: every byte 0..255 is shown as one printable Unicode
// character so that byte-level BPE vocabularies can be stored as text ("Ġ" is the byte
// 0x20). Thread-safe.

#include <cstdint>
#include <string>
#include <string_view>

namespace loom::common {

/// The code point GPT-2's `bytes_to_unicode()` assigns to `byte`.
uint32_t ByteToUnicode(uint8_t byte);

/// The byte that `code_point` stands for, or -1 if it is not in the byte-level alphabet.
int UnicodeToByte(uint32_t code_point);

/// `bytes` written in the byte-level alphabet (one character per byte).
std::string ByteLevelEncode(std::string_view bytes);

/// Inverse of ByteLevelEncode. Characters outside the alphabet are copied unchanged.
std::string ByteLevelDecode(std::string_view text);

}  // namespace loom::common
