#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <tuple>
#include <vector>

#include "kernels/cuda/gemm.h"
#include "tests/kernels/cuda_test_util.h"

namespace loom::kernels::cuda {
namespace {

GemmParams ValidParams(void* x, void* w, void* y) {
  GemmParams p;
  p.x = x;
  p.w = w;
  p.y = y;
  p.dtype = DataType::kF16;
  p.y_dtype = DataType::kF16;
  p.m = 2;
  p.n = 3;
  p.k = 4;
  return p;
}

TEST(CudaGemmTest, RejectsBadShapesAndTypesBeforeAnyCudaCall) {
  uint16_t x[8] = {}, w[12] = {}, y[6] = {};
  EXPECT_TRUE(CheckGemmParams(ValidParams(x, w, y)).ok());

  GemmParams p = ValidParams(x, w, y);
  p.dtype = DataType::kF32;
  absl::Status status = CheckGemmParams(p);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("dtype F32"), std::string::npos) << status;

  p = ValidParams(x, w, y);
  p.dtype = DataType::kF16;
  p.y_dtype = DataType::kBF16;  // neither the input type nor F32
  EXPECT_EQ(CheckGemmParams(p).code(), absl::StatusCode::kInvalidArgument);
  p.y_dtype = DataType::kF32;
  EXPECT_TRUE(CheckGemmParams(p).ok());

  p = ValidParams(x, w, y);
  p.n = 0;
  status = CheckGemmParams(p);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("n 0"), std::string::npos) << status;
  p = ValidParams(x, w, y);
  p.k = 0;
  EXPECT_EQ(CheckGemmParams(p).code(), absl::StatusCode::kInvalidArgument);
  p = ValidParams(x, w, y);
  p.m = -1;
  EXPECT_EQ(CheckGemmParams(p).code(), absl::StatusCode::kInvalidArgument);
  p = ValidParams(x, w, y);
  p.k = int64_t{1} << 31;  // cuBLAS sizes are int
  EXPECT_EQ(CheckGemmParams(p).code(), absl::StatusCode::kInvalidArgument);

  p = ValidParams(x, w, y);
  p.w = nullptr;
  EXPECT_EQ(CheckGemmParams(p).code(), absl::StatusCode::kInvalidArgument);
  p.m = 0;  // nothing to compute: no pointer is needed
  EXPECT_TRUE(CheckGemmParams(p).ok());

  p = ValidParams(x, w, x);  // y aliasing x
  EXPECT_EQ(CheckGemmParams(p).code(), absl::StatusCode::kInvalidArgument);
}

TEST(CudaGemmTest, HandleCreationFailsCleanlyWithoutADevice) {
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "a CUDA device is present";
  absl::StatusOr<std::unique_ptr<GemmHandle>> handle = GemmHandle::Create(nullptr);
  ASSERT_FALSE(handle.ok());
  EXPECT_EQ(handle.status().code(), absl::StatusCode::kFailedPrecondition) << handle.status();
}

// y = x · wᵀ (+ bias) in double from the values the device holds.
std::vector<double> Reference(const std::vector<float>& x, const std::vector<float>& w,
                              const std::vector<float>* bias, int64_t m, int64_t n, int64_t k,
                              std::vector<double>& abs_sum) {
  std::vector<double> y(m * n);
  abs_sum.assign(m * n, 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0.0, magnitude = 0.0;
      for (int64_t l = 0; l < k; ++l) {
        const double product = static_cast<double>(x[i * k + l]) * w[j * k + l];
        sum += product;
        magnitude += std::abs(product);
      }
      y[i * n + j] = sum + (bias != nullptr ? (*bias)[j] : 0.0);
      abs_sum[i * n + j] = magnitude;
    }
  }
  return y;
}

// Tolerance: |y - ref| <= rtol * |ref| + 1e-5 * sum_k |x_k w_k|, rtol the output type's
// rounding (F16 1e-3, BF16 8e-3, F32 1e-5): products of F16/BF16 values are exact in F32,
// so what remains is F32 accumulation (order and split-K vary with cuBLAS's algorithm)
// and the final rounding. With a bias and an F16/BF16 output, LaunchGemm's documented
// result is round(round(x·wᵀ) + bias): the product is rounded once before the bias, which
// adds rtol * |x·wᵀ| (the first H100 run failed F16 m=1 n=4097 k=96 with a bias that
// cancelled most of the product: error 4.4e-4, half an F16 ulp of a product near 3).
// A wrong layout or transpose errs by O(|ref|).
TEST(CudaGemmTest, MatchesCpuReferenceOverShapesTypesAndBias) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  absl::StatusOr<std::unique_ptr<GemmHandle>> created = GemmHandle::Create(nullptr);
  ASSERT_TRUE(created.ok()) << created.status();
  GemmHandle& handle = **created;
  uint32_t seed = 7;
  const std::vector<std::tuple<int64_t, int64_t, int64_t>> shapes = {
      {1, 1, 1},    {1, 7, 64},    {1, 257, 576},  {1, 4097, 96},  {3, 1000, 33},
      {16, 64, 1536}, {33, 257, 576}, {128, 513, 256}, {200, 96, 4096}, {5, 49, 2048}};
  for (auto [dtype, y_dtype] : {std::pair{DataType::kF16, DataType::kF16},
                                {DataType::kF16, DataType::kF32},
                                {DataType::kBF16, DataType::kBF16},
                                {DataType::kBF16, DataType::kF32}}) {
    for (const auto& [m, n, k] : shapes) {
      for (bool with_bias : {false, true}) {
        SCOPED_TRACE(testing::Message() << DataTypeName(dtype) << "->" << DataTypeName(y_dtype)
                                        << " m=" << m << " n=" << n << " k=" << k
                                        << (with_bias ? " bias" : ""));
        const std::vector<float> x =
            testing_util::RoundTo(dtype, testing_util::RandomFloats(m * k, ++seed));
        const std::vector<float> w =
            testing_util::RoundTo(dtype, testing_util::RandomFloats(n * k, ++seed));
        const std::vector<float> bias = testing_util::RandomFloats(n, ++seed, -2, 2);
        std::vector<double> abs_sum;
        const std::vector<double> expected =
            Reference(x, w, with_bias ? &bias : nullptr, m, n, k, abs_sum);

        LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_x, testing_util::Upload(dtype, x));
        LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_w, testing_util::Upload(dtype, w));
        LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_bias, testing_util::UploadRaw(bias));
        LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_y, testing_util::Poisoned(y_dtype, m * n));
        GemmParams p;
        p.x = d_x.data();
        p.w = d_w.data();
        p.bias = with_bias ? static_cast<const float*>(d_bias.data()) : nullptr;
        p.y = d_y.data();
        p.dtype = dtype;
        p.y_dtype = y_dtype;
        p.m = m;
        p.n = n;
        p.k = k;
        ASSERT_TRUE(LaunchGemm(p, handle).ok());
        ASSERT_TRUE(SynchronizeStream(handle.stream()).ok());
        LOOM_ASSERT_OK_AND_ASSIGN(std::vector<float> y,
                                  testing_util::Download(d_y, y_dtype, m * n));

        const double rtol = testing_util::RoundingTolerance(y_dtype);
        double worst = 0.0;
        for (int64_t i = 0; i < m * n; ++i) {
          ASSERT_FALSE(std::isnan(y[i])) << "NaN at " << i << " (an element never written)";
          const double error = std::abs(y[i] - expected[i]);
          const double product = expected[i] - (with_bias ? bias[i % n] : 0.0);
          const double rounded_twice =
              with_bias && y_dtype != DataType::kF32 ? rtol * std::abs(product) : 0.0;
          const double limit =
              rtol * std::abs(expected[i]) + rounded_twice + 1e-5 * abs_sum[i] + 1e-6;
          worst = std::max(worst, error / limit);
          ASSERT_LE(error, limit) << "at row " << i / n << " col " << i % n << ": " << y[i]
                                  << " vs " << expected[i];
        }
        EXPECT_LE(worst, 1.0);
      }
    }
  }
}

TEST(CudaGemmTest, EmptyBatchLaunchesNothing) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  absl::StatusOr<std::unique_ptr<GemmHandle>> handle = GemmHandle::Create(nullptr);
  ASSERT_TRUE(handle.ok()) << handle.status();
  GemmParams p;
  p.m = 0;
  p.n = 5;
  p.k = 3;
  EXPECT_TRUE(LaunchGemm(p, **handle).ok());
  EXPECT_TRUE(SynchronizeStream(nullptr).ok());
}

}  // namespace
}  // namespace loom::kernels::cuda
