#include "common/json_depth.h"

#include <string>

#include "gtest/gtest.h"

namespace loom::common {
namespace {

std::string Nested(int depth) { return std::string(depth, '[') + "1" + std::string(depth, ']'); }

TEST(JsonDepthTest, CountsArraysAndObjectsButNotBracketsInStrings) {
  EXPECT_EQ(JsonNestingDepth(""), 0);
  EXPECT_EQ(JsonNestingDepth("17"), 0);
  EXPECT_EQ(JsonNestingDepth("{}"), 1);
  EXPECT_EQ(JsonNestingDepth(R"({"a": [1, {"b": []}], "c": {}})"), 4);
  EXPECT_EQ(JsonNestingDepth(R"(["[[[{{{", "]]]"])"), 1);
  // Escaped quotes and backslashes keep the string open or closed as JSON does.
  EXPECT_EQ(JsonNestingDepth(R"(["a\"[[[", "b\\", [2]])"), 2);
  EXPECT_EQ(JsonNestingDepth(R"(["\\\"[", [[3]]])"), 3);
  EXPECT_EQ(JsonNestingDepth(Nested(1'000'000)), 1'000'000);
  // Closing brackets beyond the opened ones never make the depth negative.
  EXPECT_EQ(JsonNestingDepth("]]]]{}"), 1);
}

TEST(JsonDepthTest, CheckRefusesOnlyBeyondTheLimitNamingWhat) {
  EXPECT_TRUE(CheckJsonNestingDepth(Nested(kMaxJsonNestingDepth), "x").ok());
  const absl::Status deep = CheckJsonNestingDepth(Nested(kMaxJsonNestingDepth + 1), "the body");
  EXPECT_EQ(deep.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(deep.message(), "the body nests arrays and objects deeper than 256 levels");
  EXPECT_TRUE(CheckJsonNestingDepth("not json at all", "x").ok());
}

}  // namespace
}  // namespace loom::common
