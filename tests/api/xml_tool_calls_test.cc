#include "api/xml_tool_calls.h"

#include <string>

#include "gtest/gtest.h"

namespace loom::api {
namespace {

TEST(XmlToolCallsTest, ScansCallsArgumentsAndWhereTheyEnd) {
  const std::string text =
      "<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>1</arg_value>\n</tool_call>"
      "<tool_call>g\n<arg_key> b </arg_key><arg_value>x<y</arg_value><arg_key>c</arg_key>"
      "<arg_value>open";
  const XmlCalls scan = ScanXmlCalls(kGlm45Syntax, text);
  EXPECT_FALSE(scan.broken);
  ASSERT_EQ(scan.calls.size(), 2u);
  EXPECT_EQ(scan.calls[0].start, 0u);
  EXPECT_TRUE(scan.calls[0].closed);
  EXPECT_EQ(scan.calls[1].name, "g");
  EXPECT_FALSE(scan.calls[1].closed);
  ASSERT_EQ(scan.calls[1].arguments.size(), 2u);
  EXPECT_EQ(scan.calls[1].arguments[0].key, "b");
  EXPECT_EQ(scan.calls[1].arguments[0].value, "x<y");
  EXPECT_FALSE(scan.calls[1].arguments[1].closed);
  EXPECT_EQ(scan.calls[1].arguments[1].value, "open");
  // Open: only closed values, no brace; the reply ended: every value and the brace.
  EXPECT_EQ(XmlArgumentsJson(scan.calls[1], {}, /*text_ended=*/false), R"({"b":"x<y")");
  EXPECT_EQ(XmlArgumentsJson(scan.calls[1], {}, /*text_ended=*/true), R"({"b":"x<y","c":"open"})");
}

TEST(XmlToolCallsTest, BrokenHeadsStopTheScan) {
  EXPECT_TRUE(ScanXmlCalls(kQwen3CoderSyntax, "<function=f").broken);
  EXPECT_TRUE(ScanXmlCalls(kQwen3CoderSyntax, "<function=>").broken);
  EXPECT_TRUE(ScanXmlCalls(kQwen3CoderSyntax, "<function=f><parameter=k").broken);
  EXPECT_TRUE(ScanXmlCalls(kGlm45Syntax, "<tool_call>f\n<arg_key>k</arg_key>v").broken);
  EXPECT_TRUE(ScanXmlCalls(kGlm45Syntax, "<tool_call>\n</tool_call>").broken);
  // A whole call before a broken one is kept; an open call keeps its arguments so far.
  XmlCalls scan = ScanXmlCalls(kQwen3CoderSyntax, "<function=f></function> <function=");
  EXPECT_TRUE(scan.broken);
  ASSERT_EQ(scan.calls.size(), 1u);
  EXPECT_EQ(scan.calls[0].name, "f");
  scan = ScanXmlCalls(kQwen3CoderSyntax, "<function=g><parameter=a>1</parameter><parameter=");
  EXPECT_TRUE(scan.broken);
  ASSERT_EQ(scan.calls.size(), 1u);
  EXPECT_EQ(scan.calls[0].arguments.size(), 1u);
  EXPECT_FALSE(scan.calls[0].closed);
  EXPECT_TRUE(ScanXmlCalls(kGlm45Syntax, "no call").calls.empty());
}

TEST(XmlToolCallsTest, ValuesAsJson) {
  EXPECT_EQ(XmlValueJson("\n42\n", false), 42);
  EXPECT_EQ(XmlValueJson("\n42\n", true), "42");
  EXPECT_EQ(XmlValueJson("null", true), "null");
  EXPECT_TRUE(XmlValueJson("null", false).is_null());
  EXPECT_EQ(XmlValueJson("\"quoted\"", false), "\"quoted\"");
  EXPECT_EQ(XmlValueJson("two\nlines\n\n", false), "two\nlines\n");
  EXPECT_EQ(XmlValueJson(" [1, {\"a\": true}] ", false).dump(), R"([1,{"a":true}])");
  EXPECT_EQ(XmlValueJson(std::string(1000, '['), false), std::string(1000, '['));
}

}  // namespace
}  // namespace loom::api
