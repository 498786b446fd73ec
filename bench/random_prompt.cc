#include "bench/random_prompt.h"

#include <cstddef>

namespace loom::bench {

std::vector<int32_t> RandomPrompt(int64_t length, int64_t vocab, uint32_t seed) {
  std::vector<int32_t> ids(static_cast<size_t>(length));
  uint32_t state = seed * 2654435761u + 1;
  for (int64_t i = 0; i < length; ++i) {
    state = state * 1664525u + 1013904223u;
    ids[static_cast<size_t>(i)] = static_cast<int32_t>((state >> 8) % static_cast<uint32_t>(vocab));
  }
  return ids;
}

}  // namespace loom::bench
