#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/tokenizer/pre_tokenizer.h"
#include "common/tokenizer/vocab.h"
#include "common/tokenizer/vocab_tokenizer.h"

namespace loom::common {

/// Byte-level BPE (GGUF `tokenizer.ggml.model` = "gpt2"): the text is split by the
/// pre-tokenizer, each piece is written in GPT-2's byte alphabet, and the merges are
/// applied lowest rank first (leftmost on ties), as in Hugging Face `tokenizers` and
/// llama.cpp. Immutable; thread-safe.
class BpeTokenizer final : public VocabTokenizer {
 public:
  /// `merges`: "left right" strings, highest priority first (`tokenizer.ggml.merges`).
  /// Merges whose parts or result are not vocabulary entries can never apply and are
  /// dropped. Bytes whose alphabet character has no token are dropped (as llama.cpp
  /// does).
  static absl::StatusOr<std::unique_ptr<BpeTokenizer>> Create(
      Vocab vocab, const std::vector<std::string_view>& merges,
      std::unique_ptr<PreTokenizer> pre_tokenizer);

  /// Number of usable merges.
  size_t num_merges() const { return merges_.size(); }

 private:
  struct Merge {
    int32_t rank;       // position in tokenizer.ggml.merges; lower merges first
    int32_t result_id;  // token the pair becomes
  };

  BpeTokenizer(Vocab vocab, std::unique_ptr<PreTokenizer> pre_tokenizer);

  void EncodeText(std::string_view text, bool after_special,
                  std::vector<int32_t>* ids) const override;
  std::string ComputeTokenBytes(int32_t id) const override;

  // The merge for the adjacent pair (left, right), or nullptr.
  const Merge* FindMerge(int32_t left, int32_t right) const;
  // Appends the ids of one pre-tokenized piece.
  void EncodeWord(std::string_view word, std::vector<int32_t>* symbols,
                  std::vector<int32_t>* ids) const;
  // Merge loops over `symbols` (token ids, -1 for bytes with no token): a linear scan
  // for short words, a heap for long ones. Both give the same result.
  void MergeShort(std::vector<int32_t>* symbols) const;
  void MergeLong(std::vector<int32_t>* symbols) const;

  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::array<int32_t, 256> byte_ids_;  // token of each byte's alphabet character
  absl::flat_hash_map<uint64_t, Merge> merges_;  // key: left id << 32 | right id
};

}  // namespace loom::common
