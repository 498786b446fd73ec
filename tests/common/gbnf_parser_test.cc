#include "common/grammar/gbnf_parser.h"

#include "gtest/gtest.h"
#include "tests/common/grammar_test_util.h"

namespace loom::common {
namespace {

using testing::Accepts;

constexpr char kArithmetic[] = R"gbnf(
# a comment line
root   ::= expr
expr   ::= term (("+" | "-") term)*
term   ::= factor ("*" factor)*   # trailing comment
factor ::= [0-9]+ | "(" expr ")"
)gbnf";

TEST(GbnfParserTest, GroupsNestedBeyondTheLimitAreRefused) {
  const auto nested = [](int depth) {
    return "root ::= " + std::string(depth, '(') + "\"a\"" + std::string(depth, ')') + "\n";
  };
  EXPECT_TRUE(Accepts({GrammarKind::kGbnf, nested(kMaxGrammarNesting)}, "a"));
  auto over = ParseGbnf(nested(kMaxGrammarNesting + 1));
  ASSERT_FALSE(over.ok());
  // Stacked repetition operators nested as deep before they were refused.
  auto stacked = ParseGbnf("root ::= \"a\"" + std::string(1'000'000, '*') + "\n");
  ASSERT_FALSE(stacked.ok());
  EXPECT_NE(stacked.status().message().find("cannot be stacked"), std::string::npos)
      << stacked.status();
  auto deep = ParseGbnf(nested(100'000));
  ASSERT_FALSE(deep.ok());
  EXPECT_NE(deep.status().message().find("groups nested deeper than 256"), std::string::npos)
      << deep.status();
}

TEST(GbnfParserTest, ParsesMultiLineRulesWithComments) {
  const GrammarSpec spec{GrammarKind::kGbnf, kArithmetic};
  EXPECT_TRUE(Accepts(spec, "1+2*(3-4)"));
  EXPECT_TRUE(Accepts(spec, "((7))"));
  EXPECT_FALSE(Accepts(spec, "1+"));
  EXPECT_FALSE(Accepts(spec, "(1"));
}

TEST(GbnfParserTest, AlternativesContinueOnTheNextLine) {
  const GrammarSpec spec{GrammarKind::kGbnf, "root ::= \"yes\"\n  | \"no\"\n  | \"maybe\" \" so\"\n"};
  EXPECT_TRUE(Accepts(spec, "yes"));
  EXPECT_TRUE(Accepts(spec, "maybe so"));
  EXPECT_FALSE(Accepts(spec, "maybe"));
}

TEST(GbnfParserTest, EscapesInLiteralsAndClasses) {
  const GrammarSpec spec{GrammarKind::kGbnf, R"(root ::= "\"q\"\n" [\x41-\x43\]] "\u00e9")"};
  EXPECT_TRUE(Accepts(spec, "\"q\"\nB\xC3\xA9"));
  EXPECT_TRUE(Accepts(spec, "\"q\"\n]\xC3\xA9"));
  EXPECT_FALSE(Accepts(spec, "\"q\"\nD\xC3\xA9"));
}

TEST(GbnfParserTest, SyntaxErrorsNameTheLine) {
  for (const char* bad : {"root ::= \"unterminated\n", "root ::= [a-\n", "root = \"a\"",
                          "root ::= (\"a\"", "root ::= \"a\"{3,1}", "root ::= \"a\" @"}) {
    auto d = ParseGbnf(bad);
    ASSERT_FALSE(d.ok()) << bad;
    EXPECT_NE(d.status().message().find("line"), std::string::npos) << d.status();
  }
}

TEST(GbnfParserTest, RejectsDuplicateRules) {
  EXPECT_FALSE(ParseGbnf("root ::= \"a\"\nroot ::= \"b\"\n").ok());
}

}  // namespace
}  // namespace loom::common
