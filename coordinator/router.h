#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/block_hash.h"
#include "coordinator/kv_index.h"

namespace loom::coordinator {

enum class RoutingPolicy {
  kPrefix,      // prefix-cache-aware (the default)
  kRoundRobin,  // baselines for the benchmark
  kLeastLoaded,
};

/// "prefix", "round-robin" or "least-loaded"; InvalidArgument naming the value otherwise.
absl::StatusOr<RoutingPolicy> ParseRoutingPolicy(std::string_view name);
std::string_view RoutingPolicyName(RoutingPolicy policy);

struct RouterOptions {
  RoutingPolicy policy = RoutingPolicy::kPrefix;
  // Score = prompt tokens not cached on the replica + load_weight x its load (tokens
  // queued and running). 1 would count a token held by another request as costly as a
  // token to prefill; less favors cache hits. Chosen by the routing simulation
  // (tests/coordinator/router_test.cc prints the sweep; docs/ARCHITECTURE.md has numbers).
  double load_weight = 0.5;
  // Hot-spot guard: when the replica the score picks holds more than this many tokens of
  // load above the least-loaded healthy replica, the least-loaded one gets the request.
  int64_t balance_threshold_tokens = 4096;
};

/// One healthy replica the router may choose, as the cluster sees it at placement time.
struct RouteCandidate {
  std::string replica_id;
  int64_t load_tokens = 0;  // prompt and generated tokens of its requests in flight
};

/// What one placement decided, best candidate first.
struct RouteDecision {
  std::vector<size_t> order;           // indices into the candidates, best first
  std::vector<int64_t> cached_tokens;  // [candidates]: prompt tokens cached there (index view)
  bool balanced_by_load = false;       // the hot-spot guard overrode the prefix score
};

/// Request placement across replicas: prefix-cache-aware (scores each candidate by the
/// prefill it would do, from the cluster's KvIndex, plus its load), round-robin or
/// least-loaded. Thread-safe (the round-robin cursor is atomic; the index locks itself).
class Router {
 public:
  /// `index` must outlive the router.
  Router(RouterOptions options, const KvIndex& index);

  /// Ranks `candidates` for a prompt of `prompt_tokens` tokens whose full blocks of
  /// `block_size` tokens have `prompt_block_hashes`. The order is the fallback order too
  /// (a replica that refuses the request passes it to the next).
  RouteDecision Route(absl::Span<const engine::BlockHash> prompt_block_hashes,
                      int64_t prompt_tokens, int32_t block_size,
                      absl::Span<const RouteCandidate> candidates);

  const RouterOptions& options() const { return options_; }

 private:
  const RouterOptions options_;
  const KvIndex& index_;
  std::atomic<uint64_t> next_round_robin_{0};
};

}  // namespace loom::coordinator
