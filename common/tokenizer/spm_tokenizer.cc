#include "common/tokenizer/spm_tokenizer.h"

#include <cstdio>
#include <queue>
#include <utility>

#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "common/unicode.h"

namespace loom::common {
namespace {

constexpr std::string_view kSpaceMarker = "\xE2\x96\x81";  // U+2581 "▁"

// "<0x0A>" -> 0x0A; -1 if `text` is not of that form.
int ParseByteToken(std::string_view text) {
  if (text.size() != 6 || text.substr(0, 3) != "<0x" || text.back() != '>') return -1;
  int value = 0;
  for (char c : text.substr(3, 2)) {
    value <<= 4;
    if (c >= '0' && c <= '9') {
      value |= c - '0';
    } else if (c >= 'A' && c <= 'F') {
      value |= c - 'A' + 10;
    } else if (c >= 'a' && c <= 'f') {
      value |= c - 'a' + 10;
    } else {
      return -1;
    }
  }
  return value;
}

struct Symbol {
  int32_t prev;
  int32_t next;
  size_t offset;  // in the escaped text
  size_t length;  // 0 once merged into its left neighbour
};

struct Bigram {
  int32_t left;
  int32_t right;
  float score;
  size_t length;  // bytes of the merged text; a mismatch later means the bigram is stale
};

// Highest score first; on equal scores the leftmost pair.
struct BigramOrder {
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  }
};

}  // namespace

// Decoding drops the space that encoding put in front.
SpmTokenizer::SpmTokenizer(Vocab vocab, bool add_space_prefix)
    : VocabTokenizer(std::move(vocab), /*strips_leading_space=*/add_space_prefix) {}

std::unique_ptr<SpmTokenizer> SpmTokenizer::Create(Vocab vocab) {
  const bool add_space_prefix = vocab.add_space_prefix;
  auto tokenizer =
      std::unique_ptr<SpmTokenizer>(new SpmTokenizer(std::move(vocab), add_space_prefix));
  const Vocab& v = tokenizer->vocab();
  for (int byte = 0; byte < 256; ++byte) {
    int32_t id = v.Find(absl::StrFormat("<0x%02X>", byte));
    if (id < 0) id = v.Find(std::string(1, static_cast<char>(byte)));
    if (id < 0) id = v.unknown_id;
    tokenizer->byte_ids_[byte] = id;
  }
  tokenizer->InitTokenBytes();
  return tokenizer;
}

std::string SpmTokenizer::ComputeTokenBytes(int32_t id) const {
  const std::string& text = vocab().texts[id];
  switch (vocab().type(id)) {
    case TokenType::kNormal:
      return absl::StrReplaceAll(text, {{"\xE2\x96\x81", " "}});
    case TokenType::kControl:
    case TokenType::kUnknown:
    case TokenType::kUserDefined:
      return text;
    case TokenType::kByte: {
      const int byte = ParseByteToken(text);
      return byte >= 0 ? std::string(1, static_cast<char>(byte)) : std::string();
    }
    case TokenType::kUnused:
    case TokenType::kUndefined:
      break;
  }
  return {};
}

void SpmTokenizer::EncodeText(std::string_view text, bool after_special,
                              std::vector<int32_t>* ids) const {
  const Vocab& v = vocab();
  std::string escaped;
  escaped.reserve(text.size() + 16);
  if (v.add_space_prefix && after_special) escaped.append(kSpaceMarker);
  for (char c : text) {
    if (c == ' ') {
      escaped.append(kSpaceMarker);
    } else {
      escaped.push_back(c);
    }
  }
  if (escaped.empty()) return;

  // One symbol per UTF-8 character (a stray byte is a character of its own).
  std::vector<Symbol> symbols;
  symbols.reserve(escaped.size());
  for (size_t offset = 0; offset < escaped.size();) {
    const size_t length = std::min<size_t>(
        Utf8SequenceLength(static_cast<uint8_t>(escaped[offset])), escaped.size() - offset);
    const int32_t index = static_cast<int32_t>(symbols.size());
    symbols.push_back({index - 1, offset + length == escaped.size() ? -1 : index + 1, offset,
                       length});
    offset += length;
  }

  std::priority_queue<Bigram, std::vector<Bigram>, BigramOrder> queue;
  auto try_add_bigram = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const size_t length = symbols[left].length + symbols[right].length;
    const int32_t id = v.Find(std::string_view(escaped).substr(symbols[left].offset, length));
    if (id < 0) return;
    queue.push({left, right, v.scores[id], length});
  };
  for (int32_t i = 1; i < static_cast<int32_t>(symbols.size()); ++i) try_add_bigram(i - 1, i);

  while (!queue.empty()) {
    const Bigram bigram = queue.top();
    queue.pop();
    Symbol& left = symbols[bigram.left];
    Symbol& right = symbols[bigram.right];
    if (left.length == 0 || right.length == 0 || left.length + right.length != bigram.length) {
      continue;  // one side was merged since this bigram was queued
    }
    left.length += right.length;
    right.length = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = bigram.left;
    try_add_bigram(left.prev, bigram.left);
    try_add_bigram(bigram.left, left.next);
  }

  // Every merged symbol is a token by construction; a single character that is not
  // falls back to its bytes (llama.cpp's resegment reaches the same result).
  for (int32_t i = 0; i != -1; i = symbols[i].next) {
    const std::string_view piece =
        std::string_view(escaped).substr(symbols[i].offset, symbols[i].length);
    const int32_t id = v.Find(piece);
    if (id >= 0) {
      ids->push_back(id);
      continue;
    }
    for (char c : piece) {
      const int32_t byte_id = byte_ids_[static_cast<uint8_t>(c)];
      if (byte_id >= 0) ids->push_back(byte_id);
    }
  }
}

}  // namespace loom::common
