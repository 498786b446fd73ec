#include "worker/ngram_proposer.h"

#include <vector>

#include "gtest/gtest.h"

namespace loom::worker {
namespace {

using Tokens = std::vector<int32_t>;

TEST(NgramProposerTest, ProposesWhatFollowedTheMostRecentLongestMatch) {
  // "... 1 2 3 | 7 8 9 ... 1 2 3": the trigram 1 2 3 was followed by 7 8 9.
  const Tokens tokens = {5, 1, 2, 3, 7, 8, 9, 4, 1, 2, 3};
  EXPECT_EQ(ProposeNgram(tokens, 1, 3, 3), (Tokens{7, 8, 9}));
  EXPECT_EQ(ProposeNgram(tokens, 1, 3, 2), (Tokens{7, 8}));
}

TEST(NgramProposerTest, PrefersLongerMatchesThenRecentOnes) {
  // Unigram 3 last seen before 6; bigram 2 3 only before 7.
  const Tokens tokens = {2, 3, 7, 0, 3, 6, 0, 2, 3};
  EXPECT_EQ(ProposeNgram(tokens, 1, 2, 1), (Tokens{7}));
  EXPECT_EQ(ProposeNgram(tokens, 1, 1, 1), (Tokens{6}));
}

TEST(NgramProposerTest, ProposalsStopAtTheEndAndMissesAreEmpty) {
  EXPECT_EQ(ProposeNgram(Tokens{4, 5, 4}, 1, 3, 5), (Tokens{5, 4}));
  EXPECT_TRUE(ProposeNgram(Tokens{1, 2, 3, 4}, 1, 3, 4).empty());
  EXPECT_TRUE(ProposeNgram(Tokens{1}, 1, 3, 4).empty());
  EXPECT_TRUE(ProposeNgram(Tokens{1, 1}, 1, 3, 0).empty());
  EXPECT_TRUE(ProposeNgram(Tokens{}, 1, 3, 4).empty());
}

}  // namespace
}  // namespace loom::worker
