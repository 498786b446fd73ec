#pragma once

#include <cstdint>
#include <string>

#include "common/tokenizer/tokenizer.h"

namespace loom::common {

/// Turns a stream of token ids into text, emitting only complete UTF-8: bytes of a
/// character split across tokens are held until the character is complete. One per
/// sequence; not thread-safe. `tokenizer` must outlive it.
class IncrementalDecoder {
 public:
  IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special)
      : tokenizer_(tokenizer), skip_special_(skip_special) {}

  /// Appends one token; returns the newly completed text (possibly empty). Always valid
  /// UTF-8: bytes that can no longer form a character are replaced by U+FFFD. Ids
  /// outside the vocabulary add nothing.
  std::string Append(int32_t id);
  /// Returns whatever is still held (invalid trailing bytes become U+FFFD) and resets
  /// the pending bytes.
  std::string Flush();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  bool emitted_any_ = false;  // a token has produced bytes (SPM leading-space rule)
  std::string pending_;       // bytes of an incomplete UTF-8 character (at most 3)
};

}  // namespace loom::common
