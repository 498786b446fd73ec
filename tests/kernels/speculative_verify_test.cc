#include "kernels/cpu/speculative_verify.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace loom::kernels::cpu {
namespace {

std::vector<float> RandomDistribution(std::mt19937_64& rng, int64_t vocab, double sharpness) {
  std::exponential_distribution<double> draw(1.0);
  std::vector<double> w(vocab);
  double total = 0;
  for (double& x : w) total += (x = std::pow(draw(rng), sharpness));
  std::vector<float> p(vocab);
  for (int64_t v = 0; v < vocab; ++v) p[v] = static_cast<float>(w[v] / total);
  return p;
}

int32_t Sample(std::mt19937_64& rng, const std::vector<float>& p) {
  std::discrete_distribution<int32_t> draw(p.begin(), p.end());
  return draw(rng);
}

struct OneSequence {
  std::vector<float> target;   // [(k + 1) * vocab]
  std::vector<float> draft;    // [k * vocab]
  std::vector<int32_t> tokens; // [k]
};

// Runs one sequence; returns (accepted, next).
std::pair<int32_t, int32_t> Verify(const OneSequence& seq, int32_t k, int64_t vocab,
                                   const std::vector<float>& uniforms, bool greedy,
                                   bool one_hot,
                                   const std::vector<float>* sample_uniforms = nullptr) {
  const int32_t row_start[2] = {0, k + 1};
  const uint8_t greedy_flag = greedy ? 1 : 0;
  int32_t accepted = -1, next = -1;
  SpeculativeVerifyParams params;
  params.target_probs = seq.target.data();
  params.draft_probs = one_hot ? nullptr : seq.draft.data();
  params.draft_tokens = seq.tokens.data();
  params.uniforms = uniforms.data();
  params.sample_uniforms = sample_uniforms != nullptr ? sample_uniforms->data() : nullptr;
  params.row_start = row_start;
  params.greedy = &greedy_flag;
  params.num_seqs = 1;
  params.vocab = vocab;
  params.num_accepted = &accepted;
  params.next_token = &next;
  EXPECT_TRUE(SpeculativeVerify(params).ok());
  return {accepted, next};
}

TEST(SpeculativeVerifyTest, GreedyAcceptsWhileDraftsAreTheArgmax) {
  const int64_t vocab = 5;
  OneSequence seq;
  // Argmaxes 2, 4, 1, then the bonus row's 3.
  for (int32_t best : {2, 4, 1, 3}) {
    std::vector<float> row(vocab, 0.1f);
    row[best] = 0.6f;
    seq.target.insert(seq.target.end(), row.begin(), row.end());
  }
  const std::vector<float> uniforms(4, 0.5f);
  seq.tokens = {2, 4, 1};
  EXPECT_EQ(Verify(seq, 3, vocab, uniforms, true, true), std::make_pair(3, 3));  // all + bonus
  seq.tokens = {2, 0, 1};
  EXPECT_EQ(Verify(seq, 3, vocab, uniforms, true, true), std::make_pair(1, 4));
  seq.tokens = {0, 4, 1};
  EXPECT_EQ(Verify(seq, 3, vocab, uniforms, true, true), std::make_pair(0, 2));
}

// Losslessness: whatever q proposes, the first emitted token (the first draft if
// accepted, else the correction) is distributed as the target's p. 200k seeded trials;
// the bound is about 6 standard deviations of the worst bucket, and the seed is fixed.
void CheckFirstTokenFollowsTarget(bool one_hot, bool per_row_sample_uniforms = false) {
  std::mt19937_64 rng(one_hot ? 11 : 7);
  const int64_t vocab = 6;
  const int32_t k = 3;
  OneSequence seq;
  for (int32_t i = 0; i <= k; ++i) {
    std::vector<float> p = RandomDistribution(rng, vocab, 1.5);
    seq.target.insert(seq.target.end(), p.begin(), p.end());
  }
  std::vector<std::vector<float>> q;
  for (int32_t i = 0; i < k; ++i) {
    q.push_back(RandomDistribution(rng, vocab, 2.0));
    seq.draft.insert(seq.draft.end(), q.back().begin(), q.back().end());
  }
  constexpr int kTrials = 200000;
  std::vector<double> counts(vocab, 0.0);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  std::vector<float> uniforms(k + 1);
  std::vector<float> sample_uniforms(k + 1);
  int64_t accepted_total = 0;
  for (int trial = 0; trial < kTrials; ++trial) {
    seq.tokens.clear();
    for (int32_t i = 0; i < k; ++i) {
      // n-gram proposals are fixed guesses: token i; draft-model ones are samples of q.
      seq.tokens.push_back(one_hot ? i : Sample(rng, q[i]));
    }
    for (float& u : uniforms) u = uniform(rng);
    for (float& u : sample_uniforms) u = uniform(rng);
    const auto [accepted, next] = Verify(seq, k, vocab, uniforms, false, one_hot,
                                         per_row_sample_uniforms ? &sample_uniforms : nullptr);
    ASSERT_GE(next, 0);
    accepted_total += accepted;
    counts[accepted > 0 ? seq.tokens[0] : next] += 1.0;
  }
  for (int64_t v = 0; v < vocab; ++v) {
    EXPECT_NEAR(counts[v] / kTrials, seq.target[v], 0.006) << "token " << v;
  }
  EXPECT_GT(accepted_total, 0);
}

TEST(SpeculativeVerifyTest, SampledOutputIsDistributedAsTheTargetWithDraftProbabilities) {
  CheckFirstTokenFollowsTarget(/*one_hot=*/false);
}

TEST(SpeculativeVerifyTest, SampledOutputIsDistributedAsTheTargetWithOneHotDrafts) {
  CheckFirstTokenFollowsTarget(/*one_hot=*/true);
}

TEST(SpeculativeVerifyTest, SampledOutputIsDistributedAsTheTargetWithPerRowSampleUniforms) {
  CheckFirstTokenFollowsTarget(/*one_hot=*/false, /*per_row_sample_uniforms=*/true);
}

TEST(SpeculativeVerifyTest, PerRowSampleUniformDrawsTheTokenOfItsOwnRow) {
  // Draft 0 (token 1) is accepted (p = q), draft 1 (token 0) is rejected (p(0) = 0), so
  // row 1 ends the step: its residual max(0, p - q) = p on {2, 3}, split 0.5 / 0.5, is
  // drawn with sample_uniforms[1]; the other rows' sample uniforms play no part.
  const int64_t vocab = 4;
  OneSequence seq;
  seq.target = {0, 1, 0, 0,  0, 0, 0.5f, 0.5f,  0.25f, 0.25f, 0.25f, 0.25f};
  seq.draft = {0, 1, 0, 0,  1, 0, 0, 0};
  seq.tokens = {1, 0};
  const std::vector<float> uniforms = {0.5f, 0.5f, 0.5f};
  std::vector<float> sample_uniforms = {0.9f, 0.1f, 0.9f};
  EXPECT_EQ(Verify(seq, 2, vocab, uniforms, false, false, &sample_uniforms),
            std::make_pair(1, 2));
  sample_uniforms = {0.1f, 0.9f, 0.1f};
  EXPECT_EQ(Verify(seq, 2, vocab, uniforms, false, false, &sample_uniforms),
            std::make_pair(1, 3));
  // Without per-row uniforms the bonus row's u (0.5) draws it: the upper half, token 3.
  EXPECT_EQ(Verify(seq, 2, vocab, uniforms, false, false), std::make_pair(1, 3));
}

TEST(SpeculativeVerifyTest, RaggedBatchAndBadInput) {
  const int64_t vocab = 4;
  // Sequence 0: k = 2, both accepted (greedy); sequence 1: k = 0 (bonus only).
  std::vector<float> target = {0, 1, 0, 0,  0, 0, 1, 0,  0, 0, 0, 1,  1, 0, 0, 0};
  std::vector<int32_t> tokens = {1, 2};
  std::vector<float> uniforms(4, 0.3f);
  const int32_t row_start[3] = {0, 3, 4};
  const uint8_t greedy[2] = {1, 1};
  int32_t accepted[2], next[2];
  SpeculativeVerifyParams params;
  params.target_probs = target.data();
  params.draft_tokens = tokens.data();
  params.uniforms = uniforms.data();
  params.row_start = row_start;
  params.greedy = greedy;
  params.num_seqs = 2;
  params.vocab = vocab;
  params.num_accepted = accepted;
  params.next_token = next;
  ASSERT_TRUE(SpeculativeVerify(params).ok());
  EXPECT_EQ(accepted[0], 2);
  EXPECT_EQ(next[0], 3);
  EXPECT_EQ(accepted[1], 0);
  EXPECT_EQ(next[1], 0);
  tokens[1] = 9;
  EXPECT_EQ(SpeculativeVerify(params).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace loom::kernels::cpu
