#include "worker/ngram_proposer.h"

#include <algorithm>

namespace loom::worker {

std::vector<int32_t> ProposeNgram(absl::Span<const int32_t> tokens, int32_t min_n,
                                  int32_t max_n, int32_t k) {
  const int64_t len = static_cast<int64_t>(tokens.size());
  if (k <= 0 || min_n <= 0) return {};
  for (int64_t n = std::min<int64_t>(max_n, len - 1); n >= min_n; --n) {
    const absl::Span<const int32_t> suffix = tokens.subspan(len - n, n);
    // Most recent earlier occurrence: its continuation starts at start + n < len.
    for (int64_t start = len - n - 1; start >= 0; --start) {
      if (!std::equal(suffix.begin(), suffix.end(), tokens.begin() + start)) continue;
      const int64_t from = start + n;
      const int64_t count = std::min<int64_t>(k, len - from);
      return std::vector<int32_t>(tokens.begin() + from, tokens.begin() + from + count);
    }
  }
  return {};
}

}  // namespace loom::worker
