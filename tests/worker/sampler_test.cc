#include "worker/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace loom::worker {
namespace {

std::vector<int32_t> SampleMany(const SamplingParams& params, const std::vector<float>& logits,
                                int n) {
  SequenceSampler sampler(params, {}, static_cast<int64_t>(logits.size()));
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) out.push_back(sampler.Sample(logits.data()).token_id);
  return out;
}

TEST(SamplerTest, GreedyPicksArgmaxAndLowestIdOnTies) {
  SamplingParams params;
  params.temperature = 0.0f;
  EXPECT_EQ(SampleMany(params, {0.1f, 2.0f, -1.0f, 2.0f}, 1)[0], 1);
  EXPECT_EQ(SampleMany(params, {-5.0f, -3.0f, -4.0f}, 1)[0], 1);
}

TEST(SamplerTest, LogitBiasShiftsAndForbidsTokens) {
  SamplingParams params;
  params.temperature = 0.0f;
  const std::vector<float> logits = {0.1f, 2.0f, -1.0f, 1.5f};
  params.logit_bias = {{1, -100.0f}};
  EXPECT_EQ(SampleMany(params, logits, 1)[0], 3);
  params.logit_bias = {{2, 3.5f}};
  EXPECT_EQ(SampleMany(params, logits, 1)[0], 2);
  // Sampled too: a -100 bias leaves the token out of every draw.
  params.temperature = 1.0f;
  params.logit_bias = {{1, -100.0f}, {3, -100.0f}};
  for (int32_t token : SampleMany(params, logits, 200)) EXPECT_TRUE(token == 0 || token == 2);
  SequenceSampler sampler(params, {}, 4);
  EXPECT_TRUE(sampler.adjusts_logits());
}

TEST(SamplerTest, MinTokensSuppressesEndTokensUntilReached) {
  SamplingParams params;
  params.temperature = 0.0f;
  params.min_tokens = 3;
  params.min_tokens_suppressed_ids = {1};  // the greedy choice: an end-of-generation token
  const std::vector<float> logits = {0.1f, 2.0f, -1.0f, 1.5f};
  SequenceSampler sampler(params, {}, 4);
  EXPECT_TRUE(sampler.adjusts_logits());
  EXPECT_EQ(sampler.Sample(logits.data()).token_id, 3);
  sampler.RecordOutput(3);  // recorded outputs count too (a resumed sequence)
  EXPECT_EQ(sampler.Sample(logits.data()).token_id, 3);
  EXPECT_FALSE(sampler.adjusts_logits());
  EXPECT_EQ(sampler.Sample(logits.data()).token_id, 1);
  // Distribution counts pending drafts as outputs.
  SequenceSampler fresh(params, {}, 4);
  std::vector<float> probs(4);
  fresh.Distribution(logits.data(), {}, probs.data());
  EXPECT_EQ(probs[1], 0.0f);
  const int32_t pending[] = {3, 3, 3};
  fresh.Distribution(logits.data(), pending, probs.data());
  EXPECT_EQ(probs[1], 1.0f);
}

TEST(SamplerTest, ValidationRejectsBadBiasAndMinTokens) {
  SamplingParams params;
  params.logit_bias = {{4, 1.0f}};
  EXPECT_FALSE(ValidateSamplingParams(params, 4).ok());
  params.logit_bias = {{0, 100.5f}};
  EXPECT_FALSE(ValidateSamplingParams(params, 4).ok());
  params.logit_bias = {{0, -100.0f}};
  EXPECT_TRUE(ValidateSamplingParams(params, 4).ok());
  params.min_tokens = -1;
  EXPECT_FALSE(ValidateSamplingParams(params, 4).ok());
  params.min_tokens = 2;
  params.min_tokens_suppressed_ids = {7};
  EXPECT_FALSE(ValidateSamplingParams(params, 4).ok());
}

TEST(SamplerTest, SameSeedGivesSameTokensDifferentSeedsDiffer) {
  std::vector<float> logits(100);
  for (int i = 0; i < 100; ++i) logits[i] = std::sin(i * 0.37f);
  SamplingParams params;
  params.temperature = 1.0f;
  params.seed = 42;
  const auto a = SampleMany(params, logits, 64);
  EXPECT_EQ(a, SampleMany(params, logits, 64));
  params.seed = 43;
  EXPECT_NE(a, SampleMany(params, logits, 64));
}

TEST(SamplerTest, FrequenciesFollowTheSoftmax) {
  const std::vector<float> logits{std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  SamplingParams params;
  params.temperature = 1.0f;  // sampled (the default is greedy)
  params.seed = 7;
  const auto samples = SampleMany(params, logits, 20000);
  std::vector<int> counts(3);
  for (int32_t id : samples) counts[id]++;
  EXPECT_NEAR(counts[0] / 20000.0, 0.5, 0.02);
  EXPECT_NEAR(counts[1] / 20000.0, 0.3, 0.02);
  EXPECT_NEAR(counts[2] / 20000.0, 0.2, 0.02);
}

TEST(SamplerTest, TemperatureSharpensTheDistribution) {
  const std::vector<float> logits{std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  SamplingParams params;
  params.seed = 3;
  params.temperature = 0.25f;  // p ∝ p^4: 0.5^4 / (0.5^4 + 0.3^4 + 0.2^4) = 0.861
  const auto samples = SampleMany(params, logits, 20000);
  int first = 0;
  for (int32_t id : samples) first += id == 0;
  EXPECT_NEAR(first / 20000.0, 0.861, 0.02);
}

TEST(SamplerTest, TopKTopPAndMinPTruncate) {
  const std::vector<float> logits{std::log(0.4f), std::log(0.3f), std::log(0.2f), std::log(0.1f)};
  SamplingParams params;
  params.temperature = 1.0f;  // sampled (the default is greedy)
  params.seed = 11;
  params.top_k = 2;
  for (int32_t id : SampleMany(params, logits, 2000)) EXPECT_LT(id, 2);
  params.top_k = 0;
  params.top_p = 0.65f;  // 0.4 + 0.3 reaches it: tokens 0 and 1 only
  for (int32_t id : SampleMany(params, logits, 2000)) EXPECT_LT(id, 2);
  params.top_p = 1.0f;
  params.min_p = 0.6f;  // keeps p >= 0.24: tokens 0 and 1
  for (int32_t id : SampleMany(params, logits, 2000)) EXPECT_LT(id, 2);
  params.min_p = 0.0f;
  params.top_p = 0.3f;
  for (int32_t id : SampleMany(params, logits, 500)) EXPECT_EQ(id, 0);
}

// A vocabulary-sized case: the nucleus (thousands of tokens) outgrows the first sorted
// prefix, and the logits are shuffled so id order says nothing about rank.
TEST(SamplerTest, LargeNucleusKeepsExactlyTheTopMassInShuffledVocabulary) {
  constexpr int64_t kVocab = 20000;
  std::vector<int32_t> rank(kVocab);
  for (int32_t i = 0; i < kVocab; ++i) rank[i] = i;
  std::shuffle(rank.begin(), rank.end(), std::mt19937(5));
  std::vector<float> logits(kVocab);
  for (int64_t i = 0; i < kVocab; ++i) logits[i] = -0.0005f * rank[i];
  SamplingParams params;
  params.temperature = 1.0f;  // sampled (the default is greedy)
  params.seed = 3;
  params.top_p = 0.5f;
  // The reference cut: the fewest top-ranked tokens whose softmax mass reaches 0.5.
  std::vector<double> by_rank(kVocab);
  double total = 0;
  for (int64_t i = 0; i < kVocab; ++i) total += by_rank[rank[i]] = std::exp(logits[i] - logits[0] + 0.0005 * rank[0]);
  double mass = 0;
  int64_t cut = 0;
  while (mass < 0.5 * total) mass += by_rank[cut++];
  ASSERT_GT(cut, 1000);
  int32_t worst_rank = 0;
  std::vector<int> hits(2, 0);
  for (int32_t id : SampleMany(params, logits, 2000)) {
    ASSERT_LT(rank[id], cut) << "token of rank " << rank[id] << " is outside the nucleus";
    worst_rank = std::max(worst_rank, rank[id]);
    hits[rank[id] < cut / 2]++;
  }
  EXPECT_GT(worst_rank, cut * 9 / 10);  // the whole nucleus is reachable
  // Mass of the nucleus' better half against its worse half.
  double better = 0;
  for (int64_t r = 0; r < cut / 2; ++r) better += by_rank[r];
  EXPECT_NEAR(hits[1] / 2000.0, better / mass, 0.04);

  params.top_p = 1.0f;
  params.top_k = 300;
  params.min_p = 0.9f;  // p >= 0.9 p_max: rank < ln(1/0.9) / 0.0005 = 210.7
  for (int32_t id : SampleMany(params, logits, 2000)) ASSERT_LE(rank[id], 210);
}

TEST(SamplerTest, PenaltiesDiscourageRepeats) {
  const std::vector<float> logits{1.0f, 0.9f, 0.8f};
  SamplingParams params;
  params.temperature = 0.0f;
  params.frequency_penalty = 0.25f;
  // Greedy with a frequency penalty cycles instead of repeating token 0 forever.
  const auto tokens = SampleMany(params, logits, 3);
  EXPECT_EQ(tokens, (std::vector<int32_t>{0, 1, 2}));

  SamplingParams repetition;
  repetition.temperature = 0.0f;
  repetition.repetition_penalty = 2.0f;  // 1.0 / 2 < 0.9: the prompt's token 0 loses
  SequenceSampler sampler(repetition, std::vector<int32_t>{0}, 3);
  EXPECT_EQ(sampler.Sample(logits.data()).token_id, 1);
}

TEST(SamplerTest, LogprobsAreTheRawLogSoftmax) {
  const std::vector<float> logits{2.0f, 1.0f, 0.0f, -1.0f};
  SamplingParams params;
  params.temperature = 0.0f;
  params.num_logprobs = 2;
  params.frequency_penalty = 1.0f;  // penalties change the choice, not the logprobs
  SequenceSampler sampler(params, {}, 4);
  const SampledToken token = sampler.Sample(logits.data());
  double z = 0;
  for (float l : logits) z += std::exp(l);
  EXPECT_EQ(token.token_id, 0);
  EXPECT_NEAR(token.logprob, 2.0 - std::log(z), 1e-5);
  ASSERT_EQ(token.top_logprobs.size(), 2u);
  EXPECT_EQ(token.top_logprobs[0].token_id, 0);
  EXPECT_EQ(token.top_logprobs[1].token_id, 1);
  EXPECT_NEAR(token.top_logprobs[1].logprob, 1.0 - std::log(z), 1e-5);
}

// Distribution is what Sample draws from: the same filters, temperature and penalties.
TEST(SamplerTest, DistributionIsWhatSampleDrawsFrom) {
  std::vector<float> logits(12);
  for (int i = 0; i < 12; ++i) logits[i] = std::sin(1.7f * i) * 2.0f;
  SamplingParams params;
  params.seed = 21;
  params.temperature = 0.8f;
  params.top_k = 9;
  params.top_p = 0.9f;
  params.min_p = 0.02f;
  params.frequency_penalty = 0.7f;
  params.presence_penalty = 0.3f;
  params.repetition_penalty = 1.3f;
  const std::vector<int32_t> prompt = {2, 5};
  const std::vector<int32_t> outputs = {5, 7, 7};
  SequenceSampler sampler(params, prompt, 12);
  for (int32_t token : outputs) sampler.RecordOutput(token);
  std::vector<float> probs(12);
  sampler.Distribution(logits.data(), {}, probs.data());
  double total = 0;
  int nonzero = 0;
  for (float p : probs) {
    total += p;
    nonzero += p > 0;
  }
  EXPECT_NEAR(total, 1.0, 1e-6);
  EXPECT_LE(nonzero, 9);
  EXPECT_GE(nonzero, 2);
  // 40000 samples from copies of the sampler (each one step on, so its penalties match).
  constexpr int kSamples = 40000;
  std::vector<int> counts(12, 0);
  for (int i = 0; i < kSamples; ++i) {
    SamplingParams seeded = params;
    seeded.seed = 1000 + i;
    SequenceSampler copy(seeded, prompt, 12);
    for (int32_t token : outputs) copy.RecordOutput(token);
    counts[copy.Sample(logits.data()).token_id]++;
  }
  for (int v = 0; v < 12; ++v) {
    EXPECT_NEAR(counts[v] / static_cast<double>(kSamples), probs[v], 0.01) << "token " << v;
    if (probs[v] == 0.0f) {
      EXPECT_EQ(counts[v], 0) << "token " << v;
    }
  }
}

TEST(SamplerTest, PendingTokensPenalizeAsIfRecorded) {
  std::vector<float> logits(10);
  for (int i = 0; i < 10; ++i) logits[i] = std::cos(0.9f * i);
  SamplingParams params;
  params.temperature = 1.0f;
  params.frequency_penalty = 0.1f;  // inexact: the rounding must be plain decoding's
  params.presence_penalty = 0.4f;
  params.repetition_penalty = 1.5f;
  const std::vector<int32_t> prompt = {1};
  const std::vector<int32_t> pending = {3, 1, 3, 8};
  SequenceSampler recorded(params, prompt, 10);
  recorded.RecordOutput(8);
  for (int32_t token : pending) recorded.RecordOutput(token);
  SequenceSampler speculating(params, prompt, 10);
  speculating.RecordOutput(8);
  std::vector<float> expected(10), got(10);
  recorded.Distribution(logits.data(), {}, expected.data());
  speculating.Distribution(logits.data(), pending, got.data());
  for (int v = 0; v < 10; ++v) EXPECT_EQ(got[v], expected[v]) << "token " << v;
  // Nothing was recorded: without pending tokens it is the one-output distribution.
  SequenceSampler one_output(params, prompt, 10);
  one_output.RecordOutput(8);
  one_output.Distribution(logits.data(), {}, expected.data());
  speculating.Distribution(logits.data(), {}, got.data());
  for (int v = 0; v < 10; ++v) EXPECT_EQ(got[v], expected[v]) << "token " << v;
}

// The device sampler's entries with pending drafts are the entries once they are recorded
// (as sets: the order of listing may differ).
TEST(SamplerTest, PenaltyEntriesWithPendingTokensAreThoseOnceRecorded) {
  const std::vector<int32_t> prompt = {1, 2};
  const std::vector<int32_t> pending = {3, 1, 3, 8};
  auto entries = [](const SequenceSampler& sampler, absl::Span<const int32_t> pending) {
    std::vector<int32_t> tokens, counts;
    sampler.PenaltyEntries(tokens, counts, pending);
    std::vector<std::pair<int32_t, int32_t>> listed;
    for (size_t i = 0; i < tokens.size(); ++i) listed.emplace_back(tokens[i], counts[i]);
    std::sort(listed.begin(), listed.end());
    return listed;
  };
  for (const bool repetition : {true, false}) {
    SamplingParams params;
    params.repetition_penalty = repetition ? 1.3f : 1.0f;
    params.frequency_penalty = repetition ? 0.0f : 0.5f;
    SequenceSampler recorded(params, prompt, 10);
    SequenceSampler speculating(params, prompt, 10);
    recorded.RecordOutput(8);
    speculating.RecordOutput(8);
    for (int32_t token : pending) recorded.RecordOutput(token);
    EXPECT_EQ(entries(speculating, pending), entries(recorded, {})) << repetition;
  }
  // Without penalties nothing is listed, pending or not.
  SequenceSampler plain(SamplingParams(), prompt, 10);
  EXPECT_TRUE(entries(plain, pending).empty());
}

TEST(SamplerTest, GreedyDistributionIsOneHotAtThePenalizedArgmax) {
  const std::vector<float> logits{1.0f, 0.9f, 0.8f};
  SamplingParams params;
  params.temperature = 0.0f;
  params.frequency_penalty = 0.25f;
  SequenceSampler sampler(params, {}, 3);
  EXPECT_TRUE(sampler.greedy());
  std::vector<float> probs(3);
  sampler.Distribution(logits.data(), std::vector<int32_t>{0}, probs.data());
  EXPECT_EQ(probs, (std::vector<float>{0.0f, 1.0f, 0.0f}));
}

TEST(SamplerTest, PositionUniformIsAFunctionOfSeedPositionAndStream) {
  SamplingParams params;
  params.seed = 5;
  SequenceSampler a(params, {}, 4);
  SequenceSampler b(params, {}, 4);
  const std::vector<float> logits{0.1f, 0.2f, 0.3f, 0.4f};
  b.Sample(logits.data());  // the RNG plays no part
  EXPECT_EQ(a.PositionUniform(17, 2), b.PositionUniform(17, 2));
  EXPECT_NE(a.PositionUniform(17, 2), a.PositionUniform(18, 2));
  EXPECT_NE(a.PositionUniform(17, 2), a.PositionUniform(17, 3));
  params.seed = 6;
  EXPECT_NE(a.PositionUniform(17, 2), SequenceSampler(params, {}, 4).PositionUniform(17, 2));
  // Uniform on [0, 1): the mean and the deciles of 100000 positions.
  std::vector<int> deciles(10, 0);
  double sum = 0;
  for (int64_t position = 0; position < 100000; ++position) {
    const double u = a.PositionUniform(position, 1);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
    deciles[static_cast<int>(u * 10)]++;
  }
  EXPECT_NEAR(sum / 100000, 0.5, 0.005);
  for (int d = 0; d < 10; ++d) EXPECT_NEAR(deciles[d], 10000, 500) << "decile " << d;
}

TEST(SamplerTest, ValidationNamesTheBadParameter) {
  SamplingParams params;
  params.temperature = -1.0f;
  EXPECT_NE(ValidateSamplingParams(params, 10).message().find("temperature"), std::string::npos);
  params.temperature = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(ValidateSamplingParams(params, 10).ok());
  params = SamplingParams();
  params.top_p = 0.0f;
  EXPECT_NE(ValidateSamplingParams(params, 10).message().find("top_p"), std::string::npos);
  params = SamplingParams();
  params.min_p = 1.5f;
  EXPECT_FALSE(ValidateSamplingParams(params, 10).ok());
  params = SamplingParams();
  params.num_logprobs = 21;
  EXPECT_FALSE(ValidateSamplingParams(params, 100).ok());
  EXPECT_TRUE(ValidateSamplingParams(SamplingParams(), 10).ok());
}

}  // namespace
}  // namespace loom::worker
