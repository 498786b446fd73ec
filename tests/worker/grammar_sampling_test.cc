// SequenceSampler under a grammar (structured output): it only emits tokens the grammar
// allows, ends only where the text is complete, and a preempted sequence's outputs sent
// again put the grammar where it was.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "common/grammar/grammar_matcher_factory.h"
#include "worker/sampler.h"

namespace loom::worker {
namespace {

constexpr int32_t kEnd = 7;

// A toy vocabulary: pieces of "(ab)+;" and distractors; id 7 ends generation.
std::shared_ptr<const common::TokenTrie> Trie() {
  return std::make_shared<const common::TokenTrie>(
      std::vector<std::string>{"a", "b", "ab", "ba", ";", "x", "abab", "", "b;"}, std::vector<int32_t>{kEnd});
}

std::string Text(const std::vector<int32_t>& ids) {
  static const std::vector<std::string> pieces = {"a", "b", "ab", "ba", ";", "x", "abab", "", "b;"};
  std::string text;
  for (int32_t id : ids) text += pieces[id];
  return text;
}

TEST(GrammarSamplingTest, SampledTextAlwaysMatchesTheGrammar) {
  common::GrammarMatcherFactory factory(Trie());
  std::mt19937 rng(5);
  std::normal_distribution<float> noise(0.0f, 3.0f);
  int ended_count = 0;
  for (uint64_t seed = 0; seed < 50; ++seed) {
    SamplingParams params;
    params.temperature = 1.0f;
    params.seed = seed;
    SequenceSampler sampler(params, {}, 9);
    auto matcher = factory.NewMatcher({common::GrammarKind::kRegex, "(ab)+;"});
    ASSERT_TRUE(matcher.ok());
    sampler.SetGrammar(*std::move(matcher));
    ASSERT_TRUE(sampler.constrained());
    std::vector<int32_t> out;
    bool ended = false;
    for (int step = 0; step < 40 && !ended; ++step) {
      std::vector<float> logits(9);
      for (float& l : logits) l = noise(rng);
      logits[5] = 10.0f;  // the model "wants" a forbidden token
      const int32_t token = sampler.Sample(logits.data()).token_id;
      ended = token == kEnd;
      if (!ended) out.push_back(token);
    }
    const std::string text = Text(out);
    if (ended) {
      EXPECT_TRUE(std::regex_match(text, std::regex("(ab)+;"))) << text;
    } else {  // a prefix of a match
      EXPECT_TRUE(std::regex_match(text, std::regex("(ab)*a?|(ab)+;"))) << text;
    }
    ended_count += ended;
  }
  EXPECT_GT(ended_count, 10);
}

TEST(GrammarSamplingTest, EndsOnlyWhenComplete) {
  common::GrammarMatcherFactory factory(Trie());
  SamplingParams params;
  params.temperature = 0.0f;
  SequenceSampler sampler(params, {}, 9);
  sampler.SetGrammar(*factory.NewMatcher({common::GrammarKind::kRegex, "ab;"}));
  std::vector<float> logits(9, 0.0f);
  logits[kEnd] = 100.0f;  // the model wants to stop at once
  std::vector<int32_t> out;
  for (int step = 0; step < 5; ++step) {
    const int32_t token = sampler.Sample(logits.data()).token_id;
    out.push_back(token);
    if (token == kEnd) break;
  }
  ASSERT_EQ(out.back(), kEnd);
  out.pop_back();
  EXPECT_EQ(Text(out), "ab;");
}

TEST(GrammarSamplingTest, RecordedOutputsAdvanceTheGrammar) {
  common::GrammarMatcherFactory factory(Trie());
  SamplingParams params;
  params.temperature = 0.0f;
  SequenceSampler sampler(params, {}, 9);
  sampler.SetGrammar(*factory.NewMatcher({common::GrammarKind::kRegex, "abab;"}));
  sampler.RecordOutput(2);  // "ab" generated before a preemption
  std::vector<float> logits(9, 0.0f);
  logits[2] = 5.0f;  // "ab" fits once more
  logits[4] = 4.0f;
  EXPECT_EQ(sampler.Sample(logits.data()).token_id, 2);
  EXPECT_EQ(sampler.Sample(logits.data()).token_id, 4);  // only ";" (or "b;"... not here) fits
  EXPECT_EQ(sampler.Sample(logits.data()).token_id, kEnd);
}

// min_tokens suppresses the end token, but "ab;" is complete after three tokens and the
// grammar allows nothing else: the grammar wins (the end token, not a forbidden one).
TEST(GrammarSamplingTest, TheGrammarOutranksMinTokens) {
  common::GrammarMatcherFactory factory(Trie());
  for (float temperature : {0.0f, 1.0f}) {
    SamplingParams params;
    params.temperature = temperature;
    params.min_tokens = 10;
    params.min_tokens_suppressed_ids = {kEnd};
    SequenceSampler sampler(params, {}, 9);
    sampler.SetGrammar(*factory.NewMatcher({common::GrammarKind::kRegex, "ab;"}));
    std::vector<float> logits(9, 0.0f);
    logits[0] = 3.0f;  // the model prefers "a" (forbidden after the first token)
    std::vector<int32_t> out;
    for (int step = 0; step < 6; ++step) {
      const int32_t token = sampler.Sample(logits.data()).token_id;
      out.push_back(token);
      if (token == kEnd) break;
    }
    ASSERT_EQ(out.back(), kEnd) << "temperature " << temperature;
    out.pop_back();
    EXPECT_EQ(Text(out), "ab;") << "temperature " << temperature;
  }
}

// A grammar no token of the vocabulary can continue ("c": no piece holds it) is a dead
// end: the end token, reported as an error with the reason (not as a finished document).
TEST(GrammarSamplingTest, ADeadEndIsReportedWithTheToken) {
  common::GrammarMatcherFactory factory(Trie());
  SamplingParams params;
  params.temperature = 0.0f;
  SequenceSampler sampler(params, {}, 9);
  sampler.SetGrammar(*factory.NewMatcher({common::GrammarKind::kRegex, "c"}));
  std::vector<float> logits(9, 0.0f);
  const SampledToken token = sampler.Sample(logits.data());
  EXPECT_EQ(token.token_id, kEnd);
  EXPECT_NE(token.error.find("dead end"), std::string::npos) << token.error;
  // A sampler whose grammar goes on reports nothing.
  SequenceSampler fine(params, {}, 9);
  fine.SetGrammar(*factory.NewMatcher({common::GrammarKind::kRegex, "ab;"}));
  EXPECT_TRUE(fine.Sample(logits.data()).error.empty());
}

TEST(GrammarSamplingTest, UnconstrainedSamplerIsUnchanged) {
  SamplingParams params;
  params.temperature = 0.0f;
  SequenceSampler sampler(params, {}, 9);
  EXPECT_FALSE(sampler.constrained());
  std::vector<float> logits(9, 0.0f);
  logits[5] = 1.0f;
  EXPECT_EQ(sampler.Sample(logits.data()).token_id, 5);
}

}  // namespace
}  // namespace loom::worker
