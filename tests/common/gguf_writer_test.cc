#include "common/formats/gguf_writer.h"

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/tokenizer_test_util.h"

namespace loom::common {
namespace {

using ::testing::HasSubstr;

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> byte(0, 255);
  std::vector<uint8_t> out(n);
  for (uint8_t& b : out) b = static_cast<uint8_t>(byte(rng));
  return out;
}

std::vector<uint8_t> F32Bytes(const std::vector<float>& values) {
  std::vector<uint8_t> out(values.size() * 4);
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

// Same type and the same stored value, recursively (GgufValue has no operator==).
bool SameValue(const GgufValue& a, const GgufValue& b) {
  if (a.type() != b.type()) return false;
  if (a.type() == GgufValueType::kArray) {
    const GgufValue::Array& x = *a.AsArray().value();
    const GgufValue::Array& y = *b.AsArray().value();
    if (a.element_type() != b.element_type() || x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i) {
      if (!SameValue(x[i], y[i])) return false;
    }
    return true;
  }
  const auto& s = a.storage();
  const auto& t = b.storage();
  if (s.index() != t.index()) return false;
  if (const auto* u = std::get_if<uint64_t>(&s)) return *u == std::get<uint64_t>(t);
  if (const auto* i = std::get_if<int64_t>(&s)) return *i == std::get<int64_t>(t);
  if (const auto* d = std::get_if<double>(&s)) return std::memcmp(d, &std::get<double>(t), 8) == 0;
  if (const auto* flag = std::get_if<bool>(&s)) return *flag == std::get<bool>(t);
  return std::get<std::string>(s) == std::get<std::string>(t);
}

GgufValue Scalar(GgufValueType type, GgufValue::Storage storage) {
  return GgufValue(type, std::move(storage));
}

// Every metadata value type, at the edges of its range, plus nested and empty arrays.
void AddEveryValueType(GgufWriter& writer) {
  writer.Set("u8", Scalar(GgufValueType::kUint8, uint64_t{255}));
  writer.Set("i8", Scalar(GgufValueType::kInt8, int64_t{-128}));
  writer.Set("u16", Scalar(GgufValueType::kUint16, uint64_t{65535}));
  writer.Set("i16", Scalar(GgufValueType::kInt16, int64_t{-32768}));
  writer.SetUint32("u32", 4000000000u);
  writer.SetInt32("i32", -2000000000);
  writer.Set("u64", Scalar(GgufValueType::kUint64, std::numeric_limits<uint64_t>::max()));
  writer.Set("i64", Scalar(GgufValueType::kInt64, std::numeric_limits<int64_t>::min()));
  writer.SetFloat32("f32", 9.999999747378752e-06f);
  writer.Set("f64", Scalar(GgufValueType::kFloat64, 0.1));
  writer.SetBool("bool", true);
  writer.SetString("string", std::string("h\xc3\xa9llo\0world", 12));
  GgufValue::Array strings = {Scalar(GgufValueType::kString, std::string("a")),
                              Scalar(GgufValueType::kString, std::string(""))};
  writer.Set("strings", GgufValue(GgufValueType::kArray, strings, GgufValueType::kString));
  GgufValue::Array inner = {Scalar(GgufValueType::kInt16, int64_t{-3}),
                            Scalar(GgufValueType::kInt16, int64_t{7})};
  GgufValue::Array nested = {
      GgufValue(GgufValueType::kArray, inner, GgufValueType::kInt16),
      GgufValue(GgufValueType::kArray, GgufValue::Array{}, GgufValueType::kInt16)};
  writer.Set("nested", GgufValue(GgufValueType::kArray, nested, GgufValueType::kArray));
  writer.Set("empty",
             GgufValue(GgufValueType::kArray, GgufValue::Array{}, GgufValueType::kFloat32));
}

void ExpectSameValue(const GgufValue& got, const GgufValue& want, const std::string& key) {
  ASSERT_EQ(got.type(), want.type()) << key;
  if (want.type() == GgufValueType::kArray) {
    EXPECT_EQ(got.element_type(), want.element_type()) << key;
    const GgufValue::Array& a = *got.AsArray().value();
    const GgufValue::Array& b = *want.AsArray().value();
    ASSERT_EQ(a.size(), b.size()) << key;
    for (size_t i = 0; i < a.size(); ++i) ExpectSameValue(a[i], b[i], key + "[]");
    return;
  }
  if (want.type() == GgufValueType::kFloat32) {
    // Bit for bit after the float round trip.
    const float a = static_cast<float>(got.AsDouble().value());
    const float b = static_cast<float>(want.AsDouble().value());
    EXPECT_EQ(std::memcmp(&a, &b, 4), 0) << key;
    return;
  }
  EXPECT_TRUE(SameValue(got, want)) << key;
}

TEST(GgufWriterTest, RoundTripsEveryValueTypeAndTensorThroughTheReader) {
  GgufWriter writer;
  AddEveryValueType(writer);
  const std::vector<uint8_t> f32 = F32Bytes({1.5f, -2.0f, 3.25f});
  const std::vector<uint8_t> q8 = RandomBytes(2 * 34, 7);  // 2 Q8_0 blocks
  const std::vector<uint8_t> i8 = RandomBytes(5 * 3, 8);
  ASSERT_TRUE(writer.AddTensor("vector", {3}, GgmlType::kF32, f32).ok());
  ASSERT_TRUE(writer.AddTensor("blocks", {32, 2}, GgmlType::kQ8_0, q8).ok());
  ASSERT_TRUE(writer.AddTensorView("bytes", {5, 3}, GgmlType::kI8, i8).ok());
  absl::StatusOr<std::string> image = writer.Serialize();
  ASSERT_TRUE(image.ok()) << image.status();

  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::FromBytes(*image);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->version(), 3u);
  GgufWriter expected;
  AddEveryValueType(expected);
  std::vector<std::string> keys;
  for (const auto& [key, value] : (*file)->metadata()) {
    keys.push_back(key);
    const GgufValue* want = expected.Find(key);
    ASSERT_NE(want, nullptr) << key;
    ExpectSameValue(value, *want, key);
  }
  EXPECT_EQ(keys,
            (std::vector<std::string>{"u8", "i8", "u16", "i16", "u32", "i32", "u64", "i64", "f32",
                                      "f64", "bool", "string", "strings", "nested", "empty"}));
  EXPECT_EQ((*file)->GetString("string").value(), std::string("h\xc3\xa9llo\0world", 12));

  const std::vector<std::pair<std::string, const std::vector<uint8_t>*>> tensors = {
      {"vector", &f32}, {"blocks", &q8}, {"bytes", &i8}};
  for (const auto& [name, bytes] : tensors) {
    const GgufTensorInfo* info = (*file)->FindTensor(name);
    ASSERT_NE(info, nullptr) << name;
    EXPECT_EQ(info->offset % 32, 0u) << name;
    absl::Span<const uint8_t> data = (*file)->TensorData(*info);
    EXPECT_EQ(std::vector<uint8_t>(data.begin(), data.end()), *bytes) << name;
  }
  EXPECT_EQ((*file)->FindTensor("blocks")->shape, (std::vector<uint64_t>{32, 2}));
  EXPECT_EQ(image->size() % 32, 0u);  // the last tensor is padded too
}

TEST(GgufWriterTest, HonoursGeneralAlignment) {
  GgufWriter writer;
  writer.SetUint32("general.alignment", 256);
  ASSERT_TRUE(writer.AddTensor("a", {3}, GgmlType::kF32, F32Bytes({1, 2, 3})).ok());
  ASSERT_TRUE(writer.AddTensor("b", {1}, GgmlType::kF32, F32Bytes({4})).ok());
  absl::StatusOr<std::string> image = writer.Serialize();
  ASSERT_TRUE(image.ok());
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::FromBytes(*image);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->alignment(), 256u);
  EXPECT_EQ((*file)->FindTensor("b")->offset, 256u);
  EXPECT_EQ(image->size() % 256, 0u);

  writer.SetUint32("general.alignment", 48);  // not a power of two
  EXPECT_THAT(writer.Serialize().status().message(), HasSubstr("general.alignment"));
}

TEST(GgufWriterTest, SetReplacesInPlaceAndRemoveDeletes) {
  GgufWriter writer;
  writer.SetString("a", "1");
  writer.SetString("b", "2");
  writer.SetUint32("a", 3);
  writer.Remove("b");
  writer.Remove("missing");
  absl::StatusOr<std::string> image = writer.Serialize();
  ASSERT_TRUE(image.ok());
  auto file = GgufFile::FromBytes(*image);
  ASSERT_TRUE(file.ok());
  ASSERT_EQ((*file)->metadata().size(), 1u);
  EXPECT_EQ((*file)->GetInt("a").value(), 3);
}

TEST(GgufWriterTest, RejectsBadTensorsNamingThem) {
  GgufWriter writer;
  ASSERT_TRUE(writer.AddTensor("t", {2}, GgmlType::kF32, F32Bytes({1, 2})).ok());
  EXPECT_THAT(writer.AddTensor("t", {1}, GgmlType::kF32, F32Bytes({1})).message(),
              HasSubstr("'t': added twice"));
  EXPECT_THAT(writer.AddTensor("short", {3}, GgmlType::kF32, F32Bytes({1, 2})).message(),
              HasSubstr("'short': 3 elements of F32 take 12 bytes, got 8"));
  EXPECT_THAT(writer.AddTensor("zero", {0}, GgmlType::kF32, {}).message(),
              HasSubstr("'zero': a dimension is 0"));
  EXPECT_THAT(writer.AddTensor("blocky", {16}, GgmlType::kQ8_0, RandomBytes(17, 1)).message(),
              HasSubstr("not a multiple of Q8_0's block size 32"));
  EXPECT_THAT(writer.AddTensor("deep", {1, 1, 1, 1, 1}, GgmlType::kF32, F32Bytes({1})).message(),
              HasSubstr("5 dimensions"));
  GgufWriter bad_value;
  bad_value.Set("u8", GgufValue(GgufValueType::kUint8, uint64_t{256}));
  EXPECT_THAT(bad_value.Serialize().status().message(), HasSubstr("'u8'"));
}

// The default model was written by the PyPI gguf package with the same layout rules, so
// copying its metadata and tensors must reproduce the file byte for byte.
TEST(GgufWriterTest, RewritesTheDefaultModelByteForByte) {
  const std::string path = testing::ModelPath();
  absl::StatusOr<std::unique_ptr<GgufFile>> model = GgufFile::Open(path);
  ASSERT_TRUE(model.ok()) << model.status();
  GgufWriter writer;
  writer.CopyMetadata(**model);
  for (const GgufTensorInfo& tensor : (*model)->tensors()) {
    ASSERT_TRUE(
        writer.AddTensorView(tensor.name, tensor.shape, tensor.type, (*model)->TensorData(tensor))
            .ok());
  }
  const std::filesystem::path out = std::filesystem::temp_directory_path() /
                                    ("gguf_writer_test_" + std::to_string(getpid()) + ".gguf");
  ASSERT_TRUE(writer.WriteFile(out.string()).ok());
  const std::string written = testing::ReadFileOrEmpty(out.string());
  const std::string original = testing::ReadFileOrEmpty(path);
  std::filesystem::remove(out);
  ASSERT_EQ(written.size(), original.size());
  EXPECT_TRUE(written == original);
  EXPECT_FALSE(std::filesystem::exists(out.string() + ".tmp"));
}

TEST(GgufWriterTest, WriteFileReportsAnUnwritablePath) {
  GgufWriter writer;
  EXPECT_THAT(writer.WriteFile("/nonexistent-dir/x.gguf").message(),
              HasSubstr("/nonexistent-dir/x.gguf.tmp"));
}

}  // namespace
}  // namespace loom::common
