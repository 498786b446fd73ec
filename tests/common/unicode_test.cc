#include "common/unicode.h"

#include <gtest/gtest.h>

#include <string>

#include "common/tokenizer/byte_level.h"

namespace loom::common {
namespace {

TEST(UnicodeTest, CompletePrefixStopsBeforeAnUnfinishedCharacter) {
  EXPECT_EQ(CompleteUtf8PrefixLength("abc"), 3u);
  EXPECT_EQ(CompleteUtf8PrefixLength("a\xE4\xBD"), 1u);          // 你 missing its last byte
  EXPECT_EQ(CompleteUtf8PrefixLength("a\xE4\xBD\xA0"), 4u);      // 你 complete
  EXPECT_EQ(CompleteUtf8PrefixLength("\xF0\x9F\x98"), 0u);       // 😀 missing one byte
  EXPECT_EQ(CompleteUtf8PrefixLength("a\xFF"), 2u);              // never valid: not held
  EXPECT_EQ(CompleteUtf8PrefixLength("a\xE0\x80"), 3u);          // overlong start: not held
  EXPECT_EQ(CompleteUtf8PrefixLength("a\xED\xA0"), 3u);          // surrogate start: not held
  EXPECT_EQ(CompleteUtf8PrefixLength(""), 0u);
}

TEST(UnicodeTest, SanitizeReplacesEachMaximalInvalidSubpartLikePython) {
  // b"a\xf0\x9f\x98b\xff\xc3(".decode("utf-8", "replace") == "a\ufffdb\ufffd\ufffd("
  EXPECT_EQ(SanitizeUtf8("a\xF0\x9F\x98" "b\xFF\xC3("),
            "a\xEF\xBF\xBD" "b\xEF\xBF\xBD\xEF\xBF\xBD(");
  EXPECT_EQ(SanitizeUtf8("h\xC3\xA9llo"), "h\xC3\xA9llo");
  EXPECT_EQ(SanitizeUtf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(UnicodeTest, AppendUtf8EncodesEveryLength) {
  std::string out;
  AppendUtf8(0x41, out);
  AppendUtf8(0xE9, out);
  AppendUtf8(0x4F60, out);
  AppendUtf8(0x1F600, out);
  EXPECT_EQ(out, "A\xC3\xA9\xE4\xBD\xA0\xF0\x9F\x98\x80");
  EXPECT_TRUE(IsValidUtf8(out));
  EXPECT_FALSE(IsValidUtf8("\xC0\x80"));
}

TEST(ByteLevelTest, MapsBytesLikeGpt2AndBack) {
  EXPECT_EQ(ByteToUnicode(' '), 0x120u);   // "Ġ"
  EXPECT_EQ(ByteToUnicode('\n'), 0x10Au);  // "Ċ"
  EXPECT_EQ(ByteToUnicode('A'), static_cast<uint32_t>('A'));
  std::string all;
  for (int byte = 0; byte < 256; ++byte) all.push_back(static_cast<char>(byte));
  EXPECT_EQ(ByteLevelDecode(ByteLevelEncode(all)), all);
  EXPECT_EQ(ByteLevelEncode(" hi"), "\xC4\xA0hi");
}

}  // namespace
}  // namespace loom::common
