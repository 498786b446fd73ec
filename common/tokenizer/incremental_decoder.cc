#include "common/tokenizer/incremental_decoder.h"

#include "common/unicode.h"

namespace loom::common {

std::string IncrementalDecoder::Append(int32_t id) {
  const std::string piece = tokenizer_.DecodePiece(id, skip_special_, !emitted_any_);
  if (!emitted_any_) emitted_any_ = tokenizer_.DecodePieceEndsStart(id, skip_special_);
  if (piece.empty()) return {};
  pending_.append(piece);
  const size_t complete = CompleteUtf8PrefixLength(pending_);
  std::string out = SanitizeUtf8(std::string_view(pending_).substr(0, complete));
  pending_.erase(0, complete);
  return out;
}

std::string IncrementalDecoder::Flush() {
  std::string out = SanitizeUtf8(pending_);
  pending_.clear();
  return out;
}

}  // namespace loom::common
