#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/norm.h"
#include "kernels/cuda/norm.h"
#include "tests/kernels/cuda_test_util.h"

namespace loom::kernels::cuda {
namespace {

using testing_util::AllClose;

TEST(CudaRmsNormTest, RejectsASecondOutputOfAFullPrecisionType) {
  float buffer[4] = {};
  RmsNormParams p;
  p.x = p.out = p.out_low = buffer;
  p.weight = buffer;
  p.num_tokens = 1;
  p.hidden = 4;
  p.low_dtype = DataType::kF32;
  const absl::Status status = CheckRmsNormParams(p);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("low_dtype F32"), std::string::npos) << status;
}

TEST(CudaRmsNormTest, RejectsBadShapesBeforeLaunch) {
  float dummy[4] = {};
  RmsNormParams p{dummy, nullptr, dummy, dummy, DataType::kF32, 1e-5f, 1, 0};
  absl::Status status = CheckRmsNormParams(p);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("hidden 0"), std::string::npos) << status;
  p.hidden = 65537;
  EXPECT_EQ(LaunchRmsNorm(p, nullptr).code(), absl::StatusCode::kInvalidArgument);
  p.hidden = 4;
  p.eps = std::nanf("");
  EXPECT_EQ(LaunchRmsNorm(p, nullptr).code(), absl::StatusCode::kInvalidArgument);
  p.eps = 1e-5f;
  p.weight = nullptr;
  EXPECT_EQ(LaunchRmsNorm(p, nullptr).code(), absl::StatusCode::kInvalidArgument);
  p.num_tokens = 0;  // nothing to do: no pointer is needed
  EXPECT_TRUE(CheckRmsNormParams(p).ok());
}

// Against cpu::RmsNormReference (double) on the values as stored in dtype. The fused path's
// residual must equal the float sum rounded to dtype bit for bit.
TEST(CudaRmsNormTest, MatchesCpuReferenceOverShapesAndTypes) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  uint32_t seed = 1;
  for (DataType dtype : {DataType::kF32, DataType::kF16, DataType::kBF16}) {
    for (bool fused : {false, true}) {
      for (auto [tokens, hidden] : {std::pair<int64_t, int64_t>{1, 1},
                                    {3, 31},
                                    {7, 576},
                                    {5, 1000},
                                    {2, 4096},
                                    {1, 8195},
                                    {33, 2048}}) {
        SCOPED_TRACE(testing::Message() << DataTypeName(dtype) << " fused=" << fused
                                        << " tokens=" << tokens << " hidden=" << hidden);
        const int64_t n = tokens * hidden;
        std::vector<float> x =
            testing_util::RoundTo(dtype, testing_util::RandomFloats(n, ++seed, -3, 3));
        std::vector<float> residual =
            testing_util::RoundTo(dtype, testing_util::RandomFloats(n, ++seed, -3, 3));
        std::vector<float> weight = testing_util::RandomFloats(hidden, ++seed, 0.5f, 1.5f);
        const float eps = 1e-6f;
        // Expected residual: the float sum rounded to dtype, as the kernel stores it.
        std::vector<float> sum(n);
        for (int64_t i = 0; i < n; ++i) sum[i] = residual[i] + x[i];
        sum = testing_util::RoundTo(dtype, sum);
        std::vector<float> expected(n);
        cpu::RmsNormReference(fused ? sum.data() : x.data(), weight.data(), eps, tokens, hidden,
                              expected.data());

        LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_x, testing_util::Upload(dtype, x));
        LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_residual, testing_util::Upload(dtype, residual));
        LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_weight,
                                  testing_util::Upload(DataType::kF32, weight));
        LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_out, testing_util::Poisoned(dtype, n));
        // The second output, in the other half-precision type where dtype is one of them.
        const DataType low = dtype == DataType::kF16 ? DataType::kBF16 : DataType::kF16;
        LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_low, testing_util::Poisoned(low, n));
        RmsNormParams p;
        p.x = d_x.data();
        p.residual = fused ? d_residual.data() : nullptr;
        p.weight = static_cast<const float*>(d_weight.data());
        p.out = d_out.data();
        p.dtype = dtype;
        p.eps = eps;
        p.num_tokens = tokens;
        p.hidden = hidden;
        p.out_low = d_low.data();
        p.low_dtype = low;
        ASSERT_TRUE(LaunchRmsNorm(p, nullptr).ok());
        ASSERT_TRUE(SynchronizeStream(nullptr).ok());
        LOOM_ASSERT_OK_AND_ASSIGN(std::vector<float> out, testing_util::Download(d_out, dtype, n));
        // out_low is out rounded once more, bit for bit.
        LOOM_ASSERT_OK_AND_ASSIGN(std::vector<float> out_low,
                                  testing_util::Download(d_low, low, n));
        EXPECT_TRUE(
            AllClose(out_low, testing_util::ToDouble(testing_util::RoundTo(low, out)), 0.0, 0.0));
        const double tol = testing_util::RoundingTolerance(dtype);
        EXPECT_TRUE(AllClose(out, testing_util::ToDouble(expected), tol, tol));
        if (fused) {
          LOOM_ASSERT_OK_AND_ASSIGN(std::vector<float> stored,
                                    testing_util::Download(d_residual, dtype, n));
          EXPECT_TRUE(AllClose(stored, testing_util::ToDouble(sum), 0.0, 0.0));
        }
      }
    }
  }
}

TEST(CudaRmsNormTest, OutputMayAliasInput) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  const int64_t tokens = 4, hidden = 3000;
  std::vector<float> x = testing_util::RandomFloats(tokens * hidden, 99);
  std::vector<float> weight = testing_util::RandomFloats(hidden, 100, 0.5f, 1.5f);
  std::vector<float> expected(x.size());
  cpu::RmsNormReference(x.data(), weight.data(), 1e-5f, tokens, hidden, expected.data());
  LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_x, testing_util::Upload(DataType::kF32, x));
  LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_weight, testing_util::Upload(DataType::kF32, weight));
  RmsNormParams p{d_x.data(), nullptr,        static_cast<const float*>(d_weight.data()),
                  d_x.data(), DataType::kF32, 1e-5f,
                  tokens,     hidden};
  ASSERT_TRUE(LaunchRmsNorm(p, nullptr).ok());
  ASSERT_TRUE(SynchronizeStream(nullptr).ok());
  LOOM_ASSERT_OK_AND_ASSIGN(std::vector<float> out,
                            testing_util::Download(d_x, DataType::kF32, x.size()));
  EXPECT_TRUE(AllClose(out, testing_util::ToDouble(expected), 1e-5, 1e-5));
}

}  // namespace
}  // namespace loom::kernels::cuda
