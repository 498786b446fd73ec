#include "model/tensor_parallel.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/gguf_file.h"
#include "common/tokenizer.h"
#include "gloo/rendezvous/hash_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/tokenizer_test_util.h"
#include "tests/worker/runner_test_util.h"
#include "worker/cpu_forward_pass.h"
#include "worker/gloo_communicator.h"

namespace loom::worker {
namespace {

using ::testing::HasSubstr;

common::ModelConfig SmolLm2Shape() {
  common::ModelConfig config;
  config.num_heads = 9;
  config.num_kv_heads = 3;
  config.head_dim = 64;
  config.intermediate_size = 1536;
  config.vocab_size = 49152;
  return config;
}

TEST(PlanShardsTest, SplitsHeadsFfnAndVocabulary) {
  const common::ModelConfig config = SmolLm2Shape();
  for (int rank = 0; rank < 3; ++rank) {
    absl::StatusOr<model::ShardPlan> plan = model::PlanShards(config, rank, 3);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->num_heads, 3);
    EXPECT_EQ(plan->head0, 3 * rank);
    EXPECT_EQ(plan->num_kv_heads, 1);  // 3 KV heads over 3 ranks: split
    EXPECT_EQ(plan->kv_head0, rank);
    EXPECT_EQ(plan->ffn, 512);
    EXPECT_EQ(plan->vocab, 16384);
    EXPECT_EQ(plan->vocab0, 16384 * rank);
  }
}

TEST(PlanShardsTest, ReplicatesKvHeadsWhenRanksOutnumberThem) {
  // 9 ranks, 3 KV heads: ranks 0-2 read KV head 0 (query heads 0-2), 3-5 head 1, 6-8 head 2.
  common::ModelConfig config = SmolLm2Shape();
  config.intermediate_size = 1152;  // 9 x 128 (SmolLM2's 1536 does not split 9 ways)
  for (int rank = 0; rank < 9; ++rank) {
    absl::StatusOr<model::ShardPlan> plan = model::PlanShards(config, rank, 9);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->num_heads, 1);
    EXPECT_EQ(plan->num_kv_heads, 1);
    EXPECT_EQ(plan->kv_head0, rank / 3);
    EXPECT_EQ(plan->head0 / (9 / 3), plan->kv_head0);  // its query head's KV head
  }
}

TEST(PlanShardsTest, UnevenVocabularyIsPaddedToAStride) {
  common::ModelConfig config = SmolLm2Shape();
  config.num_heads = 8;
  config.num_kv_heads = 2;
  config.vocab_size = 10;
  std::vector<int64_t> sizes;
  for (int rank = 0; rank < 4; ++rank) {
    absl::StatusOr<model::ShardPlan> plan = model::PlanShards(config, rank, 4);
    ASSERT_TRUE(plan.ok());
    EXPECT_EQ(plan->vocab_stride, 3);
    sizes.push_back(plan->vocab);
  }
  EXPECT_EQ(sizes, (std::vector<int64_t>{3, 3, 3, 1}));
}

TEST(PlanShardsTest, UnevenHeadsShareTheKvHeadBetweenThem) {
  // 9 query heads over 2 ranks: 5 + 4. Query heads 3-5 read KV head 1, so both hold it.
  absl::StatusOr<model::ShardPlan> first = model::PlanShards(SmolLm2Shape(), 0, 2);
  absl::StatusOr<model::ShardPlan> second = model::PlanShards(SmolLm2Shape(), 1, 2);
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(first->head0, 0);
  EXPECT_EQ(first->num_heads, 5);
  EXPECT_EQ(first->kv_head0, 0);
  EXPECT_EQ(first->num_kv_heads, 2);
  EXPECT_EQ(second->head0, 5);
  EXPECT_EQ(second->num_heads, 4);
  EXPECT_EQ(second->kv_head0, 1);
  EXPECT_EQ(second->num_kv_heads, 2);
}

TEST(PlanShardsTest, RefusesWhatDoesNotFitWithAClearMessage) {
  EXPECT_THAT(model::PlanShards(SmolLm2Shape(), 0, 10).status().message(),
              HasSubstr("more than the model's 9 attention heads"));
  common::ModelConfig config = SmolLm2Shape();
  config.num_heads = 12;
  config.num_kv_heads = 3;
  config.intermediate_size = 1000;
  EXPECT_THAT(model::PlanShards(config, 0, 3).status().message(), HasSubstr("1000 FFN channels"));
  EXPECT_EQ(model::PlanShards(config, 3, 3).status().code(), absl::StatusCode::kInvalidArgument);
}

// The default model split over `size` ranks (threads joined by gloo) against the whole
// model, each through the serving engine (test_util::GreedyThroughEngine): the same
// log-probabilities (prompt tokens and generated ones) within float tolerance and the same
// greedy tokens.
class TensorParallelRunnerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string path = common::testing::ModelPath();
    auto gguf = common::GgufFile::Open(path);
    ASSERT_TRUE(gguf.ok()) << gguf.status();
    gguf_ = gguf->release();
    tokenizer_ = common::Tokenizer::FromGguf(*gguf_).value().release();
  }

  static common::GgufFile* gguf_;
  static common::Tokenizer* tokenizer_;
};

common::GgufFile* TensorParallelRunnerTest::gguf_ = nullptr;
common::Tokenizer* TensorParallelRunnerTest::tokenizer_ = nullptr;

class TensorParallelRanksTest
    : public TensorParallelRunnerTest,
      public testing::WithParamInterface<std::tuple<int, kernels::cpu::ActivationPrecision>> {};

TEST_P(TensorParallelRanksTest, MatchesOneRank) {
  const std::vector<int32_t> prompt =
      tokenizer_->Encode("The capital of France is", /*add_special=*/true, /*parse_special=*/true);
  constexpr int kSteps = 8;
  CpuForwardPassOptions options;
  options.num_threads = 1;
  options.num_kv_blocks = 8;
  options.kv_dtype = kernels::cpu::KvDtype::kF32;
  options.activations = std::get<1>(GetParam());
  const bool int8 = options.activations == kernels::cpu::ActivationPrecision::kInt8;
  auto whole = CpuForwardPass::Create(*gguf_, options);
  ASSERT_TRUE(whole.ok()) << whole.status();
  absl::StatusOr<test_util::EngineTrace> want =
      test_util::GreedyThroughEngine(*std::move(whole), *tokenizer_, prompt, kSteps);
  ASSERT_TRUE(want.ok()) << want.status();

  const int kRanks = std::get<0>(GetParam());
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  std::vector<absl::StatusOr<test_util::EngineTrace>> got(kRanks);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kRanks; ++rank) {
    threads.emplace_back([&, rank] {
      auto communicator = GlooCommunicator::Connect(store, rank, kRanks, {});
      if (!communicator.ok()) {
        got[rank] = communicator.status();
        return;
      }
      CpuForwardPassOptions shard = options;
      shard.tp_rank = rank;
      shard.tp_size = kRanks;
      shard.communicator = communicator->get();
      auto runner = CpuForwardPass::Create(*gguf_, shard);
      if (!runner.ok()) {
        got[rank] = runner.status();
        return;
      }
      EXPECT_EQ((*runner)->weights().shard.num_heads, kRanks == 3 ? 3 : 5 - rank);
      got[rank] = test_util::GreedyThroughEngine(*std::move(runner), *tokenizer_, prompt, kSteps);
    });
  }
  for (std::thread& thread : threads) thread.join();
  // The prompt tokens' log-probabilities, then the first generated token's.
  const size_t first_output = prompt.size();
  for (int rank = 0; rank < kRanks; ++rank) {
    ASSERT_TRUE(got[rank].ok()) << "rank " << rank << ": " << got[rank].status();
    ASSERT_EQ(got[rank]->logprobs.size(), want->logprobs.size());
    // int8: later greedy tokens may differ, so only the prompt's and the first output's
    // log-probabilities compare like for like.
    const size_t compared = int8 ? first_output : want->logprobs.size();
    double max_diff = 0.0, sum_diff = 0.0;
    for (size_t i = 0; i < compared; ++i) {
      const double diff = std::abs(got[rank]->logprobs[i] - want->logprobs[i]);
      max_diff = std::max(max_diff, diff);
      sum_diff += diff;
    }
    if (!int8) {
      // Partial sums added in another order: float rounding only (the logits' 1e-3 of
      // their ~25 largest magnitude, twice: a log-probability is a logit minus a log-sum).
      EXPECT_EQ(got[rank]->tokens, want->tokens) << "rank " << rank;
      EXPECT_LT(max_diff, 0.05) << "rank " << rank;
    } else {
      // The same rounding differences move some int8 activations by a quantization step,
      // each worth up to ~1 logit (model_runner_test.py's bounds against the reference):
      // the prefill's decisive first token must agree, later greedy tokens may drift.
      EXPECT_EQ(got[rank]->tokens[0], want->tokens[0]) << "rank " << rank;
      EXPECT_LT(max_diff, 3.0) << "rank " << rank;
      EXPECT_LT(sum_diff / static_cast<double>(compared), 0.5) << "rank " << rank;
    }
  }
}

// 2 ranks split 9 heads 5 + 4 (KV head 1 on both); 3 ranks 3 + 3 + 3.
INSTANTIATE_TEST_SUITE_P(
    Ranks, TensorParallelRanksTest,
    testing::Combine(testing::Values(2, 3),
                     testing::Values(kernels::cpu::ActivationPrecision::kF32,
                                     kernels::cpu::ActivationPrecision::kInt8)),
    [](const testing::TestParamInfo<TensorParallelRanksTest::ParamType>& info) {
      return absl::StrCat(std::get<0>(info.param), "ranks_",
                          kernels::cpu::ActivationPrecisionName(std::get<1>(info.param)));
    });

}  // namespace
}  // namespace loom::worker
