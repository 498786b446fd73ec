#include "common/grammar/grammar.h"

#include <string>

#include "common/grammar/gbnf_parser.h"
#include "gtest/gtest.h"
#include "tests/common/grammar_test_util.h"

namespace loom::common {
namespace {

using testing::Accepts;

TEST(GrammarTest, RejectsUndefinedRuleNamingIt) {
  GrammarDefinition d;
  d.SetRule("root", SequenceExpr({LiteralExpr("a"), RuleRefExpr("missing")}));
  auto g = Grammar::Compile(d);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(g.status().message().find("missing"), std::string::npos) << g.status();
}

TEST(GrammarTest, RejectsLeftRecursionNamingTheRule) {
  auto d = ParseGbnf("root ::= expr\nexpr ::= expr \"+\" \"1\" | \"1\"\n");
  ASSERT_TRUE(d.ok()) << d.status();
  auto g = Grammar::Compile(*d);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("left-recursive"), std::string::npos) << g.status();
}

// The matcher enters rules without recursing: a 100,000-rule chain (r0 ::= r1, ...), which
// crashed a worker's stack, matches.
TEST(GrammarTest, DeepRuleNestingMatchesWithoutRecursion) {
  std::string chain = "root ::= r0\n";
  for (int i = 0; i + 1 < 100'000; ++i) {
    chain += "r" + std::to_string(i) + " ::= r" + std::to_string(i + 1) + "\n";
  }
  chain += "r99999 ::= \"a\"\n";
  EXPECT_TRUE(Accepts({GrammarKind::kGbnf, chain}, "a"));
  EXPECT_FALSE(Accepts({GrammarKind::kGbnf, chain}, "b"));
}

// Empty rules doubling (r1 ::= r0 r0, r2 ::= r1 r1, ...): 2^n return points, reached on
// many more paths; each (element, return) pair is visited once. Past the bound (n = 40)
// the grammar is refused by name rather than matched for hours.
TEST(GrammarTest, DoublingEmptyRulesMatchWithinTheBoundAndAreRefusedPastIt) {
  auto doubling_of = [](int n) {
    std::string doubling = "root ::= r" + std::to_string(n) + " \"x\"\nr0 ::= \"\"\n";
    for (int i = 1; i <= n; ++i) {
      doubling += "r" + std::to_string(i) + " ::= r" + std::to_string(i - 1) + " r" +
                  std::to_string(i - 1) + "\n";
    }
    return doubling;
  };
  EXPECT_TRUE(Accepts({GrammarKind::kGbnf, doubling_of(12)}, "x"));
  EXPECT_FALSE(Accepts({GrammarKind::kGbnf, doubling_of(12)}, "xx"));
  auto refused = GrammarCache().Get({GrammarKind::kGbnf, doubling_of(40)});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("too ambiguous"), std::string::npos)
      << refused.status();
}

// Nested optional repeats hold n * m parser stacks at once: past the matcher's bounds the
// grammar is refused by name when it is compiled for a request, not matched for minutes.
TEST(GrammarTest, GrammarsPastTheMatchersBoundsAreRefusedAtCompileTime) {
  GrammarCache cache;
  auto refused = cache.Get({GrammarKind::kRegex, "((y?){1000}){1000}x"});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("too ambiguous"), std::string::npos)
      << refused.status();
  // Within the bounds the same shape matches.
  auto small = cache.Get({GrammarKind::kRegex, "((y?){10}){10}x"});
  ASSERT_TRUE(small.ok()) << small.status();
  GrammarAutomaton automaton(*small, nullptr);
  EXPECT_TRUE(automaton.IsAccepting(automaton.AdvanceBytes(automaton.Initial(), "yyyyyx")));
  EXPECT_FALSE(automaton.overflowed());
}

TEST(GrammarTest, RejectsRepetitionOfSomethingThatMatchesNothing) {
  GrammarDefinition d;
  d.SetRule("root", RepeatExpr(RepeatExpr(LiteralExpr("a"), 0, 1), 0, -1));
  auto g = Grammar::Compile(d);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("empty string"), std::string::npos) << g.status();
}

TEST(GrammarTest, RejectsMissingRoot) {
  GrammarDefinition d;
  d.SetRule("start", LiteralExpr("a"));
  EXPECT_FALSE(Grammar::Compile(d).ok());
}

TEST(GrammarTest, CharacterClassesMatchWholeUtf8CodePoints) {
  const GrammarSpec spec{GrammarKind::kGbnf, "root ::= [a-zé-ü€😀]+"};
  EXPECT_TRUE(Accepts(spec, "aé€😀ü"));
  EXPECT_FALSE(Accepts(spec, "A"));
  EXPECT_FALSE(Accepts(spec, "\xC3"));        // a truncated é
  EXPECT_FALSE(Accepts(spec, "\xC3\xA8\xA9"));  // è then a stray continuation byte
  const GrammarSpec negated{GrammarKind::kGbnf, "root ::= [^a]+"};
  EXPECT_TRUE(Accepts(negated, "b€😀"));
  EXPECT_FALSE(Accepts(negated, "ba"));
  EXPECT_FALSE(Accepts(negated, "\xED\xA0\x80"));  // a surrogate is not UTF-8
}

TEST(GrammarTest, BoundedAndUnboundedRepetition) {
  const GrammarSpec spec{GrammarKind::kGbnf, "root ::= \"a\"{2,4} \"b\"* \"c\"{3}"};
  EXPECT_FALSE(Accepts(spec, "accc"));
  EXPECT_TRUE(Accepts(spec, "aaccc"));
  EXPECT_TRUE(Accepts(spec, "aaaabbbbbbccc"));
  EXPECT_FALSE(Accepts(spec, "aaaaaccc"));
  EXPECT_FALSE(Accepts(spec, "aacc"));
}

TEST(GrammarTest, RefusesOversizedExpansion) {
  GrammarDefinition d;
  d.SetRule("root", RepeatExpr(LiteralExpr("ab"), 3'000'000, 3'000'000));
  auto g = Grammar::Compile(d);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("too large"), std::string::npos) << g.status();
}

}  // namespace
}  // namespace loom::common
