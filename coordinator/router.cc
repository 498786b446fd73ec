#include "coordinator/router.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "absl/types/span.h"

namespace loom::coordinator {

absl::StatusOr<RoutingPolicy> ParseRoutingPolicy(std::string_view name) {
  if (name == "prefix") return RoutingPolicy::kPrefix;
  if (name == "round-robin") return RoutingPolicy::kRoundRobin;
  if (name == "least-loaded") return RoutingPolicy::kLeastLoaded;
  return absl::InvalidArgumentError(
      absl::StrFormat("unknown routing policy '%s' (prefix, round-robin or least-loaded)", name));
}

std::string_view RoutingPolicyName(RoutingPolicy policy) {
  switch (policy) {
    case RoutingPolicy::kPrefix:
      return "prefix";
    case RoutingPolicy::kRoundRobin:
      return "round-robin";
    case RoutingPolicy::kLeastLoaded:
      return "least-loaded";
  }
  return "?";
}

Router::Router(RouterOptions options, const KvIndex& index) : options_(options), index_(index) {}

RouteDecision Router::Route(absl::Span<const engine::BlockHash> prompt_block_hashes,
                            int64_t prompt_tokens, int32_t block_size,
                            absl::Span<const RouteCandidate> candidates) {
  RouteDecision decision;
  const size_t n = candidates.size();
  decision.order.resize(n);
  std::iota(decision.order.begin(), decision.order.end(), size_t{0});
  decision.cached_tokens.assign(n, 0);
  if (n == 0) return decision;

  auto by_load = [&](size_t a, size_t b) {
    return candidates[a].load_tokens < candidates[b].load_tokens;
  };
  if (options_.policy == RoutingPolicy::kRoundRobin) {
    const size_t start = static_cast<size_t>(next_round_robin_.fetch_add(1) % n);
    std::rotate(decision.order.begin(), decision.order.begin() + static_cast<ptrdiff_t>(start),
                decision.order.end());
    return decision;
  }
  if (options_.policy == RoutingPolicy::kLeastLoaded) {
    std::stable_sort(decision.order.begin(), decision.order.end(), by_load);
    return decision;
  }

  std::vector<std::string> ids;
  ids.reserve(n);
  for (const RouteCandidate& candidate : candidates) ids.push_back(candidate.replica_id);
  const std::vector<int64_t> matched = index_.MatchPrefix(prompt_block_hashes, ids);
  // The replica never reuses the block holding the last prompt token (it is computed to
  // produce logits), so neither does the estimate.
  const int64_t max_cached_blocks = prompt_tokens > 0 ? (prompt_tokens - 1) / block_size : 0;
  std::vector<double> scores(n);
  int64_t min_load = candidates[0].load_tokens;
  for (size_t i = 0; i < n; ++i) {
    decision.cached_tokens[i] = std::min(matched[i], max_cached_blocks) * block_size;
    scores[i] = static_cast<double>(prompt_tokens - decision.cached_tokens[i]) +
                options_.load_weight * static_cast<double>(candidates[i].load_tokens);
    min_load = std::min(min_load, candidates[i].load_tokens);
  }
  // Lowest score first; among equals the less loaded, then the candidates' order.
  std::stable_sort(decision.order.begin(), decision.order.end(), [&](size_t a, size_t b) {
    if (scores[a] != scores[b]) return scores[a] < scores[b];
    return by_load(a, b);
  });
  // The hot-spot guard: a popular prefix must not pull every request onto one replica.
  if (candidates[decision.order[0]].load_tokens - min_load > options_.balance_threshold_tokens) {
    std::stable_sort(decision.order.begin(), decision.order.end(), by_load);
    decision.balanced_by_load = true;
  }
  return decision;
}

}  // namespace loom::coordinator
