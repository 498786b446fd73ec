#include "common/formats/gguf_file.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_paths.h"
#include "tests/common/gguf_test_util.h"

namespace loom::common {
namespace {

using ::loom::common::testing::ArrayValue;
using ::loom::common::testing::GgufImageBuilder;
using ::loom::common::testing::GgufString;
using ::loom::common::testing::Le32;
using ::loom::common::testing::Le64;
using ::loom::common::testing::Raw;
using ::testing::HasSubstr;

constexpr uint32_t kF32 = static_cast<uint32_t>(GgmlType::kF32);
constexpr uint32_t kQ8_0 = static_cast<uint32_t>(GgmlType::kQ8_0);

std::filesystem::path SourceDir() { return loom::test_env::SourceDir(); }

std::filesystem::path ModelPath() {
  if (const char* path = std::getenv("LOOM_MODEL_PATH")) return path;
  return SourceDir() / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf";
}

std::string ReadFileBytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

// Expects `image` to be rejected with `code` and a message containing every piece.
void ExpectRejected(const std::string& image, absl::StatusCode code,
                    const std::vector<std::string>& pieces) {
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::FromBytes(image);
  ASSERT_FALSE(file.ok()) << "expected an error containing " << pieces[0];
  EXPECT_EQ(file.status().code(), code) << file.status();
  for (const std::string& piece : pieces) {
    EXPECT_THAT(std::string(file.status().message()), HasSubstr(piece));
  }
}

std::string F32Bytes(const std::vector<float>& values) {
  std::string bytes(values.size() * sizeof(float), '\0');
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

// A small valid image used by the truncation and corpus tests.
std::string SmallValidImage() {
  return GgufImageBuilder()
      .KvString("general.architecture", "llama")
      .KvU32("llama.block_count", 2)
      .KvStringArray("tokenizer.ggml.tokens", {"a", "b", "c"})
      .Tensor("weights", {4, 2}, kF32, F32Bytes({1, 2, 3, 4, 5, 6, 7, 8}))
      .Tensor("bias", {4}, kF32, F32Bytes({-1, -2, -3, -4}))
      .Build();
}

TEST(GgufFileTest, ParsesEveryScalarValueType) {
  const std::string image =
      GgufImageBuilder()
          .Kv("u8", GgufValueType::kUint8, Raw<uint8_t>(250))
          .Kv("i8", GgufValueType::kInt8, Raw<int8_t>(-120))
          .Kv("u16", GgufValueType::kUint16, Raw<uint16_t>(65000))
          .Kv("i16", GgufValueType::kInt16, Raw<int16_t>(-32000))
          .Kv("u32", GgufValueType::kUint32, Raw<uint32_t>(4000000000u))
          .Kv("i32", GgufValueType::kInt32, Raw<int32_t>(-2000000000))
          .Kv("f32", GgufValueType::kFloat32, Raw<float>(0.15625f))
          .Kv("bool_true", GgufValueType::kBool, Raw<uint8_t>(1))
          .Kv("bool_false", GgufValueType::kBool, Raw<uint8_t>(0))
          .Kv("string", GgufValueType::kString, GgufString("héllo"))
          .Kv("empty", GgufValueType::kString, GgufString(""))
          .Kv("u64", GgufValueType::kUint64, Raw<uint64_t>(uint64_t{1} << 62))
          .Kv("i64", GgufValueType::kInt64, Raw<int64_t>(std::numeric_limits<int64_t>::min()))
          .Kv("f64", GgufValueType::kFloat64, Raw<double>(1e-300))
          .Build();
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::FromBytes(image);
  ASSERT_TRUE(file.ok()) << file.status();
  const GgufFile& gguf = **file;
  EXPECT_EQ(gguf.version(), 3u);
  EXPECT_EQ(gguf.alignment(), 32u);
  ASSERT_EQ(gguf.metadata().size(), 14u);
  EXPECT_EQ(gguf.metadata()[0].first, "u8");  // file order
  EXPECT_EQ(gguf.metadata()[13].first, "f64");

  EXPECT_EQ(*gguf.GetInt("u8"), 250);
  EXPECT_EQ(gguf.Find("u8")->type(), GgufValueType::kUint8);
  EXPECT_EQ(*gguf.GetInt("i8"), -120);
  EXPECT_EQ(*gguf.GetInt("u16"), 65000);
  EXPECT_EQ(*gguf.GetInt("i16"), -32000);
  EXPECT_EQ(*gguf.GetInt("u32"), 4000000000);
  EXPECT_EQ(*gguf.GetInt("i32"), -2000000000);
  EXPECT_EQ(*gguf.GetDouble("f32"), 0.15625);
  EXPECT_EQ(gguf.Find("f32")->type(), GgufValueType::kFloat32);
  EXPECT_TRUE(*gguf.GetBool("bool_true"));
  EXPECT_FALSE(*gguf.GetBool("bool_false"));
  EXPECT_EQ(*gguf.GetString("string"), "héllo");
  EXPECT_EQ(*gguf.GetString("empty"), "");
  EXPECT_EQ(*gguf.GetInt("u64"), int64_t{1} << 62);
  EXPECT_EQ(*gguf.GetInt("i64"), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(*gguf.GetDouble("f64"), 1e-300);
  EXPECT_EQ(*gguf.GetDouble("i32"), -2000000000.0);  // integers widen to double
}

TEST(GgufFileTest, TypedGettersReportMissingKeysAndTypeMismatchesByName) {
  const std::string image = GgufImageBuilder()
                                .KvString("name", "x")
                                .KvU32("count", 3)
                                .KvU64("huge", std::numeric_limits<uint64_t>::max())
                                .Build();
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::FromBytes(image);
  ASSERT_TRUE(file.ok()) << file.status();
  const GgufFile& gguf = **file;
  EXPECT_EQ(gguf.Find("absent"), nullptr);
  EXPECT_EQ(gguf.GetInt("absent").status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(gguf.GetInt("absent").status().message()), HasSubstr("absent"));

  absl::StatusOr<int64_t> as_int = gguf.GetInt("name");
  EXPECT_EQ(as_int.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(as_int.status().message()), HasSubstr("'name'"));
  EXPECT_EQ(gguf.GetString("count").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gguf.GetBool("count").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gguf.GetArray("count").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gguf.GetDouble("name").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gguf.Find("count")->AsArray().status().code(),
            absl::StatusCode::kFailedPrecondition);

  absl::StatusOr<int64_t> huge = gguf.GetInt("huge");
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(std::string(huge.status().message()), HasSubstr("18446744073709551615"));
  EXPECT_THAT(std::string(huge.status().message()), HasSubstr("'huge'"));
}

TEST(GgufFileTest, ParsesArraysOfEveryElementTypeAndNestedArrays) {
  std::string ints = Raw<int32_t>(-1) + Raw<int32_t>(7);
  std::string floats = Raw<float>(0.5f) + Raw<float>(-2.0f) + Raw<float>(3.0f);
  std::string bools = Raw<uint8_t>(1) + Raw<uint8_t>(0);
  // [[1, 2], [], [3]] as arrays of uint16.
  std::string nested = ArrayValue(GgufValueType::kUint16, 2, Raw<uint16_t>(1) + Raw<uint16_t>(2)) +
                       ArrayValue(GgufValueType::kUint16, 0, "") +
                       ArrayValue(GgufValueType::kUint16, 1, Raw<uint16_t>(3));
  // [[["deep"]]]
  std::string deep = ArrayValue(GgufValueType::kArray, 1,
                                ArrayValue(GgufValueType::kString, 1, GgufString("deep")));
  const std::string image =
      GgufImageBuilder()
          .Kv("ints", GgufValueType::kArray, ArrayValue(GgufValueType::kInt32, 2, ints))
          .Kv("floats", GgufValueType::kArray, ArrayValue(GgufValueType::kFloat32, 3, floats))
          .Kv("bools", GgufValueType::kArray, ArrayValue(GgufValueType::kBool, 2, bools))
          .KvStringArray("strings", {"x", "", "yz"})
          .Kv("empty", GgufValueType::kArray, ArrayValue(GgufValueType::kInt64, 0, ""))
          .Kv("nested", GgufValueType::kArray, ArrayValue(GgufValueType::kArray, 3, nested))
          .Kv("deep", GgufValueType::kArray, ArrayValue(GgufValueType::kArray, 1, deep))
          .Kv("u64s", GgufValueType::kArray,
              ArrayValue(GgufValueType::kUint64, 1, Le64(uint64_t{1} << 40)))
          .Kv("f64s", GgufValueType::kArray,
              ArrayValue(GgufValueType::kFloat64, 1, Raw<double>(2.25)))
          .Build();
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::FromBytes(image);
  ASSERT_TRUE(file.ok()) << file.status();
  const GgufFile& gguf = **file;

  const GgufValue::Array* array = *gguf.GetArray("ints");
  EXPECT_EQ(gguf.Find("ints")->element_type(), GgufValueType::kInt32);
  ASSERT_EQ(array->size(), 2u);
  EXPECT_EQ(*(*array)[0].AsInt(), -1);
  EXPECT_EQ(*(*array)[1].AsInt(), 7);

  array = *gguf.GetArray("floats");
  ASSERT_EQ(array->size(), 3u);
  EXPECT_EQ(*(*array)[1].AsDouble(), -2.0);

  array = *gguf.GetArray("bools");
  ASSERT_EQ(array->size(), 2u);
  EXPECT_TRUE(*(*array)[0].AsBool());
  EXPECT_FALSE(*(*array)[1].AsBool());

  array = *gguf.GetArray("strings");
  ASSERT_EQ(array->size(), 3u);
  EXPECT_EQ(*(*array)[2].AsString(), "yz");
  EXPECT_EQ(*(*array)[1].AsString(), "");

  EXPECT_TRUE((*gguf.GetArray("empty"))->empty());
  EXPECT_EQ(gguf.Find("empty")->element_type(), GgufValueType::kInt64);

  array = *gguf.GetArray("nested");
  EXPECT_EQ(gguf.Find("nested")->element_type(), GgufValueType::kArray);
  ASSERT_EQ(array->size(), 3u);
  EXPECT_EQ((*array)[0].element_type(), GgufValueType::kUint16);
  ASSERT_EQ((*(*array)[0].AsArray())->size(), 2u);
  EXPECT_EQ(*(*(*array)[0].AsArray())->at(1).AsInt(), 2);
  EXPECT_TRUE((*(*array)[1].AsArray())->empty());
  EXPECT_EQ(*(*(*array)[2].AsArray())->at(0).AsInt(), 3);

  const GgufValue& level1 = (*gguf.GetArray("deep"))->at(0);
  const GgufValue& level2 = (*level1.AsArray())->at(0);
  EXPECT_EQ(*(*level2.AsArray())->at(0).AsString(), "deep");

  EXPECT_EQ(*(*gguf.GetArray("u64s"))->at(0).AsInt(), int64_t{1} << 40);
  EXPECT_EQ(*(*gguf.GetArray("f64s"))->at(0).AsDouble(), 2.25);
}

TEST(GgufFileTest, ReadsTensorInfosDataAndDequantizes) {
  // One Q8_0 block: d = 0.5 (f16 0x3800), q = 0..31 minus 16.
  std::string q8_block = Raw<uint16_t>(0x3800);
  for (int i = 0; i < 32; ++i) q8_block.push_back(static_cast<char>(i - 16));
  const std::string image = GgufImageBuilder()
                                .KvString("general.architecture", "llama")
                                .Tensor("a", {3, 2}, kF32, F32Bytes({1, 2, 3, 4, 5, 6}))
                                .Tensor("q", {32}, kQ8_0, q8_block)
                                .Build();
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::FromBytes(image);
  ASSERT_TRUE(file.ok()) << file.status();
  const GgufFile& gguf = **file;
  ASSERT_EQ(gguf.tensors().size(), 2u);

  const GgufTensorInfo* a = gguf.FindTensor("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->shape, (std::vector<uint64_t>{3, 2}));
  EXPECT_EQ(a->type, GgmlType::kF32);
  EXPECT_EQ(a->num_elements, 6u);
  EXPECT_EQ(a->num_bytes, 24u);
  EXPECT_EQ(a->offset, 0u);
  absl::Span<const uint8_t> data = gguf.TensorData(*a);
  ASSERT_EQ(data.size(), 24u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(data.data()), data.size()),
            F32Bytes({1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(*gguf.DequantizeTensor(*a), (std::vector<float>{1, 2, 3, 4, 5, 6}));

  const GgufTensorInfo* q = gguf.FindTensor("q");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->offset, 32u);  // next multiple of the default alignment
  EXPECT_EQ(q->num_bytes, 34u);
  absl::StatusOr<std::vector<float>> values = gguf.DequantizeTensor(*q);
  ASSERT_TRUE(values.ok()) << values.status();
  for (int i = 0; i < 32; ++i) EXPECT_EQ((*values)[i], 0.5f * (i - 16)) << i;
  EXPECT_EQ(gguf.FindTensor("missing"), nullptr);
}

TEST(GgufFileTest, DequantizeTensorOfUnsupportedTypeIsUnimplementedNamingTheType) {
  const std::string image = GgufImageBuilder().Tensor("q3", {256}, 23).Build();  // IQ4_XS
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::FromBytes(image);
  ASSERT_TRUE(file.ok()) << file.status();
  absl::StatusOr<std::vector<float>> values = (*file)->DequantizeTensor((*file)->tensors()[0]);
  EXPECT_EQ(values.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(values.status().message()), HasSubstr("IQ4_XS"));
  EXPECT_THAT(std::string(values.status().message()), HasSubstr("'q3'"));
}

TEST(GgufFileTest, CustomAlignmentMovesTheDataSection) {
  GgufImageBuilder builder;
  builder.Alignment(64).Tensor("a", {2}, kF32, F32Bytes({7, 8})).Tensor("b", {1}, kF32,
                                                                        F32Bytes({9}));
  const std::string image = builder.Build();
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::FromBytes(image);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->alignment(), 64u);
  EXPECT_EQ((*file)->FindTensor("b")->offset, 64u);
  EXPECT_EQ(*(*file)->DequantizeTensor(*(*file)->FindTensor("b")), std::vector<float>{9});
  EXPECT_EQ(*(*file)->DequantizeTensor(*(*file)->FindTensor("a")), (std::vector<float>{7, 8}));
}

TEST(GgufFileTest, AcceptsVersion2) {
  const std::string image =
      GgufImageBuilder().Version(2).KvU32("x", 1).Tensor("t", {1}, kF32, F32Bytes({3})).Build();
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::FromBytes(image);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->version(), 2u);
}

TEST(GgufFileTest, AcceptsFileWithoutTensorsOrPadding) {
  absl::StatusOr<std::unique_ptr<GgufFile>> file =
      GgufFile::FromBytes(GgufImageBuilder().KvString("k", "v").Build());
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE((*file)->tensors().empty());
}

TEST(GgufFileTest, RejectsVersion1WithClearMessage) {
  ExpectRejected(GgufImageBuilder().Version(1).Build(), absl::StatusCode::kInvalidArgument,
                 {"version 1"});
}

TEST(GgufFileTest, RejectsUnknownAndBigEndianVersions) {
  ExpectRejected(GgufImageBuilder().Version(4).Build(), absl::StatusCode::kInvalidArgument,
                 {"unsupported GGUF version 4"});
  ExpectRejected(GgufImageBuilder().Version(0x03000000).Build(),
                 absl::StatusCode::kInvalidArgument, {"big-endian"});
}

TEST(GgufFileTest, RejectsWrongMagic) {
  std::string image = SmallValidImage();
  image[0] = 'G';
  image[3] = 'X';
  ExpectRejected(image, absl::StatusCode::kInvalidArgument, {"bad magic", "GGUX"});
  ExpectRejected("GG", absl::StatusCode::kOutOfRange, {"magic"});
  ExpectRejected("", absl::StatusCode::kOutOfRange, {"magic"});
}

TEST(GgufFileTest, EveryTruncationOfAValidFileIsAnError) {
  const std::string image = SmallValidImage();
  ASSERT_TRUE(GgufFile::FromBytes(image).ok());
  for (size_t length = 0; length < image.size(); ++length) {
    absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::FromBytes(image.substr(0, length));
    EXPECT_FALSE(file.ok()) << "prefix of " << length << " bytes parsed";
  }
}

TEST(GgufFileTest, RejectsAbsurdArrayLengthWithoutAllocating) {
  const std::string image =
      GgufImageBuilder()
          .Kv("tokens", GgufValueType::kArray,
              ArrayValue(GgufValueType::kString, uint64_t{1} << 60, GgufString("a")))
          .Build();
  ExpectRejected(image, absl::StatusCode::kOutOfRange, {"'tokens'", "1152921504606846976"});
  // Just over what the remaining bytes could hold (4 uint32 elements in 12 bytes).
  const std::string tight =
      GgufImageBuilder()
          .Kv("ints", GgufValueType::kArray,
              ArrayValue(GgufValueType::kUint32, 4, Le32(1) + Le32(2) + Le32(3)))
          .Build();
  ExpectRejected(tight, absl::StatusCode::kOutOfRange, {"'ints'", "array of 4"});
}

TEST(GgufFileTest, RejectsAbsurdStringLength) {
  const std::string image = GgufImageBuilder()
                                .Kv("name", GgufValueType::kString, Le64(uint64_t{1} << 62) + "ab")
                                .Build();
  ExpectRejected(image, absl::StatusCode::kOutOfRange, {"'name'", "4611686018427387904"});
  // A key whose length runs past the end.
  const std::string bad_key = "GGUF" + Le32(3) + Le64(0) + Le64(1) + Le64(1000) + std::string(20, 'x');
  ExpectRejected(bad_key, absl::StatusCode::kOutOfRange, {"metadata key", "1000"});
}

TEST(GgufFileTest, RejectsAbsurdCounts) {
  ExpectRejected(GgufImageBuilder().KvCount(uint64_t{1} << 40).Build(),
                 absl::StatusCode::kOutOfRange, {"metadata count 1099511627776"});
  ExpectRejected(GgufImageBuilder().TensorCount(uint64_t{1} << 50).Build(),
                 absl::StatusCode::kOutOfRange, {"tensor count 1125899906842624"});
  // Counts that merely exceed what is present run into the end of the file.
  ExpectRejected(GgufImageBuilder().KvU32("a", 1).KvCount(2).Build(),
                 absl::StatusCode::kOutOfRange, {"metadata count 2", "17 bytes"});
  ExpectRejected(GgufImageBuilder().KvString("a", std::string(40, 'x')).KvCount(2).Build(),
                 absl::StatusCode::kOutOfRange, {"truncated", "metadata key"});
}

TEST(GgufFileTest, RejectsUnknownValueTypes) {
  ExpectRejected(GgufImageBuilder().Kv("k", static_cast<GgufValueType>(13), Le32(0)).Build(),
                 absl::StatusCode::kInvalidArgument, {"'k'", "unknown value type 13"});
  ExpectRejected(GgufImageBuilder()
                     .Kv("arr", GgufValueType::kArray, Le32(99) + Le64(1) + Le32(0))
                     .Build(),
                 absl::StatusCode::kInvalidArgument, {"'arr'", "unknown array element type 99"});
}

TEST(GgufFileTest, RejectsBoolOtherThanZeroOrOne) {
  ExpectRejected(GgufImageBuilder().Kv("flag", GgufValueType::kBool, Raw<uint8_t>(2)).Build(),
                 absl::StatusCode::kInvalidArgument, {"'flag'", "value 2"});
}

TEST(GgufFileTest, RejectsArraysNestedTooDeep) {
  std::string value = ArrayValue(GgufValueType::kUint8, 0, "");
  for (int i = 0; i < 40; ++i) value = ArrayValue(GgufValueType::kArray, 1, value);
  ExpectRejected(GgufImageBuilder().Kv("deep", GgufValueType::kArray, value).Build(),
                 absl::StatusCode::kInvalidArgument, {"'deep'", "nested deeper"});
}

TEST(GgufFileTest, RejectsDuplicateKeysAndTensorNames) {
  ExpectRejected(GgufImageBuilder().KvU32("dup", 1).KvU32("dup", 2).Build(),
                 absl::StatusCode::kInvalidArgument, {"duplicate metadata key 'dup'"});
  ExpectRejected(
      GgufImageBuilder().Tensor("t", {1}, kF32).Tensor("t", {1}, kF32).Build(),
      absl::StatusCode::kInvalidArgument, {"duplicate tensor name 't'"});
}

TEST(GgufFileTest, RejectsBadTensorDimensions) {
  ExpectRejected(GgufImageBuilder().Tensor("five", {1, 1, 1, 1, 1}, kF32).Build(),
                 absl::StatusCode::kInvalidArgument, {"'five'", "n_dims 5"});
  ExpectRejected(GgufImageBuilder().RawInfo(GgufString("none") + Le32(0) + Le32(0) + Le64(0), 1)
                     .Build(),
                 absl::StatusCode::kInvalidArgument, {"'none'", "n_dims 0"});
  ExpectRejected(GgufImageBuilder().Tensor("zero", {4, 0}, kF32, F32Bytes({1})).Build(),
                 absl::StatusCode::kInvalidArgument, {"'zero'", "dimension 1 is 0"});
  ExpectRejected(GgufImageBuilder()
                     .Tensor("huge", {uint64_t{1} << 32, uint64_t{1} << 32}, kF32,
                             F32Bytes({1}))
                     .Build(),
                 absl::StatusCode::kInvalidArgument, {"'huge'", "overflows"});
  // Fits int64 as a count, but not as bytes of F32.
  ExpectRejected(GgufImageBuilder()
                     .Tensor("bytes", {uint64_t{1} << 62, 1}, kF32, F32Bytes({1}))
                     .Build(),
                 absl::StatusCode::kInvalidArgument, {"'bytes'", "overflows"});
}

TEST(GgufFileTest, RejectsUnknownTensorTypeAndPartialBlocks) {
  ExpectRejected(GgufImageBuilder().Tensor("t", {32}, 99, std::string(64, '\0')).Build(),
                 absl::StatusCode::kInvalidArgument, {"'t'", "unknown tensor type 99"});
  ExpectRejected(GgufImageBuilder().Tensor("q", {16}, kQ8_0, std::string(34, '\0')).Build(),
                 absl::StatusCode::kInvalidArgument, {"'q'", "row length 16", "Q8_0"});
}

TEST(GgufFileTest, RejectsTensorDataPastTheEnd) {
  std::string image = GgufImageBuilder().Tensor("t", {8}, kF32).Build();
  image.resize(image.size() - 1);
  ExpectRejected(image, absl::StatusCode::kOutOfRange, {"'t'", "past the end"});
  ExpectRejected(
      GgufImageBuilder().Tensor("far", {1}, kF32, F32Bytes({1}), uint64_t{1} << 62).Build(),
      absl::StatusCode::kOutOfRange, {"'far'", "4611686018427387904"});
  // An offset near UINT64_MAX must not wrap around.
  ExpectRejected(GgufImageBuilder()
                     .RawInfo(GgufString("wrap") + Le32(1) + Le64(8) + Le32(kF32) +
                                  Le64(~uint64_t{31}),
                              1)
                     .Build(),
                 absl::StatusCode::kOutOfRange, {"'wrap'"});
}

TEST(GgufFileTest, RejectsOverlappingTensors) {
  ExpectRejected(GgufImageBuilder()
                     .Tensor("first", {16}, kF32)
                     .Tensor("second", {8}, kF32, F32Bytes({1, 2, 3, 4, 5, 6, 7, 8}), 32)
                     .Build(),
                 absl::StatusCode::kInvalidArgument, {"'first'", "'second'", "overlap"});
}

TEST(GgufFileTest, RejectsMisalignedTensorOffset) {
  ExpectRejected(GgufImageBuilder()
                     .Tensor("a", {1}, kF32, F32Bytes({1}))
                     .Tensor("b", {1}, kF32, F32Bytes({1}), 4)
                     .Build(),
                 absl::StatusCode::kInvalidArgument, {"'b'", "offset 4", "alignment 32"});
}

TEST(GgufFileTest, RejectsBadAlignmentValues) {
  ExpectRejected(GgufImageBuilder().KvU32("general.alignment", 0).Build(),
                 absl::StatusCode::kInvalidArgument, {"general.alignment", "is 0"});
  ExpectRejected(GgufImageBuilder().KvU32("general.alignment", 48).Build(),
                 absl::StatusCode::kInvalidArgument, {"general.alignment", "is 48", "power of two"});
  ExpectRejected(GgufImageBuilder().KvString("general.alignment", "32").Build(),
                 absl::StatusCode::kInvalidArgument, {"general.alignment", "string"});
}

TEST(GgufFileTest, OpenReportsMissingFileAsNotFound) {
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open("/nonexistent/model.gguf");
  EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(file.status().message()), HasSubstr("/nonexistent/model.gguf"));
}

TEST(GgufFileTest, OpenMapsAndParsesAFileOnDisk) {
  const std::filesystem::path path =
      std::filesystem::path(::testing::TempDir()) / "gguf_file_test_small.gguf";
  {
    std::ofstream out(path, std::ios::binary);
    const std::string image = SmallValidImage();
    out.write(image.data(), static_cast<std::streamsize>(image.size()));
  }
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(path.string());
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(*(*file)->GetInt("llama.block_count"), 2);
  EXPECT_EQ(*(*file)->DequantizeTensor(*(*file)->FindTensor("bias")),
            (std::vector<float>{-1, -2, -3, -4}));
  std::filesystem::remove(path);
}

TEST(GgufFileTest, OpensTheSmolLm2Model) {
  const std::filesystem::path path = ModelPath();
  ASSERT_TRUE(std::filesystem::exists(path)) << path << " missing: run scripts/fetch-model.sh";
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(path.string());
  ASSERT_TRUE(file.ok()) << file.status();
  const GgufFile& gguf = **file;
  EXPECT_EQ(gguf.version(), 3u);
  EXPECT_EQ(*gguf.GetString("general.architecture"), "llama");
  EXPECT_EQ(*gguf.GetInt("llama.block_count"), 30);
  EXPECT_EQ((*gguf.GetArray("tokenizer.ggml.tokens"))->size(), 49152u);
  EXPECT_EQ((*gguf.GetArray("tokenizer.ggml.merges"))->size(), 48900u);
  EXPECT_EQ(gguf.tensors().size(), 272u);

  const GgufTensorInfo* embedding = gguf.FindTensor("token_embd.weight");
  ASSERT_NE(embedding, nullptr);
  EXPECT_EQ(embedding->shape, (std::vector<uint64_t>{576, 49152}));
  EXPECT_EQ(embedding->type, GgmlType::kQ8_0);
  const GgufTensorInfo* q = gguf.FindTensor("blk.0.attn_q.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->type, GgmlType::kQ4_1);
  EXPECT_EQ(q->shape, (std::vector<uint64_t>{576, 576}));

  absl::StatusOr<std::vector<float>> norm =
      gguf.DequantizeTensor(*gguf.FindTensor("blk.0.attn_norm.weight"));
  ASSERT_TRUE(norm.ok()) << norm.status();
  ASSERT_EQ(norm->size(), 576u);
  absl::StatusOr<std::vector<float>> weights = gguf.DequantizeTensor(*q);
  ASSERT_TRUE(weights.ok()) << weights.status();
  double sum_squares = 0;
  for (float w : *weights) {
    ASSERT_TRUE(std::isfinite(w));
    sum_squares += static_cast<double>(w) * w;
  }
  EXPECT_GT(sum_squares, 0.0);
}

TEST(GgufFileTest, MalformedCorpusGivesErrors) {
  const std::filesystem::path corpus = SourceDir() / "tests" / "fuzz" / "corpus" / "gguf";
  ASSERT_TRUE(std::filesystem::is_directory(corpus)) << corpus;
  int bad = 0;
  int good = 0;
  for (const auto& entry : std::filesystem::directory_iterator(corpus)) {
    const std::string name = entry.path().filename().string();
    absl::StatusOr<std::unique_ptr<GgufFile>> file =
        GgufFile::FromBytes(ReadFileBytes(entry.path()));
    if (name.rfind("bad_", 0) == 0) {
      ++bad;
      EXPECT_FALSE(file.ok()) << name << " parsed";
    } else if (name.rfind("good_", 0) == 0) {
      ++good;
      EXPECT_TRUE(file.ok()) << name << ": " << file.status();
    }
  }
  EXPECT_GE(bad, 10);
  EXPECT_GE(good, 2);
}

}  // namespace
}  // namespace loom::common
