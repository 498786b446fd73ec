#include "worker/draft_proposer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "tests/worker/device_sampling_pass.h"
#include "tests/worker/forward_pass_test_util.h"
#include "tests/worker/tiny_model.h"
#include "worker/cpu_forward_pass.h"
#include "worker/step_backend.h"

namespace loom::worker {
namespace {

using testing::TinyModel;
using testing::TinyModelSpec;

constexpr int64_t kNumBlocks = 16;
constexpr int64_t kBlockSize = 4;  // small: drafts cross block boundaries

std::unique_ptr<CpuForwardPass> NewForwardPass(const common::GgufFile& gguf,
                                               int64_t num_blocks = kNumBlocks) {
  return test_util::MakeCpuForwardPass(gguf, num_blocks, kBlockSize);
}

std::unique_ptr<DraftProposer> Proposer(const common::GgufFile& gguf) {
  std::unique_ptr<CpuForwardPass> forward_pass = NewForwardPass(gguf);
  const int64_t vocab = forward_pass->config().vocab_size;
  absl::StatusOr<std::unique_ptr<DraftProposer>> proposer =
      DraftProposer::Create(std::move(forward_pass), vocab, kNumBlocks, kBlockSize);
  EXPECT_TRUE(proposer.ok()) << proposer.status();
  return proposer.ok() ? *std::move(proposer) : nullptr;
}

// `count` greedy tokens after `prompt`, one plain step at a time on a fresh forward pass.
std::vector<int32_t> GreedyContinuation(const common::GgufFile& gguf, std::vector<int32_t> tokens,
                                        int count) {
  std::unique_ptr<CpuForwardPass> forward_pass = NewForwardPass(gguf);
  const std::vector<int32_t> blocks = {0, 1, 2, 3, 4, 5, 6, 7};
  const int64_t vocab = forward_pass->config().vocab_size;
  std::vector<int32_t> out;
  std::vector<float> logits;
  int64_t computed = 0;
  for (int i = 0; i < count; ++i) {
    StepBatch batch;
    EXPECT_TRUE(AppendSequence(
                    batch, absl::MakeConstSpan(tokens).subspan(computed, tokens.size() - computed),
                    static_cast<int32_t>(computed), blocks, kBlockSize, true)
                    .ok());
    EXPECT_TRUE(forward_pass->Step(batch, logits).ok());
    computed = static_cast<int64_t>(tokens.size());
    const int32_t best = static_cast<int32_t>(
        std::max_element(logits.begin(), logits.begin() + vocab) - logits.begin());
    out.push_back(best);
    tokens.push_back(best);
  }
  return out;
}

SamplingParams Greedy() {
  SamplingParams params;
  params.temperature = 0.0f;
  return params;
}

TEST(DraftProposerTest, GreedyDraftsAreTheDraftModelsGreedyContinuation) {
  TinyModelSpec spec;
  spec.seed = 3;
  std::unique_ptr<common::GgufFile> gguf = TinyModel(spec);
  std::unique_ptr<DraftProposer> proposer = Proposer(*gguf);
  const std::vector<int32_t> tokens = {1, 5, 9, 2, 7};
  SequenceSampler sampler(Greedy(), tokens, spec.vocab);
  const std::vector<int32_t> blocks = {3, 8, 1};  // 12 slots: 5 tokens and 4 drafts
  DraftRequest request{tokens, 0, blocks, 4, &sampler};
  std::vector<DraftProposal> proposals;
  ASSERT_TRUE(proposer->Propose({request}, proposals).ok());
  ASSERT_EQ(proposals.size(), 1u);
  EXPECT_EQ(proposals[0].tokens, GreedyContinuation(*gguf, tokens, 4));
  EXPECT_TRUE(proposals[0].probs.empty());  // one-hot drafts carry no q
}

TEST(DraftProposerTest, CatchingUpAfterAPartialAcceptanceMatchesAFreshStart) {
  TinyModelSpec spec;
  spec.seed = 4;
  std::unique_ptr<common::GgufFile> gguf = TinyModel(spec);
  std::unique_ptr<DraftProposer> proposer = Proposer(*gguf);
  std::vector<int32_t> tokens = {2, 4, 6, 8, 10, 12};
  SequenceSampler sampler(Greedy(), tokens, spec.vocab);
  const std::vector<int32_t> blocks = {5, 0, 9, 2};
  std::vector<DraftProposal> proposals;
  ASSERT_TRUE(proposer->Propose({DraftRequest{tokens, 0, blocks, 3, &sampler}}, proposals).ok());
  ASSERT_EQ(proposals[0].tokens.size(), 3u);
  // The target accepted the first draft and then picked a token other than the second.
  const int64_t known = static_cast<int64_t>(tokens.size());
  tokens.push_back(proposals[0].tokens[0]);
  tokens.push_back((proposals[0].tokens[1] + 1) % spec.vocab);
  const int64_t draft_computed = DraftProposer::NumDraftComputedAfter(known, 3, 1);
  EXPECT_EQ(draft_computed, known + 1);
  ASSERT_TRUE(
      proposer->Propose({DraftRequest{tokens, draft_computed, blocks, 3, &sampler}}, proposals)
          .ok());
  // A proposer that never saw the sequence computes it all and proposes the same.
  std::unique_ptr<DraftProposer> fresh = Proposer(*gguf);
  std::vector<DraftProposal> expected;
  ASSERT_TRUE(fresh->Propose({DraftRequest{tokens, 0, blocks, 3, &sampler}}, expected).ok());
  EXPECT_EQ(proposals[0].tokens, expected[0].tokens);
  EXPECT_EQ(proposals[0].tokens, GreedyContinuation(*gguf, tokens, 3));
  // All accepted: the last draft was never fed; catching up feeds it with the bonus token.
  EXPECT_EQ(DraftProposer::NumDraftComputedAfter(known, 3, 3), known + 2);
}

TEST(DraftProposerTest, SampledDraftsCarryTheDistributionTheyWereDrawnFrom) {
  TinyModelSpec spec;
  spec.seed = 5;
  std::unique_ptr<common::GgufFile> gguf = TinyModel(spec);
  std::unique_ptr<DraftProposer> proposer = Proposer(*gguf);
  const std::vector<int32_t> tokens = {3, 1, 4, 1, 5};
  SamplingParams params;
  params.temperature = 0.9f;
  params.top_k = 5;
  params.seed = 99;
  SequenceSampler sampler(params, tokens, spec.vocab);
  const std::vector<int32_t> blocks = {0, 1, 2};
  std::vector<DraftProposal> proposals;
  ASSERT_TRUE(proposer->Propose({DraftRequest{tokens, 0, blocks, 4, &sampler}}, proposals).ok());
  const DraftProposal& proposal = proposals[0];
  ASSERT_EQ(proposal.tokens.size(), 4u);
  ASSERT_EQ(proposal.probs.size(), 4u * spec.vocab);
  for (int j = 0; j < 4; ++j) {
    const float* q = proposal.probs.data() + j * spec.vocab;
    double total = 0;
    int kept = 0;
    for (int64_t v = 0; v < spec.vocab; ++v) {
      total += q[v];
      kept += q[v] > 0;
    }
    EXPECT_NEAR(total, 1.0, 1e-5) << "draft " << j;
    EXPECT_EQ(kept, 5) << "draft " << j;  // top_k
    EXPECT_GT(q[proposal.tokens[j]], 0.0f) << "draft " << j;
  }
  // The first q is the sampler's distribution over the draft model's logits.
  std::unique_ptr<CpuForwardPass> forward_pass = NewForwardPass(*gguf);
  StepBatch batch;
  ASSERT_TRUE(AppendSequence(batch, tokens, 0, blocks, kBlockSize, true).ok());
  std::vector<float> logits;
  ASSERT_TRUE(forward_pass->Step(batch, logits).ok());
  std::vector<float> q(spec.vocab);
  sampler.Distribution(logits.data(), {}, q.data());
  for (int64_t v = 0; v < spec.vocab; ++v) EXPECT_NEAR(proposal.probs[v], q[v], 1e-6);
  // Drawn with the sequence's position-keyed uniform: the same seed proposes the same.
  std::vector<DraftProposal> again;
  std::unique_ptr<DraftProposer> other = Proposer(*gguf);
  ASSERT_TRUE(other->Propose({DraftRequest{tokens, 0, blocks, 4, &sampler}}, again).ok());
  EXPECT_EQ(again[0].tokens, proposal.tokens);
}

TEST(DraftProposerTest, BatchedProposalsMatchOneAtATime) {
  TinyModelSpec spec;
  spec.seed = 6;
  std::unique_ptr<common::GgufFile> gguf = TinyModel(spec);
  const std::vector<int32_t> a = {1, 2, 3, 4, 5, 6, 7};
  const std::vector<int32_t> b = {9, 8};
  const std::vector<int32_t> blocks_a = {0, 1, 2};
  const std::vector<int32_t> blocks_b = {5, 6};
  SequenceSampler sampler_a(Greedy(), a, spec.vocab);
  SamplingParams sampled;
  sampled.temperature = 1.0f;
  sampled.seed = 3;
  SequenceSampler sampler_b(sampled, b, spec.vocab);
  std::unique_ptr<DraftProposer> batched = Proposer(*gguf);
  std::vector<DraftProposal> together;
  ASSERT_TRUE(batched
                  ->Propose({DraftRequest{a, 0, blocks_a, 2, &sampler_a},
                             DraftRequest{b, 0, blocks_b, 5, &sampler_b}},
                            together)
                  .ok());
  ASSERT_EQ(together.size(), 2u);
  EXPECT_EQ(together[0].tokens.size(), 2u);
  EXPECT_EQ(together[1].tokens.size(), 5u);
  std::unique_ptr<DraftProposer> single = Proposer(*gguf);
  std::vector<DraftProposal> alone;
  ASSERT_TRUE(single->Propose({DraftRequest{a, 0, blocks_a, 2, &sampler_a}}, alone).ok());
  EXPECT_EQ(alone[0].tokens, together[0].tokens);
  ASSERT_TRUE(single->Propose({DraftRequest{b, 0, blocks_b, 5, &sampler_b}}, alone).ok());
  EXPECT_EQ(alone[0].tokens, together[1].tokens);
  for (size_t i = 0; i < alone[0].probs.size(); ++i) {
    ASSERT_NEAR(alone[0].probs[i], together[1].probs[i], 1e-6);
  }
}

// A catch-up larger than a pass of the draft (the CUDA forward pass reserves activations for
// --max-num-batched-tokens) runs in passes that sample nothing first: the drafts are those
// of one pass.
TEST(DraftProposerTest, ACatchUpLargerThanAPassRunsInSeveralPasses) {
  TinyModelSpec spec;
  spec.seed = 8;
  std::unique_ptr<common::GgufFile> gguf = TinyModel(spec);
  const std::vector<int32_t> a = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  const std::vector<int32_t> b = {9, 8, 7, 6, 5, 4, 3};
  const std::vector<int32_t> blocks_a = {0, 1, 2, 3};
  const std::vector<int32_t> blocks_b = {5, 6, 7};
  SequenceSampler sampler_a(Greedy(), a, spec.vocab);
  SequenceSampler sampler_b(Greedy(), b, spec.vocab);
  const std::vector<DraftRequest> requests = {DraftRequest{a, 0, blocks_a, 3, &sampler_a},
                                              DraftRequest{b, 2, blocks_b, 3, &sampler_b}};
  std::vector<DraftProposal> whole, cut;
  ASSERT_TRUE(Proposer(*gguf)->Propose(requests, whole).ok());
  std::unique_ptr<CpuForwardPass> forward_pass = NewForwardPass(*gguf);
  auto counting = std::make_unique<test_util::DeviceSamplingPass>(std::move(forward_pass));
  test_util::DeviceSamplingPass* passes = counting.get();
  absl::StatusOr<std::unique_ptr<DraftProposer>> limited = DraftProposer::Create(
      std::move(counting), spec.vocab, kNumBlocks, kBlockSize, /*max_pass_tokens=*/4);
  ASSERT_TRUE(limited.ok()) << limited.status();
  ASSERT_TRUE((*limited)->Propose(requests, cut).ok());
  EXPECT_EQ(cut[0].tokens, whole[0].tokens);
  EXPECT_EQ(cut[1].tokens, whole[1].tokens);
  EXPECT_EQ(cut[0].tokens, GreedyContinuation(*gguf, a, 3));
  // 11 + 5 unseen tokens: passes of 4 (a), 4 (a), 2 + 2 (a, b) leave 1 + 3 to the sampling
  // pass; then two passes of one draft each.
  EXPECT_EQ(passes->host_steps, 3);
  EXPECT_EQ(passes->device_steps, 3);
  // A pass of one token: the catch-up stops when each request has one token left (more
  // requests than the pass holds), and the sampling pass takes them all.
  std::unique_ptr<CpuForwardPass> one_pass = NewForwardPass(*gguf);
  absl::StatusOr<std::unique_ptr<DraftProposer>> tiny = DraftProposer::Create(
      std::move(one_pass), spec.vocab, kNumBlocks, kBlockSize, /*max_pass_tokens=*/1);
  ASSERT_TRUE(tiny.ok()) << tiny.status();
  std::vector<DraftProposal> one_by_one;
  ASSERT_TRUE((*tiny)->Propose(requests, one_by_one).ok());
  EXPECT_EQ(one_by_one[0].tokens, whole[0].tokens);
  EXPECT_EQ(one_by_one[1].tokens, whole[1].tokens);
  EXPECT_EQ(DraftProposer::Create(NewForwardPass(*gguf), spec.vocab, kNumBlocks, kBlockSize, -1)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// On a draft forward pass that samples on its device, greedy drafts are picked there (with the
// drafts before them in their penalties) and only sampled requests' logits come back: the
// proposals are those of the host path.
TEST(DraftProposerTest, GreedyDraftsArePickedOnADeviceThatSamples) {
  TinyModelSpec spec;
  spec.seed = 9;
  std::unique_ptr<common::GgufFile> gguf = TinyModel(spec);
  const std::vector<int32_t> a = {1, 2, 3, 2, 1};
  const std::vector<int32_t> b = {4, 4, 5};
  const std::vector<int32_t> blocks_a = {0, 1, 2};
  const std::vector<int32_t> blocks_b = {5, 6};
  SamplingParams penalized = Greedy();
  penalized.repetition_penalty = 1.5f;
  SequenceSampler sampler_a(penalized, a, spec.vocab);
  SamplingParams sampled;
  sampled.temperature = 0.8f;
  sampled.seed = 11;
  SequenceSampler sampler_b(sampled, b, spec.vocab);
  const std::vector<int32_t> c = {7, 3};
  const std::vector<int32_t> blocks_c = {9};
  sampled.seed = 12;
  sampled.top_k = 4;
  SequenceSampler sampler_c(sampled, c, spec.vocab);
  // Two sampled requests: two host rows among the device rows.
  const std::vector<DraftRequest> requests = {DraftRequest{a, 0, blocks_a, 4, &sampler_a},
                                              DraftRequest{b, 0, blocks_b, 3, &sampler_b},
                                              DraftRequest{c, 0, blocks_c, 2, &sampler_c}};
  std::vector<DraftProposal> host, device;
  ASSERT_TRUE(Proposer(*gguf)->Propose(requests, host).ok());
  auto sampling = std::make_unique<test_util::DeviceSamplingPass>(NewForwardPass(*gguf));
  test_util::DeviceSamplingPass* pass = sampling.get();
  absl::StatusOr<std::unique_ptr<DraftProposer>> proposer =
      DraftProposer::Create(std::move(sampling), spec.vocab, kNumBlocks, kBlockSize);
  ASSERT_TRUE(proposer.ok()) << proposer.status();
  ASSERT_TRUE((*proposer)->Propose(requests, device).ok());
  EXPECT_EQ(device[0].tokens, host[0].tokens);
  EXPECT_TRUE(device[0].probs.empty());
  for (const size_t i : {1, 2}) {
    EXPECT_EQ(device[i].tokens, host[i].tokens) << i;
    ASSERT_EQ(device[i].probs.size(), host[i].probs.size());
    for (size_t v = 0; v < host[i].probs.size(); ++v) {
      ASSERT_EQ(device[i].probs[v], host[i].probs[v]) << i << " " << v;
    }
  }
  EXPECT_EQ(pass->host_steps, 0);
  EXPECT_EQ(pass->device_steps, 4);
  // The last pass: only request a (4 drafts) is in it, picked on the device, its three
  // drafts so far in its penalties beside the prompt's 3 distinct tokens.
  EXPECT_TRUE(pass->last_rows.logits_rows.empty());
  ASSERT_EQ(pass->last_rows.params.size(), 1u);
  EXPECT_EQ(pass->last_rows.positions[0], 5 + 3);
  std::vector<int32_t> expected_tokens, expected_counts;
  sampler_a.PenaltyEntries(expected_tokens, expected_counts,
                           absl::MakeConstSpan(device[0].tokens).first(3));
  EXPECT_EQ(pass->last_rows.penalty_tokens, expected_tokens);
  EXPECT_EQ(pass->last_rows.penalty_counts, expected_counts);
}

TEST(DraftProposerTest, DraftsStopAtTheDraftModelsContext) {
  TinyModelSpec spec;
  spec.seed = 7;
  spec.context = 8;
  std::unique_ptr<common::GgufFile> gguf = TinyModel(spec);
  std::unique_ptr<DraftProposer> proposer = Proposer(*gguf);
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6};
  SequenceSampler sampler(Greedy(), tokens, spec.vocab);
  const std::vector<int32_t> blocks = {0, 1, 2};
  std::vector<DraftProposal> proposals;
  ASSERT_TRUE(proposer->Propose({DraftRequest{tokens, 0, blocks, 5, &sampler}}, proposals).ok());
  EXPECT_EQ(proposals[0].tokens.size(), 3u);  // drafts read at most 8 tokens: 6 + 2 fed
}

TEST(DraftProposerTest, RejectsRequestsItCannotServe) {
  TinyModelSpec spec;
  std::unique_ptr<common::GgufFile> gguf = TinyModel(spec);
  std::unique_ptr<DraftProposer> proposer = Proposer(*gguf);
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5};
  SequenceSampler sampler(Greedy(), tokens, spec.vocab);
  const std::vector<int32_t> blocks = {0, 1};
  std::vector<DraftProposal> proposals;
  EXPECT_EQ(proposer->Propose({DraftRequest{tokens, 5, blocks, 2, &sampler}}, proposals).code(),
            absl::StatusCode::kInvalidArgument);  // nothing left to feed
  EXPECT_EQ(proposer->Propose({DraftRequest{tokens, 0, blocks, 2, nullptr}}, proposals).code(),
            absl::StatusCode::kInvalidArgument);
  // 8 slots: 5 tokens and 4 drafts fill them (the last draft is never fed); 5 do not.
  EXPECT_TRUE(proposer->Propose({DraftRequest{tokens, 0, blocks, 4, &sampler}}, proposals).ok());
  const absl::Status few =
      proposer->Propose({DraftRequest{tokens, 0, blocks, 5, &sampler}}, proposals);
  EXPECT_EQ(few.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(few.message().find("cannot hold"), std::string::npos) << few;
  EXPECT_TRUE(proposer->Propose({DraftRequest{tokens, 0, blocks, 0, &sampler}}, proposals).ok());
  EXPECT_TRUE(proposals[0].tokens.empty());
}

TEST(DraftProposerTest, CreateRefusesAnotherVocabularyOrPool) {
  TinyModelSpec spec;
  std::unique_ptr<common::GgufFile> gguf = TinyModel(spec);
  absl::StatusOr<std::unique_ptr<DraftProposer>> wrong_vocab =
      DraftProposer::Create(NewForwardPass(*gguf), spec.vocab + 1, kNumBlocks, kBlockSize);
  EXPECT_EQ(wrong_vocab.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wrong_vocab.status().message().find("vocabulary"), std::string::npos);
  absl::StatusOr<std::unique_ptr<DraftProposer>> wrong_pool = DraftProposer::Create(
      NewForwardPass(*gguf, kNumBlocks / 2), spec.vocab, kNumBlocks, kBlockSize);
  EXPECT_EQ(wrong_pool.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wrong_pool.status().message().find("block"), std::string::npos);
}

TEST(CheckSameVocabularyTest, NamesTheFirstDifference) {
  TinyModelSpec spec;
  std::unique_ptr<common::GgufFile> target = TinyModel(spec);
  TinyModelSpec other = spec;
  other.seed = 77;  // other weights, the same vocabulary
  other.layers = 1;
  EXPECT_TRUE(CheckSameVocabulary(*target, *TinyModel(other)).ok());
  other.vocab = spec.vocab + 8;
  absl::Status status = CheckSameVocabulary(*target, *TinyModel(other));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("32 tokens, the target's 24"), std::string::npos) << status;
  other = spec;
  other.token_prefix = "u";
  status = CheckSameVocabulary(*target, *TinyModel(other));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("token 0 is 'u0'"), std::string::npos) << status;
}

}  // namespace
}  // namespace loom::worker
