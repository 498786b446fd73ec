#pragma once

#include <cstdint>
#include <vector>

namespace loom::bench {

/// `length` token ids in [0, vocab) from a fixed linear congruential sequence of `seed`: the
/// same prompt on every machine and run, different prompts for different seeds (no prefix
/// shared beyond chance). The benchmarks' synthetic prompts.
std::vector<int32_t> RandomPrompt(int64_t length, int64_t vocab, uint32_t seed);

}  // namespace loom::bench
