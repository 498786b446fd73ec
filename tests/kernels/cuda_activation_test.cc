#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/cpu/activation.h"
#include "kernels/cuda/activation.h"
#include "tests/kernels/cuda_test_util.h"

namespace loom::kernels::cuda {
namespace {

using testing_util::AllClose;

TEST(CudaSiluMulTest, RejectsBadShapesBeforeLaunch) {
  float buffer[4] = {};
  SiluMulParams p{buffer, buffer, DataType::kF16, 1, 0};
  EXPECT_EQ(CheckSiluMulParams(p).code(), absl::StatusCode::kInvalidArgument);
  p.ffn = 2;
  p.out = nullptr;
  EXPECT_EQ(LaunchSiluMul(p, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

TEST(CudaSiluMulTest, MatchesCpuReference) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  uint32_t seed = 1;
  for (DataType dtype : {DataType::kF32, DataType::kF16, DataType::kBF16}) {
    for (auto [tokens, ffn] :
         {std::pair<int64_t, int64_t>{1, 1}, {3, 37}, {8, 1536}, {1, 14336}, {61, 2731}}) {
      SCOPED_TRACE(testing::Message()
                   << DataTypeName(dtype) << " tokens=" << tokens << " ffn=" << ffn);
      // Gates reach +-20 so both tails of the sigmoid are covered.
      std::vector<float> gate_up = testing_util::RoundTo(
          dtype, testing_util::RandomFloats(tokens * 2 * ffn, ++seed, -20, 20));
      std::vector<float> expected(tokens * ffn);
      cpu::SiluMulReference(gate_up.data(), tokens, ffn, expected.data());
      LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_in, testing_util::Upload(dtype, gate_up));
      LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_out, testing_util::Poisoned(dtype, tokens * ffn));
      ASSERT_TRUE(LaunchSiluMul({d_in.data(), d_out.data(), dtype, tokens, ffn}, nullptr).ok());
      ASSERT_TRUE(SynchronizeStream(nullptr).ok());
      LOOM_ASSERT_OK_AND_ASSIGN(std::vector<float> out,
                                testing_util::Download(d_out, dtype, tokens * ffn));
      const double tol = testing_util::RoundingTolerance(dtype);
      EXPECT_TRUE(AllClose(out, testing_util::ToDouble(expected), tol, tol));
    }
  }
}

}  // namespace
}  // namespace loom::kernels::cuda
