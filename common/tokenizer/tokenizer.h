#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/formats/gguf_file.h"

namespace loom::common {

/// A tokenizer built from GGUF metadata alone (`tokenizer.ggml.*`): byte-level BPE
/// (`gpt2` model with the pre-tokenizer named by `tokenizer.ggml.pre`) or
/// SentencePiece-style BPE (`llama` model, byte fallback). Immutable; thread-safe.
class Tokenizer {
 public:
  /// Builds the tokenizer `tokenizer.ggml.model` names ("gpt2" or "llama") from the
  /// file's vocabulary. NotFound/InvalidArgument (naming the key) for missing or
  /// malformed metadata or an unknown `tokenizer.ggml.pre` (a missing one means
  /// llama.cpp's "default"); Unimplemented for other models (bert, t5, rwkv...).
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
  /// True for control/special tokens (EOS, <|im_end|>, ...): token types CONTROL and
  /// UNKNOWN, the ones Decode(skip_special) leaves out.
  virtual bool IsSpecial(int32_t id) const = 0;
  /// Ids that end generation (EOS, EOT, EOM...).
  virtual std::vector<int32_t> EndOfGenerationIds() const = 0;
  /// The vocabulary string of a token as stored in the GGUF.
  virtual std::string_view TokenText(int32_t id) const = 0;

  /// Bytes `id` adds to a decoded text: TokenBytes(id); nothing for a special token when
  /// `skip_special`; and when `at_start` (nothing decoded before it) a tokenizer that
  /// put a space before the text (SentencePiece add_space_prefix) drops that space.
  /// Decode and IncrementalDecoder are built on this. Thread-safe.
  virtual std::string DecodePiece(int32_t id, bool skip_special, bool at_start) const;
  /// Whether decoding `id` ends the start of the text (it shows bytes, even if the
  /// at_start rule left none of them: SPM's lone "▁"). Thread-safe.
  virtual bool DecodePieceEndsStart(int32_t id, bool skip_special) const;
};

}  // namespace loom::common
