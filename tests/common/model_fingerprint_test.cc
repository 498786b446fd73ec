#include "common/formats/model_fingerprint.h"

#include <cstdlib>
#include <filesystem>
#include <string>

#include "gtest/gtest.h"
#include "tests/test_paths.h"
#include "tests/common/gguf_test_util.h"

namespace loom::common {
namespace {

using ::loom::common::testing::GgufImageBuilder;

constexpr uint32_t kF32 = static_cast<uint32_t>(GgmlType::kF32);

// A small model-like image; `name` and `head_count` vary between the tests.
GgufImageBuilder SmallModel(const std::string& name = "tiny", uint32_t head_count = 4) {
  GgufImageBuilder builder;
  builder.KvString("general.architecture", "llama")
      .KvString("general.name", name)
      .KvU32("llama.attention.head_count", head_count)
      .KvF32("llama.rope.freq_base", 10000.0f)
      .KvStringArray("tokenizer.ggml.tokens", {"a", "b", "c"})
      .Tensor("token_embd.weight", {8, 3}, kF32);
  return builder;
}

std::string FingerprintOf(const std::string& image) {
  absl::StatusOr<std::unique_ptr<GgufFile>> gguf = GgufFile::FromBytes(image);
  EXPECT_TRUE(gguf.ok()) << gguf.status();
  return gguf.ok() ? ModelFingerprint(**gguf) : "";
}

TEST(ModelFingerprintTest, IsThirtyTwoHexDigits) {
  const std::string digest = FingerprintOf(SmallModel().Build());
  ASSERT_EQ(digest.size(), 32u);
  EXPECT_EQ(digest.find_first_not_of("0123456789abcdef"), std::string::npos) << digest;
}

TEST(ModelFingerprintTest, SameImageGivesSameDigest) {
  EXPECT_EQ(FingerprintOf(SmallModel().Build()), FingerprintOf(SmallModel().Build()));
}

TEST(ModelFingerprintTest, ChangedMetadataValueChangesTheDigest) {
  const std::string base = FingerprintOf(SmallModel().Build());
  EXPECT_NE(base, FingerprintOf(SmallModel("tinier").Build()));
  EXPECT_NE(base, FingerprintOf(SmallModel("tiny", 8).Build()));
}

TEST(ModelFingerprintTest, ChangedTensorTableChangesTheDigest) {
  const std::string base = FingerprintOf(SmallModel().Build());
  EXPECT_NE(base, FingerprintOf(SmallModel().Tensor("output.weight", {8, 3}, kF32).Build()));
  GgufImageBuilder other_shape;
  other_shape.KvString("general.architecture", "llama")
      .KvString("general.name", "tiny")
      .KvU32("llama.attention.head_count", 4)
      .KvF32("llama.rope.freq_base", 10000.0f)
      .KvStringArray("tokenizer.ggml.tokens", {"a", "b", "c"})
      .Tensor("token_embd.weight", {3, 8}, kF32);
  EXPECT_NE(base, FingerprintOf(other_shape.Build()));
}

TEST(ModelFingerprintTest, IgnoresTensorData) {
  const std::string zeros(8 * 3 * 4, '\0');
  const std::string ones(8 * 3 * 4, '\1');
  GgufImageBuilder a, b;
  a.KvString("general.name", "x").Tensor("w", {8, 3}, kF32, zeros);
  b.KvString("general.name", "x").Tensor("w", {8, 3}, kF32, ones);
  EXPECT_EQ(FingerprintOf(a.Build()), FingerprintOf(b.Build()));
}

TEST(ModelFingerprintTest, RealModelIsStableAcrossOpens) {
  const std::string path = loom::test_env::ModelPath();
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "no model at " << path;
  auto first = GgufFile::Open(path);
  auto second = GgufFile::Open(path);
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(ModelFingerprint(**first), ModelFingerprint(**second));
}

}  // namespace
}  // namespace loom::common
