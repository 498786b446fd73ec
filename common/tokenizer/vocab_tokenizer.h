#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/vocab.h"

namespace loom::common {

/// What every GGUF tokenizer shares: special-token matching, BOS/EOS, decoding and the
/// vocabulary look-ups. Subclasses (BpeTokenizer, SpmTokenizer) only turn a run of
/// plain text into ids and say what bytes each token stands for. Immutable after
/// construction; thread-safe.
class VocabTokenizer : public Tokenizer {
 public:
  std::vector<int32_t> Encode(std::string_view text, bool add_special,
                              bool parse_special) const override;
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids,
                                     bool skip_special) const override;
  std::string TokenBytes(int32_t id) const override;
  std::string DecodePiece(int32_t id, bool skip_special, bool at_start) const override;
  bool DecodePieceEndsStart(int32_t id, bool skip_special) const override;

  int32_t vocab_size() const override { return vocab_.size(); }
  int32_t bos_id() const override { return vocab_.bos_id; }
  int32_t eos_id() const override { return vocab_.eos_id; }
  bool IsSpecial(int32_t id) const override;
  std::vector<int32_t> EndOfGenerationIds() const override {
    return vocab_.end_of_generation_ids;
  }
  std::string_view TokenText(int32_t id) const override;

  /// The vocabulary this tokenizer was built from.
  const Vocab& vocab() const { return vocab_; }

 protected:
  /// `strips_leading_space`: decoding drops the space the encoder put before the text.
  VocabTokenizer(Vocab vocab, bool strips_leading_space);

  /// Appends the ids of one run of plain text (no special tokens in it). `after_special`
  /// is true for the first run of the input and for a run right after a special token.
  virtual void EncodeText(std::string_view text, bool after_special,
                          std::vector<int32_t>* ids) const = 0;
  /// The raw bytes of token `id` (a valid id). Called once per token by InitTokenBytes.
  virtual std::string ComputeTokenBytes(int32_t id) const = 0;
  /// Caches ComputeTokenBytes for every token; subclass constructors call it last.
  void InitTokenBytes();

 private:
  // The piece `id` decodes to, as a view into token_bytes_.
  std::string_view PieceView(int32_t id, bool skip_special, bool at_start) const;
  // Whether `id` shows bytes (so the text no longer is at its start).
  bool EndsStart(int32_t id, bool skip_special) const;

  Vocab vocab_;
  bool strips_leading_space_;
  std::vector<std::string> token_bytes_;  // [vocab size] after InitTokenBytes
};

}  // namespace loom::common
