#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/gguf_file.h"

namespace loom::common {

/// A tokenizer built from GGUF metadata alone (`tokenizer.ggml.*`): byte-level BPE
/// (`gpt2` model with the pre-tokenizer named by `tokenizer.ggml.pre`) or
/// SentencePiece-style BPE (`llama` model, byte fallback). Immutable; thread-safe.
class Tokenizer {
 public:
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromGguf(const GgufFile& gguf);
  virtual ~Tokenizer() = default;

  /// Token ids for `text`. `add_special`: add BOS/EOS as the model's flags say.
  /// `parse_special`: text like "<|im_start|>" becomes its special token instead of
  /// being tokenized as plain text.
  virtual std::vector<int32_t> Encode(std::string_view text, bool add_special,
                                      bool parse_special) const = 0;

  /// Text of `ids` (the bytes may end in an incomplete UTF-8 sequence only if the ids
  /// do). InvalidArgument for an id outside the vocabulary.
  virtual absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids,
                                             bool skip_special) const = 0;

  /// Raw bytes one token stands for when decoded (after byte-level / SPM mapping);
  /// empty for out-of-range ids.
  virtual std::string TokenBytes(int32_t id) const = 0;

  virtual int32_t vocab_size() const = 0;
  virtual int32_t bos_id() const = 0;  // -1 when the model has none
  virtual int32_t eos_id() const = 0;  // -1 when the model has none
  /// True for control/special tokens (EOS, <|im_end|>, ...).
  virtual bool IsSpecial(int32_t id) const = 0;
  /// Ids that end generation (EOS, EOT, EOM...).
  virtual std::vector<int32_t> EndOfGenerationIds() const = 0;
  /// The vocabulary string of a token as stored in the GGUF.
  virtual std::string_view TokenText(int32_t id) const = 0;
};

/// Turns a stream of token ids into text, emitting only complete UTF-8: bytes of a
/// character split across tokens are held until the character is complete. One per
/// sequence; not thread-safe.
class IncrementalDecoder {
 public:
  IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special)
      : tokenizer_(tokenizer), skip_special_(skip_special) {}

  /// Appends one token; returns the newly completed text (possibly empty).
  std::string Append(int32_t id);
  /// Returns whatever is still held (invalid trailing bytes become U+FFFD).
  std::string Flush();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  bool emitted_any_ = false;
  std::string pending_;  // bytes of an incomplete UTF-8 character
};

}  // namespace loom::common
