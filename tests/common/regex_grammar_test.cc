#include "common/grammar/regex_grammar.h"

#include <string>

#include "gtest/gtest.h"
#include "tests/common/grammar_test_util.h"

namespace loom::common {
namespace {

using testing::Accepts;

GrammarSpec Regex(const char* pattern) { return {GrammarKind::kRegex, pattern}; }

TEST(RegexGrammarTest, MatchesWholeString) {
  EXPECT_TRUE(Accepts(Regex("ab+c"), "abbbc"));
  EXPECT_FALSE(Accepts(Regex("ab+c"), "xabbbc"));
  EXPECT_TRUE(Accepts(Regex("^\\d{3}-\\d{4}$"), "555-1234"));
  EXPECT_FALSE(Accepts(Regex("^\\d{3}-\\d{4}$"), "555-123"));
}

TEST(RegexGrammarTest, ClassesEscapesGroupsAndAlternation) {
  const auto spec = Regex("(?:[A-Z][a-z]*|\\w+\\.)\\s(cat|dog)s?[^x-z]");
  EXPECT_TRUE(Accepts(spec, "Hello cats!"));
  EXPECT_TRUE(Accepts(spec, "foo_1. dogA"));
  EXPECT_FALSE(Accepts(spec, "Hello catsy"));
  EXPECT_FALSE(Accepts(spec, "hello cat!"));
  EXPECT_TRUE(Accepts(Regex("a.c"), "a\xE2\x82\xAC" "c"));
  EXPECT_FALSE(Accepts(Regex("a.c"), "a\nc"));
  EXPECT_TRUE(Accepts(Regex("[\\d.\\-]{2,3}"), "1.-"));
  EXPECT_TRUE(Accepts(Regex("(?P<year>\\d{4})"), "2024"));
}

TEST(RegexGrammarTest, UnsupportedConstructsAreNamed) {
  const std::vector<std::pair<const char*, const char*>> cases = {{"(a)\\1", "backreference"},
                                                                  {"a(?=b)", "lookaround"},
                                                                  {"\\bword", "anchor"},
                                                                  {"a^b", "'^'"},
                                                                  {"(ab", "')'"},
                                                                  {"[ab", "']'"},
                                                                  {"a{5,2}", "n < m"},
                                                                  {"*a", "quantifier"},
                                                                  {"a**", "multiple repeat"},
                                                                  {"a{2}{3}", "multiple repeat"},
                                                                  {"(a)?*", "multiple repeat"}};
  for (const auto& [pattern, what] : cases) {
    auto e = RegexToExpr(pattern);
    ASSERT_FALSE(e.ok()) << pattern;
    EXPECT_NE(e.status().message().find(what), std::string::npos) << pattern << ": " << e.status();
  }
}

// Groups recurse in the parser and in the grammar built from them: nesting is bounded
// (100,000 levels crashed the coordinator).
TEST(RegexGrammarTest, GroupsNestedBeyondTheLimitAreRefused) {
  const auto nested = [](int depth) {
    return std::string(depth, '(') + "a" + std::string(depth, ')');
  };
  EXPECT_TRUE(Accepts(Regex(nested(kMaxGrammarNesting).c_str()), "a"));
  // Lazy and possessive suffixes are not a second repetition.
  EXPECT_TRUE(Accepts(Regex("a*?b+?c?+"), "aabc"));
  // A million stacked quantifiers nested as deep before "multiple repeat" existed.
  EXPECT_FALSE(RegexToExpr("a" + std::string(1'000'000, '*')).ok());
  for (const int depth : {kMaxGrammarNesting + 1, 100'000}) {
    auto e = RegexToExpr(nested(depth));
    ASSERT_FALSE(e.ok()) << depth;
    EXPECT_NE(e.status().message().find("groups nested deeper than 256"), std::string::npos)
        << e.status();
  }
}

TEST(RegexGrammarTest, JsonStringModeEscapesQuotesAndSearches) {
  RegexOptions options;
  options.json_string = true;
  options.search = true;
  auto e = RegexToExpr("a\"b", options);
  ASSERT_TRUE(e.ok());
  GrammarDefinition d;
  d.SetRule("root", *e);
  auto g = Grammar::Compile(d);
  ASSERT_TRUE(g.ok());
  GrammarAutomaton automaton(*g, nullptr);
  EXPECT_TRUE(automaton.IsAccepting(automaton.AdvanceBytes(automaton.Initial(), "xxa\\\"byy")));
  EXPECT_FALSE(automaton.IsAccepting(automaton.AdvanceBytes(automaton.Initial(), "a\"b")));
}

}  // namespace
}  // namespace loom::common
