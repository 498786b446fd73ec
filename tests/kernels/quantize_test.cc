#include "kernels/cpu/quantize.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <tuple>
#include <vector>

#include "gmock/gmock.h"
#include "kernels/cpu/matmul_internal.h"

namespace loom::kernels::cpu {
namespace {

using ::testing::HasSubstr;

// Normal weights with a few outliers (what real layers look like), never all zeros.
std::vector<float> RandomWeights(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  std::uniform_int_distribution<int> pick(0, 63);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng) * (pick(rng) == 0 ? 20.0f : 1.0f);
  return v;
}

std::vector<float> Unpack(const PackedWeight& w) {
  std::vector<float> out(w.rows * w.cols, std::nanf(""));
  DequantizeRows(w, 0, w.rows, out.data());
  return out;
}

using Case = std::tuple<WeightFormat, int64_t, int64_t, int64_t>;  // format, rows, cols, group

class QuantizeRtnTest : public testing::TestWithParam<Case> {};

// PackFromF32 is the backend's own round-to-nearest: QuantizeRtn + PackQuantized must
// give the same bytes, so a file written by `loom quantize` loads as exactly what
// re-quantizing in the backend would hold.
TEST_P(QuantizeRtnTest, PacksToTheSameBytesAsPackFromF32) {
  const auto [format, rows, cols, group] = GetParam();
  const std::vector<float> w = RandomWeights(rows * cols, static_cast<uint32_t>(rows * 131 + cols));
  absl::StatusOr<QuantizedMatrix> q = QuantizeRtn(w.data(), rows, cols, format, group);
  ASSERT_TRUE(q.ok()) << q.status();
  absl::StatusOr<PackedWeight> packed = PackQuantized(*q);
  ASSERT_TRUE(packed.ok()) << packed.status();
  absl::StatusOr<PackedWeight> reference = PackFromF32(w.data(), rows, cols, format, group);
  ASSERT_TRUE(reference.ok());
  EXPECT_EQ(packed->data, reference->data);
  EXPECT_EQ(packed->scales, reference->scales);
  EXPECT_EQ(packed->mins, reference->mins);
  EXPECT_EQ(packed->group_size, group);

  // The scalar dequantization equals the backend's, and both are within half a step.
  std::vector<float> deq(rows * cols, std::nanf(""));
  DequantizeMatrix(*q, deq.data());
  const std::vector<float> backend = Unpack(*packed);
  const int64_t groups = cols / group;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t i = r * cols + c;
      ASSERT_FALSE(std::isnan(deq[i]));
      ASSERT_EQ(deq[i], backend[i]) << r << "," << c;
      const float scale = internal::HalfToFloat(q->scales[r * groups + c / group]);
      // Half a step, plus the F16 rounding of the scale (and min) stretching the grid.
      EXPECT_LE(std::fabs(deq[i] - w[i]), 0.5f * scale + 0.01f * std::fabs(w[i]) + 1e-6f)
          << r << "," << c;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, QuantizeRtnTest,
                         testing::Values(Case{WeightFormat::kInt8, 1, 32, 32},
                                         Case{WeightFormat::kInt8, 37, 576, 576},
                                         Case{WeightFormat::kInt8, 16, 1536, 128},
                                         Case{WeightFormat::kInt4, 1, 64, 32},
                                         Case{WeightFormat::kInt4, 45, 576, 64},
                                         Case{WeightFormat::kInt4, 33, 1536, 128},
                                         Case{WeightFormat::kInt4, 17, 384, 96}));

TEST(QuantizeRtnTest, ConstantAndZeroGroupsAreExact) {
  // INT4 keeps a constant group in its min (scale 0); both formats keep zeros.
  std::vector<float> w(64, 0.25f);
  for (int i = 32; i < 64; ++i) w[i] = 0.0f;
  absl::StatusOr<QuantizedMatrix> q = QuantizeRtn(w.data(), 1, 64, WeightFormat::kInt4, 32);
  ASSERT_TRUE(q.ok());
  std::vector<float> deq(64);
  DequantizeMatrix(*q, deq.data());
  EXPECT_EQ(deq, w);
  q = QuantizeRtn(w.data(), 1, 64, WeightFormat::kInt8, 32);
  ASSERT_TRUE(q.ok());
  DequantizeMatrix(*q, deq.data());
  for (int i = 32; i < 64; ++i) EXPECT_EQ(deq[i], 0.0f);
  EXPECT_EQ(q->q[0], 127);
}

TEST(QuantizeRtnTest, RejectsGroupsTheKernelsCannotRun) {
  std::vector<float> w(96, 1.0f);
  EXPECT_THAT(QuantizeRtn(w.data(), 1, 96, WeightFormat::kInt4, 64).status().message(),
              HasSubstr("group size 64 must be a positive multiple of 32 dividing cols 96"));
  EXPECT_THAT(QuantizeRtn(w.data(), 1, 96, WeightFormat::kInt4, 48).status().message(),
              HasSubstr("group size 48"));
  EXPECT_FALSE(QuantizeRtn(w.data(), 1, 96, WeightFormat::kF16, 32).ok());
}

TEST(ValidateQuantizedMatrixTest, RejectsWrongSizesAndRanges) {
  std::vector<float> w = RandomWeights(2 * 64, 3);
  QuantizedMatrix q = QuantizeRtn(w.data(), 2, 64, WeightFormat::kInt4, 32).value();
  EXPECT_TRUE(ValidateQuantizedMatrix(q).ok());
  QuantizedMatrix bad = q;
  bad.q[5] = 16;
  EXPECT_THAT(ValidateQuantizedMatrix(bad).message(), HasSubstr("value 16 at row 0 col 5"));
  bad = q;
  bad.mins.pop_back();
  EXPECT_THAT(ValidateQuantizedMatrix(bad).message(), HasSubstr("mins"));
  bad = q;
  bad.group_size = 64;
  EXPECT_FALSE(ValidateQuantizedMatrix(bad).ok());
  EXPECT_FALSE(PackQuantized(bad).ok());
}

TEST(SliceColumnsTest, GroupAlignedSlicesKeepTheirGroups) {
  const int64_t rows = 19, cols = 512;
  std::vector<float> w = RandomWeights(rows * cols, 5);
  QuantizedMatrix q = QuantizeRtn(w.data(), rows, cols, WeightFormat::kInt4, 128).value();
  std::vector<float> whole(rows * cols);
  DequantizeMatrix(q, whole.data());
  absl::StatusOr<QuantizedMatrix> slice = SliceColumns(q, 128, 256);
  ASSERT_TRUE(slice.ok()) << slice.status();
  EXPECT_EQ(slice->group_size, 128);
  std::vector<float> part(rows * 256);
  DequantizeMatrix(*slice, part.data());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < 256; ++c) ASSERT_EQ(part[r * 256 + c], whole[r * cols + 128 + c]);
  }
  EXPECT_THAT(SliceColumns(q, 64, 256).status().message(),
              HasSubstr("do not fall on the 128-column quantization groups"));
  EXPECT_FALSE(SliceColumns(q, 384, 256).ok());  // past the end
}

TEST(SliceColumnsTest, PerChannelInt8SplitsAnywhereOnThirtyTwoColumns) {
  // SmolLM2's O projection split 5 + 4 heads over two ranks: columns [0, 320), [320, 576).
  const int64_t rows = 7, cols = 576;
  std::vector<float> w = RandomWeights(rows * cols, 9);
  QuantizedMatrix q = QuantizeRtn(w.data(), rows, cols, WeightFormat::kInt8, cols).value();
  std::vector<float> whole(rows * cols);
  DequantizeMatrix(q, whole.data());
  for (auto [begin, count] : std::vector<std::pair<int64_t, int64_t>>{{0, 320}, {320, 256}}) {
    absl::StatusOr<QuantizedMatrix> slice = SliceColumns(q, begin, count);
    ASSERT_TRUE(slice.ok()) << slice.status();
    EXPECT_EQ(slice->group_size, count);
    std::vector<float> part(rows * count);
    DequantizeMatrix(*slice, part.data());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < count; ++c) {
        ASSERT_EQ(part[r * count + c], whole[r * cols + begin + c]);
      }
    }
  }
  EXPECT_FALSE(SliceColumns(q, 0, 300).ok());  // not a multiple of 32
}

}  // namespace
}  // namespace loom::kernels::cpu
