#pragma once

// Finding special-token text ("<|im_start|>", "</s>") in raw text before it is
// tokenized, the way llama.cpp's `tokenizer_st_partition` does.

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "common/tokenizer/vocab.h"

namespace loom::common {

/// One part of the input: either a special token or a run of text to tokenize.
struct TextFragment {
  int32_t token_id = -1;  // the special token, or -1 for plain text
  size_t offset = 0;      // plain text: byte range in the input
  size_t length = 0;
};

/// Splits `text` into plain-text fragments and special tokens. The special tokens are
/// tried longest first, each over all remaining plain text. CONTROL and UNKNOWN tokens
/// are matched only when `parse_special`; USER_DEFINED tokens always are (as in llama.cpp
/// and Hugging Face). Empty fragments are dropped. Thread-safe.
std::vector<TextFragment> SplitSpecialTokens(std::string_view text, const Vocab& vocab,
                                             bool parse_special);

}  // namespace loom::common
