#include "cli/bench_workload.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "absl/strings/str_format.h"

namespace loom::cli {

absl::StatusOr<std::vector<BenchSession>> MakeWorkload(const WorkloadOptions& options,
                                                       int32_t vocab_size, int32_t first_token) {
  if (options.num_requests < 1 || options.input_len < 1 || options.output_len < 1 ||
      options.range_ratio < 0 || options.range_ratio >= 1 || options.turns < 1 ||
      options.num_prefixes < 1 || options.prefix_len < 0) {
    return absl::InvalidArgumentError("bench workload: sizes must be positive, range in [0, 1)");
  }
  if (first_token >= vocab_size) {
    return absl::InvalidArgumentError("bench workload: the vocabulary is too small");
  }
  std::mt19937_64 rng(options.seed);
  std::uniform_int_distribution<int32_t> token(first_token, vocab_size - 1);
  auto length = [&](int64_t mean) {
    const auto low = static_cast<int64_t>(std::floor(mean * (1 - options.range_ratio)));
    const auto high = static_cast<int64_t>(std::ceil(mean * (1 + options.range_ratio)));
    return std::max<int64_t>(1, std::uniform_int_distribution<int64_t>(low, high)(rng));
  };
  auto tokens = [&](int64_t n) {
    std::vector<int32_t> ids(n);
    for (int32_t& id : ids) id = token(rng);
    return ids;
  };

  std::vector<BenchSession> sessions;
  if (options.dataset == "random" || options.dataset == "shared-prefix") {
    std::vector<std::vector<int32_t>> prefixes;
    if (options.dataset == "shared-prefix") {
      for (int64_t p = 0; p < options.num_prefixes; ++p) prefixes.push_back(tokens(options.prefix_len));
    }
    for (int64_t r = 0; r < options.num_requests; ++r) {
      BenchSession session;
      if (!prefixes.empty()) session.prefix = prefixes[r % prefixes.size()];
      session.turns.push_back(
          {tokens(length(options.input_len)), static_cast<int32_t>(length(options.output_len))});
      sessions.push_back(std::move(session));
    }
  } else if (options.dataset == "multi-turn") {
    const int64_t num_sessions = (options.num_requests + options.turns - 1) / options.turns;
    for (int64_t s = 0; s < num_sessions; ++s) {
      BenchSession session;
      for (int64_t t = 0; t < options.turns; ++t) {
        session.turns.push_back(
            {tokens(length(options.input_len)), static_cast<int32_t>(length(options.output_len))});
      }
      sessions.push_back(std::move(session));
    }
  } else {
    return absl::InvalidArgumentError(absl::StrFormat(
        "bench workload: unknown dataset '%s' (random, shared-prefix, multi-turn)",
        options.dataset));
  }
  return sessions;
}

}  // namespace loom::cli
