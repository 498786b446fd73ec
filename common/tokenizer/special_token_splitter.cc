#include "common/tokenizer/special_token_splitter.h"

#include <utility>

namespace loom::common {
namespace {

// C isspace() in the "C" locale, which llama.cpp uses for RSTRIP.
bool IsAsciiSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

}  // namespace

std::vector<TextFragment> SplitSpecialTokens(std::string_view text, const Vocab& vocab,
                                             bool parse_special) {
  std::vector<TextFragment> fragments;
  if (text.empty()) return fragments;
  fragments.push_back({-1, 0, text.size()});
  std::vector<TextFragment> next;
  for (const int32_t special_id : vocab.special_token_ids) {
    const TokenType type = vocab.type(special_id);
    if (!parse_special && (type == TokenType::kControl || type == TokenType::kUnknown)) continue;
    const std::string_view token_text = vocab.texts[special_id];
    const bool strip_right = vocab.strips_right_space[special_id];
    bool found_any = false;
    next.clear();
    for (const TextFragment& fragment : fragments) {
      if (fragment.token_id >= 0) {
        next.push_back(fragment);
        continue;
      }
      size_t begin = fragment.offset;
      const size_t end = fragment.offset + fragment.length;
      while (begin < end) {
        const size_t match = text.substr(0, end).find(token_text, begin);
        if (match == std::string_view::npos) break;
        found_any = true;
        if (match > begin) next.push_back({-1, begin, match - begin});
        next.push_back({special_id, match, token_text.size()});
        begin = match + token_text.size();
        if (strip_right) {
          while (begin < end && IsAsciiSpace(text[begin])) ++begin;
        }
      }
      if (begin < end) next.push_back({-1, begin, end - begin});
    }
    if (found_any) fragments.swap(next);
  }
  return fragments;
}

}  // namespace loom::common
