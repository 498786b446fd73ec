#include "common/tokenizer/vocab_tokenizer.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/tokenizer/special_token_splitter.h"

namespace loom::common {

VocabTokenizer::VocabTokenizer(Vocab vocab, bool strips_leading_space)
    : vocab_(std::move(vocab)), strips_leading_space_(strips_leading_space) {}

void VocabTokenizer::InitTokenBytes() {
  token_bytes_.resize(vocab_.size());
  for (int32_t id = 0; id < vocab_.size(); ++id) token_bytes_[id] = ComputeTokenBytes(id);
}

std::vector<int32_t> VocabTokenizer::Encode(std::string_view text, bool add_special,
                                            bool parse_special) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (add_special && vocab_.add_bos) ids.push_back(vocab_.bos_id);
  bool after_special = true;
  for (const TextFragment& fragment : SplitSpecialTokens(text, vocab_, parse_special)) {
    if (fragment.token_id >= 0) {
      ids.push_back(fragment.token_id);
      after_special = true;
    } else {
      EncodeText(text.substr(fragment.offset, fragment.length), after_special, &ids);
      after_special = false;
    }
  }
  if (add_special && vocab_.add_eos) ids.push_back(vocab_.eos_id);
  return ids;
}

std::string_view VocabTokenizer::PieceView(int32_t id, bool skip_special, bool at_start) const {
  if (!vocab_.IsValid(id)) return {};
  if (skip_special && IsSpecial(id)) return {};
  std::string_view piece = token_bytes_[id];
  if (at_start && strips_leading_space_ && !piece.empty() && piece.front() == ' ') {
    piece.remove_prefix(1);
  }
  return piece;
}

bool VocabTokenizer::EndsStart(int32_t id, bool skip_special) const {
  if (!vocab_.IsValid(id) || (skip_special && IsSpecial(id))) return false;
  return !token_bytes_[id].empty();
}

absl::StatusOr<std::string> VocabTokenizer::Decode(absl::Span<const int32_t> ids,
                                                   bool skip_special) const {
  std::string text;
  bool at_start = true;
  for (const int32_t id : ids) {
    if (!vocab_.IsValid(id)) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", id, " is outside the vocabulary of ",
                                                     vocab_.size(), " tokens"));
    }
    text.append(PieceView(id, skip_special, at_start));
    // Only the first token that shows anything loses its prefix space (a lone "▁"
    // becomes empty, and the next token keeps its space), as in llama.cpp.
    if (at_start && EndsStart(id, skip_special)) at_start = false;
  }
  return text;
}

std::string VocabTokenizer::DecodePiece(int32_t id, bool skip_special, bool at_start) const {
  return std::string(PieceView(id, skip_special, at_start));
}

bool VocabTokenizer::DecodePieceEndsStart(int32_t id, bool skip_special) const {
  return EndsStart(id, skip_special);
}

std::string VocabTokenizer::TokenBytes(int32_t id) const {
  return vocab_.IsValid(id) ? token_bytes_[id] : std::string();
}

bool VocabTokenizer::IsSpecial(int32_t id) const {
  if (!vocab_.IsValid(id)) return false;
  const TokenType type = vocab_.type(id);
  return type == TokenType::kControl || type == TokenType::kUnknown;
}

std::string_view VocabTokenizer::TokenText(int32_t id) const {
  return vocab_.IsValid(id) ? std::string_view(vocab_.texts[id]) : std::string_view();
}

}  // namespace loom::common
