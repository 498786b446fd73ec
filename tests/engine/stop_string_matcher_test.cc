#include "engine/stop_string_matcher.h"

#include <string>

#include "gtest/gtest.h"

namespace loom::engine {
namespace {

// Feeds `pieces` one at a time; returns everything emitted and whether it stopped.
std::pair<std::string, bool> Feed(StopStringMatcher& matcher,
                                  const std::vector<std::string>& pieces) {
  std::string out;
  for (const std::string& piece : pieces) {
    StopStringMatcher::Emitted emitted = matcher.Append(piece);
    out += emitted.text;
    if (emitted.stopped) return {out, true};
  }
  return {out + matcher.Flush(), false};
}

TEST(StopStringMatcherTest, PassesTextThroughWithoutStopStrings) {
  StopStringMatcher matcher({});
  EXPECT_EQ(matcher.Append("Hello").text, "Hello");
  EXPECT_EQ(matcher.Append(", world").text, ", world");
}

TEST(StopStringMatcherTest, HoldsBackAPossibleStartOfAStopString) {
  StopStringMatcher matcher({"\n\nUser:"});
  EXPECT_EQ(matcher.Append("Answer.\n").text, "Answer.");
  EXPECT_EQ(matcher.Append("\nUs").text, "");
  // Not the stop string after all: the held text comes out.
  EXPECT_EQ(matcher.Append("ually").text, "\n\nUsually");
}

TEST(StopStringMatcherTest, StopsAtAStopStringSplitAcrossPiecesAndDropsIt) {
  StopStringMatcher matcher({"END"});
  auto [text, stopped] = Feed(matcher, {"abc E", "N", "D and more"});
  EXPECT_TRUE(stopped);
  EXPECT_EQ(text, "abc ");
  EXPECT_EQ(matcher.Append("later").text, "");
}

TEST(StopStringMatcherTest, EarliestMatchWinsAmongSeveralStopStrings) {
  StopStringMatcher matcher({"world", "lo"});
  auto [text, stopped] = Feed(matcher, {"hello world"});
  EXPECT_TRUE(stopped);
  EXPECT_EQ(text, "hel");
}

TEST(StopStringMatcherTest, FlushReleasesHeldTextWhenTheSequenceEndsOtherwise) {
  StopStringMatcher matcher({"###"});
  EXPECT_EQ(matcher.Append("done #").text, "done ");
  EXPECT_EQ(matcher.Flush(), "#");
}

TEST(StopStringMatcherTest, IgnoresEmptyStopStrings) {
  StopStringMatcher matcher({""});
  auto [text, stopped] = Feed(matcher, {"abc"});
  EXPECT_FALSE(stopped);
  EXPECT_EQ(text, "abc");
}

}  // namespace
}  // namespace loom::engine
