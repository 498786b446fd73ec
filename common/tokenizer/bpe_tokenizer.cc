#include "common/tokenizer/bpe_tokenizer.h"

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <queue>
#include <utility>

#include "common/tokenizer/byte_level.h"

namespace loom::common {
namespace {

// Words up to this many bytes use the quadratic scan, which beats a heap on short input.
constexpr size_t kShortWordBytes = 48;

uint64_t PairKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
         static_cast<uint32_t>(right);
}

// "<0x0A>" -> 0x0A; -1 if `text` is not of that form.
int ParseByteToken(std::string_view text) {
  if (text.size() != 6 || text.substr(0, 3) != "<0x" || text.back() != '>') return -1;
  char digits[3] = {text[3], text[4], 0};
  char* end = nullptr;
  const long value = std::strtol(digits, &end, 16);
  return end == digits + 2 ? static_cast<int>(value) : -1;
}

}  // namespace

BpeTokenizer::BpeTokenizer(Vocab vocab, std::unique_ptr<PreTokenizer> pre_tokenizer)
    : VocabTokenizer(std::move(vocab), /*strips_leading_space=*/false),
      pre_tokenizer_(std::move(pre_tokenizer)) {}

absl::StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::Create(
    Vocab vocab, const std::vector<std::string_view>& merges,
    std::unique_ptr<PreTokenizer> pre_tokenizer) {
  auto tokenizer =
      std::unique_ptr<BpeTokenizer>(new BpeTokenizer(std::move(vocab), std::move(pre_tokenizer)));
  const Vocab& v = tokenizer->vocab();
  // A byte whose character is not in the vocabulary gets no token (llama.cpp drops it).
  for (int byte = 0; byte < 256; ++byte) {
    tokenizer->byte_ids_[byte] = v.Find(ByteLevelEncode(std::string(1, static_cast<char>(byte))));
  }
  tokenizer->merges_.reserve(merges.size());
  std::string joined;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const std::string_view merge = merges[rank];
    // Search from 1 so that a first part that is itself " " still splits correctly.
    const size_t space = merge.find(' ', 1);
    if (space == std::string_view::npos) continue;
    const std::string_view left = merge.substr(0, space);
    const std::string_view right = merge.substr(space + 1);
    const int32_t left_id = v.Find(left);
    const int32_t right_id = v.Find(right);
    joined.assign(left);
    joined.append(right);
    const int32_t result_id = v.Find(joined);
    if (left_id < 0 || right_id < 0 || result_id < 0) continue;
    // The first (highest-priority) occurrence of a pair wins.
    tokenizer->merges_.try_emplace(PairKey(left_id, right_id),
                                   Merge{static_cast<int32_t>(rank), result_id});
  }
  tokenizer->InitTokenBytes();
  return tokenizer;
}

std::string BpeTokenizer::ComputeTokenBytes(int32_t id) const {
  const std::string& text = vocab().texts[id];
  switch (vocab().type(id)) {
    case TokenType::kNormal:
      return ByteLevelDecode(text);
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

const BpeTokenizer::Merge* BpeTokenizer::FindMerge(int32_t left, int32_t right) const {
  if (left < 0 || right < 0) return nullptr;
  auto it = merges_.find(PairKey(left, right));
  return it == merges_.end() ? nullptr : &it->second;
}

void BpeTokenizer::EncodeText(std::string_view text, bool /*after_special*/,
                              std::vector<int32_t>* ids) const {
  std::vector<TextSpan> pieces;
  std::string normalized;
  text = pre_tokenizer_->Normalize(text, &normalized);
  pre_tokenizer_->Split(text, &pieces);
  std::vector<int32_t> symbols;
  for (const TextSpan& piece : pieces) {
    EncodeWord(text.substr(piece.offset, piece.length), &symbols, ids);
  }
}

void BpeTokenizer::EncodeWord(std::string_view word, std::vector<int32_t>* symbols,
                              std::vector<int32_t>* ids) const {
  if (pre_tokenizer_->ignore_merges()) {
    const int32_t whole = vocab().Find(ByteLevelEncode(word));
    if (whole >= 0) {
      ids->push_back(whole);
      return;
    }
  }
  symbols->resize(word.size());
  for (size_t i = 0; i < word.size(); ++i) {
    (*symbols)[i] = byte_ids_[static_cast<uint8_t>(word[i])];
  }
  if (word.size() <= kShortWordBytes) {
    MergeShort(symbols);
  } else {
    MergeLong(symbols);
  }
  for (const int32_t id : *symbols) {
    if (id >= 0) ids->push_back(id);
  }
}

void BpeTokenizer::MergeShort(std::vector<int32_t>* symbols) const {
  int32_t* s = symbols->data();
  size_t n = symbols->size();
  if (n < 2) return;
  // rank[i] / result[i]: the merge of the pair (s[i], s[i + 1]).
  int32_t rank[kShortWordBytes];
  int32_t result[kShortWordBytes];
  auto set_pair = [&](size_t i) {
    const Merge* merge = FindMerge(s[i], s[i + 1]);
    rank[i] = merge != nullptr ? merge->rank : INT32_MAX;
    result[i] = merge != nullptr ? merge->result_id : -1;
  };
  for (size_t i = 0; i + 1 < n; ++i) set_pair(i);
  while (n > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < n; ++i) {
      if (rank[i] < rank[best]) best = i;
    }
    if (rank[best] == INT32_MAX) break;
    s[best] = result[best];
    // Drop symbol best + 1 and the pair that started at best.
    std::memmove(s + best + 1, s + best + 2, (n - best - 2) * sizeof(int32_t));
    std::memmove(rank + best, rank + best + 1, (n - best - 2) * sizeof(int32_t));
    std::memmove(result + best, result + best + 1, (n - best - 2) * sizeof(int32_t));
    --n;
    if (best + 1 < n) set_pair(best);
    if (best > 0) set_pair(best - 1);
  }
  symbols->resize(n);
}

void BpeTokenizer::MergeLong(std::vector<int32_t>* symbols) const {
  std::vector<int32_t>& s = *symbols;
  const int32_t n = static_cast<int32_t>(s.size());
  std::vector<int32_t> prev(n), next(n);
  std::vector<uint8_t> dead(n, 0);
  for (int32_t i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Candidate {
    int32_t rank;
    int32_t left;  // position of the left symbol; leftmost wins on equal rank
    int32_t right;
    int32_t left_id;
    int32_t right_id;
    int32_t result_id;
  };
  auto later = [](const Candidate& a, const Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.left > b.left;
  };
  std::priority_queue<Candidate, std::vector<Candidate>, decltype(later)> queue(later);
  auto push_pair = [&](int32_t left, int32_t right) {
    const Merge* merge = FindMerge(s[left], s[right]);
    if (merge != nullptr) {
      queue.push({merge->rank, left, right, s[left], s[right], merge->result_id});
    }
  };
  for (int32_t i = 0; i + 1 < n; ++i) push_pair(i, i + 1);
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    // Stale if either side was merged away or changed since the pair was queued.
    if (dead[c.left] || dead[c.right] || next[c.left] != c.right || s[c.left] != c.left_id ||
        s[c.right] != c.right_id) {
      continue;
    }
    s[c.left] = c.result_id;
    dead[c.right] = 1;
    next[c.left] = next[c.right];
    if (next[c.right] >= 0) prev[next[c.right]] = c.left;
    if (prev[c.left] >= 0) push_pair(prev[c.left], c.left);
    if (next[c.left] >= 0) push_pair(c.left, next[c.left]);
  }
  size_t kept = 0;
  for (int32_t i = 0; i < n; ++i) {
    if (!dead[i]) s[kept++] = s[i];
  }
  s.resize(kept);
}

}  // namespace loom::common
