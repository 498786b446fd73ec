#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cuda/gather.h"
#include "tests/kernels/cuda_test_util.h"

namespace loom::kernels::cuda {
namespace {

TEST(CudaGatherRowsTest, RejectsBadShapesBeforeLaunch) {
  float buffer[4] = {};
  int32_t index = 0;
  GatherRowsParams p{buffer, &index, buffer, DataType::kF32, DataType::kF32, 0, 4, 1, 0};
  absl::Status status = CheckGatherRowsParams(p);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("num_rows 0"), std::string::npos) << status;
  p.num_rows = 1;
  p.indices = nullptr;
  EXPECT_EQ(LaunchGatherRows(p, nullptr).code(), absl::StatusCode::kInvalidArgument);
  p.indices = &index;
  p.row_size = int64_t{65535} * 2048 + 1;  // more column chunks than a grid dimension holds
  status = CheckGatherRowsParams(p);
  EXPECT_NE(status.message().find("over 65535 * 2048"), std::string::npos) << status;
}

// A conversion only: the result is bit-exact. Indices repeat, come in any order, and some
// fall outside the table (rows of zeros); an index offset models a vocabulary slice.
TEST(CudaGatherRowsTest, GathersConvertedRowsAndZerosOutsideTheTable) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  uint32_t seed = 1;
  for (DataType src : {DataType::kF32, DataType::kF16, DataType::kBF16}) {
    for (DataType dst : {DataType::kF32, DataType::kF16, DataType::kBF16}) {
      for (auto [rows, row_size, offset] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 0},
                                            {50, 33, 0},
                                            {1000, 576, 7},
                                            {300, 4096, 100},
                                            {3, 14341, 0}}) {  // 8 column chunks, the last partial
        SCOPED_TRACE(testing::Message()
                     << DataTypeName(src) << "->" << DataTypeName(dst) << " rows=" << rows
                     << " row_size=" << row_size << " offset=" << offset);
        std::vector<float> table =
            testing_util::RoundTo(src, testing_util::RandomFloats(rows * row_size, ++seed, -4, 4));
        std::mt19937 rng(++seed);
        std::vector<int32_t> indices(37);
        for (int32_t& index : indices) {
          index = std::uniform_int_distribution<int32_t>(
              -3, static_cast<int32_t>(rows + offset + 3))(rng);
        }
        indices[0] = static_cast<int32_t>(offset);             // first row
        indices[1] = static_cast<int32_t>(offset + rows - 1);  // last row
        indices[2] = indices[1];
        std::vector<float> expected_f(indices.size() * row_size, 0.0f);
        for (size_t i = 0; i < indices.size(); ++i) {
          const int64_t row = indices[i] - offset;
          if (row < 0 || row >= rows) continue;
          std::copy_n(table.begin() + row * row_size, row_size, expected_f.begin() + i * row_size);
        }
        std::vector<double> expected =
            testing_util::ToDouble(testing_util::RoundTo(dst, expected_f));
        LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_table, testing_util::Upload(src, table));
        LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_indices, testing_util::UploadRaw(indices));
        LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_out, testing_util::Poisoned(dst, expected.size()));
        GatherRowsParams p{d_table.data(),
                           static_cast<const int32_t*>(d_indices.data()),
                           d_out.data(),
                           src,
                           dst,
                           rows,
                           row_size,
                           static_cast<int64_t>(indices.size()),
                           offset};
        ASSERT_TRUE(LaunchGatherRows(p, nullptr).ok());
        ASSERT_TRUE(SynchronizeStream(nullptr).ok());
        LOOM_ASSERT_OK_AND_ASSIGN(std::vector<float> out,
                                  testing_util::Download(d_out, dst, expected.size()));
        EXPECT_TRUE(testing_util::AllClose(out, expected, 0.0, 0.0));
        // Gemma's scaled embedding: every value times the scale, in float, then rounded.
        if (dst != DataType::kF32) continue;
        constexpr float kScale = 24.0f;  // sqrt(576)
        p.scale = kScale;
        ASSERT_TRUE(LaunchGatherRows(p, nullptr).ok());
        ASSERT_TRUE(SynchronizeStream(nullptr).ok());
        LOOM_ASSERT_OK_AND_ASSIGN(out, testing_util::Download(d_out, dst, expected.size()));
        for (float& value : expected_f) value *= kScale;
        EXPECT_TRUE(testing_util::AllClose(out, testing_util::ToDouble(expected_f), 0.0, 0.0));
      }
    }
  }
}

TEST(CudaScatterAddRowsTest, RejectsBadShapesBeforeLaunch) {
  float buffer[4] = {};
  int32_t index = 0;
  ScatterAddRowsParams p{buffer, &index, buffer, buffer, 0, 4, 1};
  const absl::Status status = CheckScatterAddRowsParams(p);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("num_out_rows 0"), std::string::npos) << status;
  p.num_out_rows = 1;
  p.weights = nullptr;
  EXPECT_EQ(LaunchScatterAddRows(p, nullptr).code(), absl::StatusCode::kInvalidArgument);
  p.num_indices = 0;  // nothing to add: no pointers needed
  EXPECT_TRUE(CheckScatterAddRowsParams(p).ok());
}

// A mixture-of-experts layer's add: each input row, weighted, into a distinct output row
// (in any order; an index outside the output is skipped), onto what the rows held.
TEST(CudaScatterAddRowsTest, AddsWeightedRowsIntoTheirOutputRows) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  uint32_t seed = 5;
  for (auto [out_rows, row_size] : {std::pair<int64_t, int64_t>{1, 1}, {40, 33}, {300, 4096}}) {
    SCOPED_TRACE(testing::Message() << "out_rows=" << out_rows << " row_size=" << row_size);
    std::vector<int32_t> indices(static_cast<size_t>(out_rows));
    std::iota(indices.begin(), indices.end(), 0);
    std::shuffle(indices.begin(), indices.end(), std::mt19937(++seed));
    indices.resize(static_cast<size_t>((out_rows + 1) / 2));
    indices.push_back(static_cast<int32_t>(out_rows + 3));  // outside: skipped
    const int64_t n = static_cast<int64_t>(indices.size());
    const std::vector<float> rows = testing_util::RandomFloats(n * row_size, ++seed, -2, 2);
    const std::vector<float> weights = testing_util::RandomFloats(n, ++seed, 0, 1);
    const std::vector<float> before =
        testing_util::RandomFloats(out_rows * row_size, ++seed, -1, 1);
    std::vector<double> expected(before.begin(), before.end());
    for (int64_t i = 0; i + 1 < n; ++i) {
      for (int64_t c = 0; c < row_size; ++c) {
        expected[indices[i] * row_size + c] +=
            static_cast<double>(weights[i]) * rows[i * row_size + c];
      }
    }
    LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_rows, testing_util::UploadRaw(rows));
    LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_indices, testing_util::UploadRaw(indices));
    LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_weights, testing_util::UploadRaw(weights));
    LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_out, testing_util::UploadRaw(before));
    ScatterAddRowsParams p;
    p.rows = static_cast<const float*>(d_rows.data());
    p.indices = static_cast<const int32_t*>(d_indices.data());
    p.weights = static_cast<const float*>(d_weights.data());
    p.out = static_cast<float*>(d_out.data());
    p.num_out_rows = out_rows;
    p.row_size = row_size;
    p.num_indices = n;
    ASSERT_TRUE(LaunchScatterAddRows(p, nullptr).ok());
    ASSERT_TRUE(SynchronizeStream(nullptr).ok());
    LOOM_ASSERT_OK_AND_ASSIGN(std::vector<float> out,
                              testing_util::Download(d_out, DataType::kF32, before.size()));
    // One FMA or multiply-add per element: within a float rounding of the host's.
    EXPECT_TRUE(testing_util::AllClose(out, expected, 1e-6, 1e-6));
  }
}

TEST(CudaSplitColumnsTest, RejectsBadShapesBeforeLaunch) {
  float buffer[8] = {};
  SplitColumnsParams p;
  p.x = buffer;
  p.parts[0] = buffer;
  p.cols[0] = 4;
  p.num_parts = 1;
  p.rows = 1;
  EXPECT_TRUE(CheckSplitColumnsParams(p).ok()) << CheckSplitColumnsParams(p);
  p.num_parts = kSplitColumnsMaxParts + 1;
  EXPECT_EQ(LaunchSplitColumns(p, nullptr).code(), absl::StatusCode::kInvalidArgument);
  p.num_parts = 2;  // part 1 has no columns
  EXPECT_NE(CheckSplitColumnsParams(p).message().find("part 1 has 0 columns"), std::string::npos);
  p.num_parts = 1;
  p.x_stride = 3;
  EXPECT_NE(CheckSplitColumnsParams(p).message().find("x_stride 3"), std::string::npos);
}

// Every part holds its columns of every row exactly, with x's rows longer than the parts.
TEST(CudaSplitColumnsTest, CopiesEachPartsColumns) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  for (const std::vector<int64_t>& cols :
       {std::vector<int64_t>{1}, {576, 192, 192}, {7, 1, 3, 9}, {4096, 1024, 1024}}) {
    for (const int64_t rows : {1, 5, 300}) {
      int64_t width = 0;
      for (int64_t c : cols) width += c;
      const int64_t stride = width + 3;
      SCOPED_TRACE(testing::Message()
                   << "parts " << cols.size() << " width " << width << " rows " << rows);
      const std::vector<float> x = testing_util::RandomFloats(rows * stride, 77, -1, 1);
      LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_x, testing_util::Upload(DataType::kF32, x));
      std::vector<DeviceBuffer> parts;
      SplitColumnsParams p;
      p.x = static_cast<const float*>(d_x.data());
      p.x_stride = stride;
      p.rows = rows;
      p.num_parts = static_cast<int>(cols.size());
      for (size_t j = 0; j < cols.size(); ++j) {
        LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer part,
                                  testing_util::Poisoned(DataType::kF32, rows * cols[j]));
        p.parts[j] = static_cast<float*>(part.data());
        p.cols[j] = cols[j];
        parts.push_back(std::move(part));
      }
      ASSERT_TRUE(LaunchSplitColumns(p, nullptr).ok());
      ASSERT_TRUE(SynchronizeStream(nullptr).ok());
      int64_t offset = 0;
      for (size_t j = 0; j < cols.size(); ++j) {
        LOOM_ASSERT_OK_AND_ASSIGN(std::vector<float> got,
                                  testing_util::Download(parts[j], DataType::kF32, rows * cols[j]));
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t c = 0; c < cols[j]; ++c) {
            ASSERT_EQ(got[r * cols[j] + c], x[r * stride + offset + c])
                << "part " << j << " row " << r << " column " << c;
          }
        }
        offset += cols[j];
      }
    }
  }
}

}  // namespace
}  // namespace loom::kernels::cuda
