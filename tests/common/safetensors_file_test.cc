#include "common/formats/safetensors_file.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::common {
namespace {

using ::testing::HasSubstr;

// An image of a safetensors file: 8-byte little-endian header length, header, data.
std::string Image(const std::string& header, const std::string& data) {
  std::string image(8, '\0');
  uint64_t length = header.size();
  for (int i = 0; i < 8; ++i) image[i] = static_cast<char>((length >> (8 * i)) & 0xff);
  return image + header + data;
}

std::string F32Bytes(const std::vector<float>& values) {
  std::string bytes(values.size() * sizeof(float), '\0');
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

// A 3x4 F32 matrix "w" holding 0..11 and a 2-element F16 vector "b".
std::string TwoTensorImage() {
  std::vector<float> w(12);
  for (int i = 0; i < 12; ++i) w[i] = static_cast<float>(i);
  const std::string header = R"({"__metadata__":{"format":"pt"},)"
                             R"("w":{"dtype":"F32","shape":[3,4],"data_offsets":[0,48]},)"
                             R"("b":{"dtype":"F16","shape":[2],"data_offsets":[48,52]}})";
  return Image(header, F32Bytes(w) + std::string("\x00\x3c\x00\x40", 4));
}

void ExpectRejected(const std::string& image, absl::StatusCode code, const std::string& piece) {
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::FromBytes(image);
  ASSERT_FALSE(file.ok()) << "expected an error containing " << piece;
  EXPECT_EQ(file.status().code(), code) << file.status();
  EXPECT_THAT(std::string(file.status().message()), HasSubstr(piece));
}

std::string OneTensor(const std::string& entry) { return absl::StrCat("{\"t\":", entry, "}"); }

TEST(SafetensorsFileTest, ParsesTensorsAndMetadata) {
  auto file = SafetensorsFile::FromBytes(TwoTensorImage());
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ((*file)->tensors().size(), 2u);
  EXPECT_EQ((*file)->metadata().at("format"), "pt");
  const SafetensorsTensorInfo* w = (*file)->FindTensor("w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->dtype, SafetensorsDtype::kF32);
  EXPECT_EQ(w->shape, (std::vector<uint64_t>{3, 4}));
  EXPECT_EQ(w->num_bytes, 48u);
  float third;
  std::memcpy(&third, (*file)->TensorData(*w).data() + 8, 4);
  EXPECT_EQ(third, 2.0f);
  const SafetensorsTensorInfo* b = (*file)->FindTensor("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->dtype, SafetensorsDtype::kF16);
  EXPECT_EQ((*file)->FindTensor("missing"), nullptr);
}

TEST(SafetensorsFileTest, RowsAreAViewOfTheMapping) {
  auto file = SafetensorsFile::FromBytes(TwoTensorImage());
  ASSERT_TRUE(file.ok());
  const SafetensorsTensorInfo& w = *(*file)->FindTensor("w");
  auto rows = (*file)->Rows(w, 1, 2);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(rows->size(), 32u);
  EXPECT_EQ(rows->data(), (*file)->TensorData(w).data() + 16);  // no copy
  float first;
  std::memcpy(&first, rows->data(), 4);
  EXPECT_EQ(first, 4.0f);
  EXPECT_EQ((*file)->Rows(w, 2, 2).status().code(), absl::StatusCode::kOutOfRange);
}

TEST(SafetensorsFileTest, ColumnsCopyOnlyTheSlice) {
  auto file = SafetensorsFile::FromBytes(TwoTensorImage());
  ASSERT_TRUE(file.ok());
  const SafetensorsTensorInfo& w = *(*file)->FindTensor("w");
  auto columns = (*file)->Columns(w, 1, 2);
  ASSERT_TRUE(columns.ok()) << columns.status();
  std::vector<float> values(6);
  ASSERT_EQ(columns->size(), 24u);
  std::memcpy(values.data(), columns->data(), 24);
  EXPECT_EQ(values, (std::vector<float>{1, 2, 5, 6, 9, 10}));
  EXPECT_EQ((*file)->Columns(w, 3, 2).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ((*file)->Columns(*(*file)->FindTensor("b"), 0, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// An empty tensor (a zero dimension, no bytes) slices to nothing. Found by the fuzz test:
// the copy read from a null span (its corpus keeps the input).
TEST(SafetensorsFileTest, ColumnsOfAnEmptyTensorAreEmpty) {
  auto file = SafetensorsFile::FromBytes(
      Image(R"({"e":{"dtype":"F16","shape":[2,0],"data_offsets":[0,0]}})", ""));
  ASSERT_TRUE(file.ok()) << file.status();
  auto columns = (*file)->Columns(*(*file)->FindTensor("e"), 0, 0);
  ASSERT_TRUE(columns.ok()) << columns.status();
  EXPECT_TRUE(columns->empty());
}

TEST(SafetensorsFileTest, RejectsTruncatedFiles) {
  ExpectRejected("abc", absl::StatusCode::kInvalidArgument, "truncated");
  const std::string image = TwoTensorImage();
  // Header length pointing past the end.
  ExpectRejected(image.substr(0, 20), absl::StatusCode::kInvalidArgument, "truncated");
  // Data cut short: the last tensor's span leaves the file.
  ExpectRejected(image.substr(0, image.size() - 1), absl::StatusCode::kOutOfRange, "'b'");
}

TEST(SafetensorsFileTest, RejectsAbsurdHeaderLength) {
  std::string image(16, '\0');
  image[7] = 0x7f;
  ExpectRejected(image, absl::StatusCode::kInvalidArgument, "exceeds the limit");
}

TEST(SafetensorsFileTest, RejectsMalformedHeaders) {
  ExpectRejected(Image("{not json", ""), absl::StatusCode::kInvalidArgument, "not valid JSON");
  ExpectRejected(Image("[1,2]", ""), absl::StatusCode::kInvalidArgument, "not a JSON object");
  ExpectRejected(Image(OneTensor(R"({"shape":[1],"data_offsets":[0,4]})"), "abcd"),
                 absl::StatusCode::kInvalidArgument, "'dtype'");
  ExpectRejected(Image(OneTensor(R"({"dtype":"F32","shape":[-1],"data_offsets":[0,4]})"), "abcd"),
                 absl::StatusCode::kInvalidArgument, "not a size");
  ExpectRejected(Image(OneTensor(R"({"dtype":"F32","shape":[1],"data_offsets":[4,0]})"), "abcd"),
                 absl::StatusCode::kOutOfRange, "data_offsets");
  ExpectRejected(Image(OneTensor(R"({"dtype":"F32","shape":[1],"data_offsets":[0]})"), "abcd"),
                 absl::StatusCode::kInvalidArgument, "data_offsets");
  ExpectRejected(Image(R"({"__metadata__":{"a":1}})", ""), absl::StatusCode::kInvalidArgument,
                 "__metadata__");
}

TEST(SafetensorsFileTest, RejectsShapeNotMatchingByteSpan) {
  ExpectRejected(Image(OneTensor(R"({"dtype":"F32","shape":[2],"data_offsets":[0,4]})"), "abcd"),
                 absl::StatusCode::kInvalidArgument, "needs 8 bytes but data_offsets span 4");
  ExpectRejected(
      Image(OneTensor(R"({"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]})"),
            "abcd"),
      absl::StatusCode::kInvalidArgument, "overflows");
}

TEST(SafetensorsFileTest, RefusesUnsupportedDtypesByName) {
  ExpectRejected(
      Image(OneTensor(R"({"dtype":"I64","shape":[1],"data_offsets":[0,8]})"), std::string(8, '\0')),
      absl::StatusCode::kUnimplemented, "dtype I64");
  ExpectRejected(Image(OneTensor(R"({"dtype":"Q9","shape":[1],"data_offsets":[0,1]})"), "a"),
                 absl::StatusCode::kInvalidArgument, "unknown dtype 'Q9'");
}

TEST(SafetensorsFileTest, RejectsOverlappingTensors) {
  const std::string header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})";
  ExpectRejected(Image(header, std::string(8, '\0')), absl::StatusCode::kInvalidArgument,
                 "overlap");
}

class SafetensorsCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void Write(const std::string& name, const std::string& bytes) {
    std::ofstream(dir_ / name, std::ios::binary) << bytes;
  }
  std::filesystem::path dir_;
};

std::string ScalarImage(const std::string& name, float value) {
  return Image(
      absl::StrCat(R"({")", name, R"(":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})"),
      F32Bytes({value}));
}

TEST_F(SafetensorsCheckpointTest, OpensASingleFile) {
  Write("model.safetensors", TwoTensorImage());
  auto checkpoint = SafetensorsCheckpoint::Open(dir_.string());
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  EXPECT_EQ((*checkpoint)->entries().size(), 2u);
  EXPECT_NE((*checkpoint)->Find("w").file, nullptr);
  EXPECT_EQ((*checkpoint)->Find("x").file, nullptr);
}

TEST_F(SafetensorsCheckpointTest, OpensShardsThroughTheIndex) {
  Write("model-00001-of-00002.safetensors", ScalarImage("a", 1.0f));
  Write("model-00002-of-00002.safetensors", ScalarImage("b", 2.0f));
  Write("model.safetensors.index.json",
        R"({"metadata":{},"weight_map":{"a":"model-00001-of-00002.safetensors",)"
        R"("b":"model-00002-of-00002.safetensors"}})");
  auto checkpoint = SafetensorsCheckpoint::Open(dir_.string());
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  SafetensorsCheckpoint::Entry b = (*checkpoint)->Find("b");
  ASSERT_NE(b.file, nullptr);
  float value;
  std::memcpy(&value, b.file->TensorData(*b.tensor).data(), 4);
  EXPECT_EQ(value, 2.0f);
}

TEST_F(SafetensorsCheckpointTest, RejectsAnIndexThatDisagreesWithTheShards) {
  Write("s1.safetensors", ScalarImage("a", 1.0f));
  Write("model.safetensors.index.json",
        R"({"weight_map":{"a":"s1.safetensors","z":"s1.safetensors"}})");
  auto checkpoint = SafetensorsCheckpoint::Open(dir_.string());
  ASSERT_FALSE(checkpoint.ok());
  EXPECT_THAT(std::string(checkpoint.status().message()), HasSubstr("'z' is missing"));
}

TEST_F(SafetensorsCheckpointTest, RejectsShardPathsOutsideTheDirectory) {
  Write("model.safetensors.index.json", R"({"weight_map":{"a":"../etc/passwd"}})");
  auto checkpoint = SafetensorsCheckpoint::Open(dir_.string());
  ASSERT_FALSE(checkpoint.ok());
  EXPECT_THAT(std::string(checkpoint.status().message()), HasSubstr("not a file in the directory"));
}

TEST_F(SafetensorsCheckpointTest, NamesWhatIsMissing) {
  auto checkpoint = SafetensorsCheckpoint::Open(dir_.string());
  ASSERT_FALSE(checkpoint.ok());
  EXPECT_EQ(checkpoint.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(checkpoint.status().message()), HasSubstr("model.safetensors"));
}

}  // namespace
}  // namespace loom::common
