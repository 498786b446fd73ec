#pragma once

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace loom::worker {

/// Prompt-lookup speculation: no draft model. The last n tokens of a sequence (prompt and
/// output so far) are searched for earlier in the same sequence, longest n first
/// (max_n down to min_n), most recent match first; the up to k tokens that followed the
/// match are the proposal. Empty when nothing matches. Proposals are one-hot (q = 1 for
/// the guessed token), which SpeculativeVerify handles. O(len * (max_n - min_n + 1)).
std::vector<int32_t> ProposeNgram(absl::Span<const int32_t> tokens, int32_t min_n,
                                  int32_t max_n, int32_t k);

}  // namespace loom::worker
