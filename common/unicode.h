#pragma once

// UTF-8 helpers for the tokenizers: splitting bytes into characters, finding where an
// incomplete character starts, and repairing invalid bytes. All functions are pure and
// thread-safe.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace loom::common {

/// The code point U+FFFD that stands in for invalid UTF-8.
inline constexpr std::string_view kReplacementCharacter = "\xEF\xBF\xBD";

/// Bytes of the UTF-8 sequence that `lead_byte` starts: 1 for ASCII and for bytes that
/// cannot start a sequence (stray continuation bytes), else 2, 3 or 4.
inline int Utf8SequenceLength(uint8_t lead_byte) {
  if (lead_byte < 0xC0) return 1;
  if (lead_byte < 0xE0) return 2;
  if (lead_byte < 0xF0) return 3;
  return 4;
}

/// Appends the UTF-8 encoding of `code_point` (must be <= 0x10FFFF) to `out`.
void AppendUtf8(uint32_t code_point, std::string& out);

/// Decodes one well-formed UTF-8 character of `text` at `*pos`. On success stores it in
/// `*code_point`, advances `*pos` past it and returns true. On invalid or truncated
/// input returns false and advances `*pos` past the maximal invalid subpart (at least one
/// byte), as the Unicode standard's "U+FFFD substitution of maximal subparts" asks.
bool DecodeUtf8(std::string_view text, size_t* pos, uint32_t* code_point);

/// Length of the longest prefix of `bytes` that does not end inside a character that
/// could still be completed by more bytes. `bytes.substr(result)` is empty or the
/// start (1 to 3 bytes) of a valid multi-byte character.
size_t CompleteUtf8PrefixLength(std::string_view bytes);

/// True if `text` is entirely well-formed UTF-8.
bool IsValidUtf8(std::string_view text);

/// `text` with each maximal invalid subpart replaced by U+FFFD (what Python's
/// `bytes.decode("utf-8", "replace")` gives).
std::string SanitizeUtf8(std::string_view text);

}  // namespace loom::common
