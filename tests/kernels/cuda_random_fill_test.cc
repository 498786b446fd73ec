#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cuda/random_fill.h"
#include "tests/kernels/cuda_test_util.h"

namespace loom::kernels::cuda {
namespace {

TEST(CudaRandomFillTest, RejectsBadParamsBeforeLaunch) {
  float buffer[4] = {};
  RandomFillParams p{buffer, DataType::kF32, -1, 1, 0.0f, 1.0f};
  EXPECT_EQ(CheckRandomFillParams(p).code(), absl::StatusCode::kInvalidArgument);
  p.count = 4;
  p.scale = -1.0f;
  EXPECT_EQ(CheckRandomFillParams(p).code(), absl::StatusCode::kInvalidArgument);
  p.scale = NAN;
  EXPECT_EQ(CheckRandomFillParams(p).code(), absl::StatusCode::kInvalidArgument);
  p.scale = 1.0f;
  p.out = nullptr;
  EXPECT_EQ(LaunchRandomFill(p, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

TEST(CudaRandomFillTest, HostReferenceIsUniformWithinScaleAndDependsOnSeed) {
  constexpr int64_t kCount = 1 << 16;
  double sum = 0.0;
  float low = 1.0f, high = -1.0f;
  int64_t same_as_other_seed = 0;
  for (int64_t i = 0; i < kCount; ++i) {
    const float value = RandomFillValue(7, i, 0.0f, 0.5f);
    sum += value;
    low = std::min(low, value);
    high = std::max(high, value);
    if (value == RandomFillValue(8, i, 0.0f, 0.5f)) ++same_as_other_seed;
  }
  EXPECT_GE(low, -0.5f);
  EXPECT_LT(high, 0.5f);
  EXPECT_LT(low, -0.49f);
  EXPECT_GT(high, 0.49f);
  // Mean of U(-0.5, 0.5) over 2^16 draws: standard error 0.0011.
  EXPECT_NEAR(sum / kCount, 0.0, 0.006);
  EXPECT_LT(same_as_other_seed, 16);
  EXPECT_EQ(RandomFillValue(3, 5, 1.0f, 0.0f), 1.0f);
}

TEST(CudaRandomFillTest, MatchesCpuReferenceBitForBit) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  uint64_t seed = 11;
  for (DataType dtype : {DataType::kF32, DataType::kF16, DataType::kBF16}) {
    for (int64_t count : {int64_t{1}, int64_t{37}, int64_t{4096}, int64_t{1} << 20}) {
      for (auto [offset, scale] : {std::pair<float, float>{0.0f, 1.0f}, {0.0f, 0.015625f},
                                   {1.0f, 0.0f}, {-2.5f, 0.3f}}) {
        ++seed;
        SCOPED_TRACE(testing::Message() << DataTypeName(dtype) << " count=" << count
                                        << " offset=" << offset << " scale=" << scale);
        std::vector<float> expected(count);
        for (int64_t i = 0; i < count; ++i) {
          expected[i] = RandomFillValue(seed, i, offset, scale);
        }
        expected = testing_util::RoundTo(dtype, expected);
        LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_out, testing_util::Poisoned(dtype, count));
        ASSERT_TRUE(
            LaunchRandomFill({d_out.data(), dtype, count, seed, offset, scale}, nullptr).ok());
        ASSERT_TRUE(SynchronizeStream(nullptr).ok());
        LOOM_ASSERT_OK_AND_ASSIGN(std::vector<float> out,
                                  testing_util::Download(d_out, dtype, count));
        EXPECT_TRUE(testing_util::AllClose(out, testing_util::ToDouble(expected), 0.0, 0.0));
      }
    }
  }
}

}  // namespace
}  // namespace loom::kernels::cuda
