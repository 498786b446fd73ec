#include "cli/bench_workload.h"

#include "gtest/gtest.h"

namespace loom::cli {
namespace {

TEST(BenchWorkloadTest, RandomLengthsStayInRangeAndAreReproducible) {
  WorkloadOptions options;
  options.num_requests = 50;
  options.input_len = 100;
  options.output_len = 20;
  options.range_ratio = 0.5;
  auto first = MakeWorkload(options, 1000, 256);
  auto second = MakeWorkload(options, 1000, 256);
  ASSERT_TRUE(first.ok());
  ASSERT_EQ(first->size(), 50u);
  for (size_t i = 0; i < first->size(); ++i) {
    const BenchTurn& turn = (*first)[i].turns.at(0);
    EXPECT_GE(turn.new_tokens.size(), 50u);
    EXPECT_LE(turn.new_tokens.size(), 150u);
    EXPECT_GE(turn.max_tokens, 10);
    EXPECT_LE(turn.max_tokens, 30);
    for (int32_t id : turn.new_tokens) ASSERT_TRUE(id >= 256 && id < 1000);
    EXPECT_EQ(turn.new_tokens, (*second)[i].turns.at(0).new_tokens);
  }
}

TEST(BenchWorkloadTest, SharedPrefixesAndMultiTurnSessions) {
  WorkloadOptions options;
  options.dataset = "shared-prefix";
  options.num_requests = 8;
  options.num_prefixes = 2;
  options.prefix_len = 32;
  auto shared = MakeWorkload(options, 1000, 256);
  ASSERT_TRUE(shared.ok());
  EXPECT_EQ((*shared)[0].prefix, (*shared)[2].prefix);
  EXPECT_NE((*shared)[0].prefix, (*shared)[1].prefix);
  EXPECT_EQ((*shared)[0].prefix.size(), 32u);

  options.dataset = "multi-turn";
  options.num_requests = 10;
  options.turns = 4;
  auto sessions = MakeWorkload(options, 1000, 256);
  ASSERT_TRUE(sessions.ok());
  EXPECT_EQ(sessions->size(), 3u);  // ceil(10 / 4)
  EXPECT_EQ((*sessions)[0].turns.size(), 4u);

  options.dataset = "sharegpt";
  EXPECT_EQ(MakeWorkload(options, 1000, 256).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace loom::cli
