#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/tokenizer/vocab.h"
#include "common/tokenizer/vocab_tokenizer.h"

namespace loom::common {

/// SentencePiece-style BPE (GGUF `tokenizer.ggml.model` = "llama"): spaces become "▁",
/// a space is put before the text (add_space_prefix) at the start and after each special
/// token, characters are merged highest score first, and characters with no token fall
/// back to byte tokens "<0xNN>". Follows llama.cpp's `llm_tokenizer_spm`. Immutable;
/// thread-safe.
class SpmTokenizer final : public VocabTokenizer {
 public:
  static std::unique_ptr<SpmTokenizer> Create(Vocab vocab);

 private:
  SpmTokenizer(Vocab vocab, bool add_space_prefix);

  void EncodeText(std::string_view text, bool after_special,
                  std::vector<int32_t>* ids) const override;
  std::string ComputeTokenBytes(int32_t id) const override;

  std::array<int32_t, 256> byte_ids_;  // "<0xNN>" token of each byte, -1 if none
};

}  // namespace loom::common
