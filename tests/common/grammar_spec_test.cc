#include "common/grammar/grammar_spec.h"

#include "gtest/gtest.h"

namespace loom::common {
namespace {

TEST(GrammarSpecTest, CacheCompilesARepeatedSpecOnce) {
  GrammarCache cache(2);
  const GrammarSpec a{GrammarKind::kJsonSchema, R"({"type":"integer"})"};
  auto first = cache.Get(a);
  ASSERT_TRUE(first.ok());
  auto second = cache.Get(a);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(first->get(), second->get());
  EXPECT_EQ(cache.misses(), 1);
  EXPECT_EQ(cache.hits(), 1);
  // Same text, other kind: another grammar.
  const GrammarSpec choice{GrammarKind::kChoice, R"(["a"])"};
  ASSERT_TRUE(cache.Get(choice).ok());
  auto regex = cache.Get({GrammarKind::kRegex, choice.text});
  ASSERT_TRUE(regex.ok());
  EXPECT_NE(regex->get(), cache.Get(choice)->get());
  EXPECT_EQ(cache.misses(), 3);
}

TEST(GrammarSpecTest, CacheDropsLeastRecentlyUsedAndNeverCachesFailures) {
  GrammarCache cache(1);
  ASSERT_TRUE(cache.Get({GrammarKind::kRegex, "a"}).ok());
  ASSERT_TRUE(cache.Get({GrammarKind::kRegex, "b"}).ok());
  ASSERT_TRUE(cache.Get({GrammarKind::kRegex, "a"}).ok());
  EXPECT_EQ(cache.misses(), 3);
  EXPECT_FALSE(cache.Get({GrammarKind::kRegex, "(a"}).ok());
  EXPECT_FALSE(cache.Get({GrammarKind::kRegex, "(a"}).ok());
  EXPECT_EQ(cache.misses(), 3);
}

TEST(GrammarSpecTest, AnEmptyRegexIsRefused) {
  const auto empty = CompileGrammarSpec({GrammarKind::kRegex, ""});
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(CompileGrammarSpec({GrammarKind::kRegex, "a?"}).ok());
}

TEST(GrammarSpecTest, ChoiceListMustBeStrings) {
  EXPECT_TRUE(CompileGrammarSpec({GrammarKind::kChoice, R"(["a","b"])"}).ok());
  EXPECT_FALSE(CompileGrammarSpec({GrammarKind::kChoice, R"(["a",1])"}).ok());
  EXPECT_FALSE(CompileGrammarSpec({GrammarKind::kChoice, "[]"}).ok());
  EXPECT_FALSE(CompileGrammarSpec({GrammarKind::kChoice, "a,b"}).ok());
}

TEST(GrammarSpecTest, KindNamesRoundTrip) {
  for (auto kind : {GrammarKind::kJsonSchema, GrammarKind::kJsonObject, GrammarKind::kRegex,
                    GrammarKind::kChoice, GrammarKind::kGbnf, GrammarKind::kToolCalls}) {
    auto parsed = ParseGrammarKind(GrammarKindName(kind));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, kind);
  }
  EXPECT_FALSE(ParseGrammarKind("xml").ok());
}

}  // namespace
}  // namespace loom::common
