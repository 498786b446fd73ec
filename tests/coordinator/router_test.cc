#include "coordinator/router.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/block_hash.h"
#include "engine/block_manager.h"
#include "coordinator/kv_index.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::coordinator {
namespace {

using ::testing::ElementsAre;

std::vector<int32_t> Tokens(int32_t first, int32_t count) {
  std::vector<int32_t> tokens(static_cast<size_t>(count));
  for (int32_t i = 0; i < count; ++i) tokens[static_cast<size_t>(i)] = first + i;
  return tokens;
}

std::vector<engine::KvCacheEvent> Stored(const std::vector<engine::BlockHash>& hashes) {
  std::vector<engine::KvCacheEvent> events;
  for (const engine::BlockHash& hash : hashes)
    events.push_back({engine::KvCacheEvent::Kind::kStored, hash});
  return events;
}

TEST(RouterTest, ParsesPolicyNames) {
  EXPECT_EQ(*ParseRoutingPolicy("prefix"), RoutingPolicy::kPrefix);
  EXPECT_EQ(*ParseRoutingPolicy("round-robin"), RoutingPolicy::kRoundRobin);
  EXPECT_EQ(*ParseRoutingPolicy("least-loaded"), RoutingPolicy::kLeastLoaded);
  EXPECT_FALSE(ParseRoutingPolicy("random").ok());
  EXPECT_EQ(RoutingPolicyName(RoutingPolicy::kRoundRobin), "round-robin");
}

TEST(RouterTest, PrefersTheReplicaHoldingThePromptsPrefix) {
  KvIndex index;
  const engine::BlockHash seed = engine::PrefixHashSeed("m", "");
  const std::vector<engine::BlockHash> prompt =
      engine::HashFullBlocks(seed, Tokens(0, 100), 16);  // 6 blocks
  index.Apply("b", Stored(prompt));
  index.Apply("c", Stored({prompt[0], prompt[1]}));
  Router router(RouterOptions{}, index);
  const std::vector<RouteCandidate> candidates = {{"a", 0}, {"b", 100}, {"c", 0}};
  const RouteDecision decision = router.Route(prompt, 100, 16, candidates);
  EXPECT_THAT(decision.order, ElementsAre(1, 2, 0));
  EXPECT_THAT(decision.cached_tokens, ElementsAre(0, 96, 32));
  EXPECT_FALSE(decision.balanced_by_load);
}

TEST(RouterTest, NeverCountsTheBlockOfTheLastPromptToken) {
  KvIndex index;
  const std::vector<engine::BlockHash> prompt = engine::HashFullBlocks(
      engine::PrefixHashSeed("m", ""), Tokens(0, 32), 16);  // exactly 2 blocks
  index.Apply("a", Stored(prompt));
  Router router(RouterOptions{}, index);
  const RouteDecision decision =
      router.Route(prompt, 32, 16, std::vector<RouteCandidate>{{"a", 0}});
  EXPECT_THAT(decision.cached_tokens, ElementsAre(16));
}

TEST(RouterTest, LoadWinsWhenTheCachedReplicaIsTooBusy) {
  KvIndex index;
  const std::vector<engine::BlockHash> prompt =
      engine::HashFullBlocks(engine::PrefixHashSeed("m", ""), Tokens(0, 1024), 16);
  index.Apply("hot", Stored(prompt));
  RouterOptions options;
  options.load_weight = 0.01;  // the prefix score alone would always pick "hot"
  options.balance_threshold_tokens = 1000;
  Router router(options, index);
  EXPECT_THAT(
      router.Route(prompt, 1024, 16, std::vector<RouteCandidate>{{"hot", 900}, {"cold", 0}}).order,
      ElementsAre(0, 1));
  const RouteDecision decision =
      router.Route(prompt, 1024, 16, std::vector<RouteCandidate>{{"hot", 1500}, {"cold", 0}});
  EXPECT_THAT(decision.order, ElementsAre(1, 0));
  EXPECT_TRUE(decision.balanced_by_load);
}

TEST(RouterTest, RoundRobinAndLeastLoadedIgnoreTheCache) {
  KvIndex index;
  const std::vector<engine::BlockHash> prompt =
      engine::HashFullBlocks(engine::PrefixHashSeed("m", ""), Tokens(0, 64), 16);
  index.Apply("a", Stored(prompt));
  const std::vector<RouteCandidate> candidates = {{"a", 50}, {"b", 10}, {"c", 30}};
  RouterOptions least;
  least.policy = RoutingPolicy::kLeastLoaded;
  Router least_loaded(least, index);
  EXPECT_THAT(least_loaded.Route(prompt, 64, 16, candidates).order, ElementsAre(1, 2, 0));
  RouterOptions rr;
  rr.policy = RoutingPolicy::kRoundRobin;
  Router round_robin(rr, index);
  std::vector<size_t> firsts;
  for (int i = 0; i < 6; ++i)
    firsts.push_back(round_robin.Route(prompt, 64, 16, candidates).order[0]);
  EXPECT_THAT(firsts, ElementsAre(0, 1, 2, 0, 1, 2));
}

// ---------------------------------------------------------------------------------------
// A routing simulation: replicas with real block managers (prefix caching as the
// scheduler does it: match, take, register, free tail first) publishing to a real
// KvIndex, fed a stream of requests that share system prompts, each replica working
// through its queue at a fixed token rate per tick. The oracle hit count is, for each
// request, the longest cached prefix on any replica at the moment it is placed.

struct SimResult {
  double hit_rate = 0;         // prompt tokens served from cache / prompt tokens
  double oracle_hit_rate = 0;  // best cached prefix anywhere at placement / prompt tokens
  double max_share = 0;        // busiest replica's requests / fair share
  int64_t ticks = 0;           // until every request finished (lower: more throughput)
};

struct SimOptions {
  RouterOptions router;
  std::vector<int> prompt_weights = {1, 1, 1, 1, 1, 1, 1, 1};  // 8 system prompts
  int users_per_prompt_unit = 60;
  int32_t system_tokens = 512;
  int32_t user_tokens = 40;
  int32_t output_tokens = 32;
  int64_t blocks_per_replica = 200;
  int64_t tokens_per_tick = 400;
  int arrivals_per_tick = 4;
  uint32_t seed = 1;
};

SimResult Simulate(const SimOptions& sim) {
  constexpr int kReplicas = 4;
  constexpr int32_t kBlockSize = 16;
  struct Job {
    std::vector<int32_t> blocks;
    int64_t remaining = 0;  // tokens of work left
    int64_t tokens = 0;     // prompt + outputs (the load it adds)
  };
  struct SimReplica {
    std::string id;
    std::unique_ptr<engine::BlockManager> blocks;
    std::deque<Job> jobs;
    int64_t load_tokens = 0;
    int64_t requests = 0;
  };
  std::vector<SimReplica> replicas(kReplicas);
  KvIndex index;
  for (int r = 0; r < kReplicas; ++r) {
    replicas[r].id = "r" + std::to_string(r);
    replicas[r].blocks = std::make_unique<engine::BlockManager>(sim.blocks_per_replica, kBlockSize);
    replicas[r].blocks->set_record_events(true);
  }
  Router router(sim.router, index);
  const engine::BlockHash seed = engine::PrefixHashSeed("model", "");

  // The request stream: prompt p appears weight[p] x users_per_prompt_unit times, shuffled.
  std::mt19937 rng(sim.seed);
  std::vector<int> stream;
  for (size_t p = 0; p < sim.prompt_weights.size(); ++p) {
    for (int u = 0; u < sim.prompt_weights[p] * sim.users_per_prompt_unit; ++u) {
      stream.push_back(static_cast<int>(p));
    }
  }
  std::shuffle(stream.begin(), stream.end(), rng);

  int64_t prompt_total = 0, hit_total = 0, oracle_total = 0;
  size_t next = 0;
  int32_t next_user_token = 1000000;
  SimResult result;
  while (next < stream.size() || std::any_of(replicas.begin(), replicas.end(),
                                             [](const SimReplica& r) { return !r.jobs.empty(); })) {
    ++result.ticks;
    for (int a = 0; a < sim.arrivals_per_tick && next < stream.size(); ++a, ++next) {
      std::vector<int32_t> prompt = Tokens(stream[next] * 100000, sim.system_tokens);
      const std::vector<int32_t> user = Tokens(next_user_token, sim.user_tokens);
      next_user_token += sim.user_tokens;
      prompt.insert(prompt.end(), user.begin(), user.end());
      const std::vector<engine::BlockHash> hashes =
          engine::HashFullBlocks(seed, prompt, kBlockSize);
      const int64_t max_blocks = (static_cast<int64_t>(prompt.size()) - 1) / kBlockSize;
      const std::vector<engine::BlockHash> matchable(hashes.begin(), hashes.begin() + max_blocks);

      std::vector<RouteCandidate> candidates;
      int64_t oracle = 0;
      for (const SimReplica& replica : replicas) {
        candidates.push_back({replica.id, replica.load_tokens});
        oracle = std::max(
            oracle, replica.blocks->MatchPrefix(matchable, prompt, "").num_blocks * kBlockSize);
      }
      const RouteDecision decision =
          router.Route(hashes, static_cast<int64_t>(prompt.size()), kBlockSize, candidates);
      SimReplica& chosen = replicas[decision.order[0]];
      engine::BlockManager& manager = *chosen.blocks;
      const engine::BlockManager::PrefixMatch match = manager.MatchPrefix(matchable, prompt, "");
      const int64_t total_blocks =
          (static_cast<int64_t>(prompt.size()) + sim.output_tokens + kBlockSize - 1) / kBlockSize;
      Job job;
      const int64_t needed = total_blocks - match.num_blocks + match.num_free_blocks;
      int64_t cached_tokens = 0;
      if (needed <= manager.num_free()) {
        job.blocks = manager.TakeCachedPrefix(matchable, match.num_blocks);
        absl::StatusOr<std::vector<int32_t>> fresh =
            manager.Allocate(total_blocks - match.num_blocks);
        EXPECT_TRUE(fresh.ok());
        for (size_t i = 0; i < fresh->size(); ++i) {
          const size_t b = static_cast<size_t>(match.num_blocks) + i;
          // Registered with its tokens after the block before it in the job's table.
          if (b < hashes.size()) {
            manager.RegisterBlock((*fresh)[i], hashes[b],
                                  absl::MakeConstSpan(prompt).subspan(b * kBlockSize, kBlockSize),
                                  b == 0 ? engine::BlockManager::kNoParent : job.blocks.back(), "");
          }
          job.blocks.push_back((*fresh)[i]);
        }
        cached_tokens = match.num_blocks * kBlockSize;
      }  // else: no room; it runs without holding blocks (computes everything)
      job.remaining = static_cast<int64_t>(prompt.size()) - cached_tokens + sim.output_tokens;
      job.tokens = static_cast<int64_t>(prompt.size()) + sim.output_tokens;
      chosen.load_tokens += job.tokens;
      ++chosen.requests;
      chosen.jobs.push_back(std::move(job));
      index.Apply(chosen.id, manager.TakeEvents());
      prompt_total += static_cast<int64_t>(prompt.size());
      hit_total += cached_tokens;
      oracle_total += oracle;
    }
    for (SimReplica& replica : replicas) {
      int64_t budget = sim.tokens_per_tick;
      while (budget > 0 && !replica.jobs.empty()) {
        Job& job = replica.jobs.front();
        const int64_t done = std::min(budget, job.remaining);
        job.remaining -= done;
        budget -= done;
        if (job.remaining > 0) break;
        std::vector<int32_t> tail_first(job.blocks.rbegin(), job.blocks.rend());
        EXPECT_TRUE(replica.blocks->Free(tail_first).ok());
        replica.load_tokens -= job.tokens;
        replica.jobs.pop_front();
      }
      index.Apply(replica.id, replica.blocks->TakeEvents());
    }
  }
  result.hit_rate = static_cast<double>(hit_total) / static_cast<double>(prompt_total);
  result.oracle_hit_rate = static_cast<double>(oracle_total) / static_cast<double>(prompt_total);
  int64_t max_requests = 0;
  for (const SimReplica& replica : replicas)
    max_requests = std::max(max_requests, replica.requests);
  result.max_share =
      static_cast<double>(max_requests) / (static_cast<double>(stream.size()) / kReplicas);
  return result;
}

TEST(RouterSimulationTest, HitRateNearTheOracleWithoutHotSpots) {
  SimOptions sim;
  const SimResult prefix = Simulate(sim);
  std::printf("prefix: hit %.3f oracle %.3f max share %.2f ticks %lld\n", prefix.hit_rate,
              prefix.oracle_hit_rate, prefix.max_share, static_cast<long long>(prefix.ticks));
  EXPECT_GE(prefix.hit_rate, 0.9 * prefix.oracle_hit_rate);
  EXPECT_LE(prefix.max_share, 1.5);

  sim.router.policy = RoutingPolicy::kRoundRobin;
  const SimResult round_robin = Simulate(sim);
  sim.router.policy = RoutingPolicy::kLeastLoaded;
  const SimResult least_loaded = Simulate(sim);
  std::printf("round-robin: hit %.3f ticks %lld; least-loaded: hit %.3f ticks %lld\n",
              round_robin.hit_rate, static_cast<long long>(round_robin.ticks),
              least_loaded.hit_rate, static_cast<long long>(least_loaded.ticks));
  EXPECT_GT(prefix.hit_rate, round_robin.hit_rate);
  EXPECT_GT(prefix.hit_rate, least_loaded.hit_rate);
  EXPECT_LT(prefix.ticks, round_robin.ticks);
}

TEST(RouterSimulationTest, ASkewedPromptMixStillSpreadsTheLoad) {
  // One system prompt takes 8/20 of the traffic: more than 1.5x a replica's fair share,
  // so the guard must spread it (the prompt gets cached on a second replica).
  SimOptions sim;
  sim.prompt_weights = {8, 4, 2, 2, 1, 1, 1, 1};
  sim.users_per_prompt_unit = 25;
  const SimResult prefix = Simulate(sim);
  std::printf("skewed prefix: hit %.3f oracle %.3f max share %.2f ticks %lld\n", prefix.hit_rate,
              prefix.oracle_hit_rate, prefix.max_share, static_cast<long long>(prefix.ticks));
  EXPECT_GE(prefix.hit_rate, 0.9 * prefix.oracle_hit_rate);
  EXPECT_LE(prefix.max_share, 1.5);
}

TEST(RouterSimulationTest, SweepOfWeightsAndThresholds) {
  // Not an assertion of tuning, a record of it: how the defaults were chosen. Run with
  // --gtest_filter=*Sweep* to see the table.
  for (const std::vector<int>& weights :
       {std::vector<int>{1, 1, 1, 1, 1, 1, 1, 1}, std::vector<int>{8, 4, 2, 2, 1, 1, 1, 1}}) {
    for (double load_weight : {0.1, 0.25, 0.5, 1.0, 2.0}) {
      for (int64_t threshold : {1024, 4096, 16384}) {
        SimOptions sim;
        sim.prompt_weights = weights;
        sim.users_per_prompt_unit = weights[0] == 1 ? 60 : 25;
        sim.router.load_weight = load_weight;
        sim.router.balance_threshold_tokens = threshold;
        const SimResult r = Simulate(sim);
        std::printf("%s w=%.2f thr=%5lld: hit %.3f oracle %.3f share %.2f ticks %lld\n",
                    weights[0] == 1 ? "uniform" : "skewed ", load_weight,
                    static_cast<long long>(threshold), r.hit_rate, r.oracle_hit_rate, r.max_share,
                    static_cast<long long>(r.ticks));
        EXPECT_GT(r.ticks, 0);
      }
    }
  }
}

}  // namespace
}  // namespace loom::coordinator
