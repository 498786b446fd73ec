#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/activation.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cuda/activation.h"
#include "tests/kernels/cuda_test_util.h"

namespace loom::kernels::cuda {
namespace {

using testing_util::AllClose;

// `p`'s activation over `gate_up` [tokens, 2 * ffn] uploaded in p.dtype (its gate_up, out
// and shape set here), the output downloaded as float.
absl::StatusOr<std::vector<float>> RunGated(SiluMulParams p, const std::vector<float>& gate_up,
                                            int64_t tokens, int64_t ffn) {
  absl::StatusOr<DeviceBuffer> in = testing_util::Upload(p.dtype, gate_up);
  if (!in.ok()) return in.status();
  absl::StatusOr<DeviceBuffer> out = testing_util::Poisoned(p.dtype, tokens * ffn);
  if (!out.ok()) return out.status();
  p.gate_up = in->data();
  p.out = out->data();
  p.num_tokens = tokens;
  p.ffn = ffn;
  if (absl::Status status = LaunchSiluMul(p, nullptr); !status.ok()) return status;
  if (absl::Status status = SynchronizeStream(nullptr); !status.ok()) return status;
  return testing_util::Download(*out, p.dtype, tokens * ffn);
}

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
      // The second output (the down projection's input), in the other half-precision type.
      const DataType low = dtype == DataType::kF16 ? DataType::kBF16 : DataType::kF16;
      LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_low, testing_util::Poisoned(low, tokens * ffn));
      SiluMulParams p{d_in.data(), d_out.data(), dtype, tokens, ffn};
      p.out_low = d_low.data();
      p.low_dtype = low;
      ASSERT_TRUE(LaunchSiluMul(p, nullptr).ok());
      ASSERT_TRUE(SynchronizeStream(nullptr).ok());
      LOOM_ASSERT_OK_AND_ASSIGN(std::vector<float> out,
                                testing_util::Download(d_out, dtype, tokens * ffn));
      const double tol = testing_util::RoundingTolerance(dtype);
      EXPECT_TRUE(AllClose(out, testing_util::ToDouble(expected), tol, tol));
      LOOM_ASSERT_OK_AND_ASSIGN(std::vector<float> out_low,
                                testing_util::Download(d_low, low, tokens * ffn));
      EXPECT_TRUE(
          AllClose(out_low, testing_util::ToDouble(testing_util::RoundTo(low, out)), 0.0, 0.0));
    }
  }
}

// Gemma's GeGLU (tanh approximation), as cpu::GeluTanhMul.
TEST(CudaSiluMulTest, GeluTanhGateMatchesCpu) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  cpu::ThreadPool pool(1);
  uint32_t seed = 40;
  for (DataType dtype : {DataType::kF32, DataType::kF16, DataType::kBF16}) {
    for (auto [tokens, ffn] : {std::pair<int64_t, int64_t>{1, 1}, {3, 37}, {5, 9216}}) {
      SCOPED_TRACE(testing::Message()
                   << DataTypeName(dtype) << " tokens=" << tokens << " ffn=" << ffn);
      std::vector<float> gate_up =
          testing_util::RoundTo(dtype, testing_util::RandomFloats(tokens * 2 * ffn, ++seed, -8, 8));
      std::vector<float> expected(tokens * ffn);
      cpu::GeluTanhMul(gate_up.data(), tokens, ffn, expected.data(), pool);
      SiluMulParams p;
      p.dtype = dtype;
      p.activation = GateActivation::kGeluTanh;
      LOOM_ASSERT_OK_AND_ASSIGN(std::vector<float> out, RunGated(p, gate_up, tokens, ffn));
      // The CPU's float tanh against the device's tanhf: a few float ulps, then one rounding.
      const double tol = std::max(testing_util::RoundingTolerance(dtype), 1e-5);
      EXPECT_TRUE(AllClose(out, testing_util::ToDouble(expected), tol, tol));
    }
  }
}

TEST(CudaSiluMulTest, SwigluOaiRejectsLimitsThatAreNotPositiveAndFinite) {
  float buffer[4] = {};
  SiluMulParams p;
  p.gate_up = p.out = buffer;
  p.num_tokens = 1;
  p.ffn = 2;
  p.activation = GateActivation::kSwigluOai;
  for (float limit : {0.0f, -7.0f, NAN, INFINITY}) {
    p.limit = limit;
    EXPECT_NE(CheckSiluMulParams(p).message().find("limit"), std::string::npos) << limit;
    EXPECT_EQ(LaunchSiluMul(p, nullptr).code(), absl::StatusCode::kInvalidArgument) << limit;
  }
  p.limit = 7.0f;
  EXPECT_TRUE(CheckSiluMulParams(p).ok());
  // The other activations ignore the field.
  p.activation = GateActivation::kSilu;
  p.limit = 0.0f;
  EXPECT_TRUE(CheckSiluMulParams(p).ok());
}

// gpt-oss's experts: OpenAI's clamped SwiGLU, as cpu::SwigluOaiMul. Gates and ups reach
// 1.5x the limit on both sides, so both clamps (the gate's upper one only) and the
// sigmoid's tails are covered; a few exact +-limit values too.
TEST(CudaSiluMulTest, SwigluOaiGateMatchesCpu) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  cpu::ThreadPool pool(1);
  uint32_t seed = 60;
  for (DataType dtype : {DataType::kF32, DataType::kF16, DataType::kBF16}) {
    for (float limit : {7.0f, 1.5f}) {
      for (auto [tokens, ffn] : {std::pair<int64_t, int64_t>{1, 1}, {3, 37}, {5, 2880}}) {
        SCOPED_TRACE(testing::Message() << DataTypeName(dtype) << " limit=" << limit
                                        << " tokens=" << tokens << " ffn=" << ffn);
        std::vector<float> values =
            testing_util::RandomFloats(tokens * 2 * ffn, ++seed, -1.5f * limit, 1.5f * limit);
        for (size_t i = 0; i < values.size(); i += 11) values[i] = i % 2 == 0 ? limit : -limit;
        const std::vector<float> gate_up = testing_util::RoundTo(dtype, values);
        std::vector<float> expected(tokens * ffn);
        cpu::SwigluOaiMul(gate_up.data(), tokens, ffn, limit, expected.data(), pool);
        const DataType low = dtype == DataType::kF16 ? DataType::kBF16 : DataType::kF16;
        LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_low, testing_util::Poisoned(low, tokens * ffn));
        SiluMulParams p;
        p.dtype = dtype;
        p.activation = GateActivation::kSwigluOai;
        p.limit = limit;
        p.out_low = d_low.data();
        p.low_dtype = low;
        LOOM_ASSERT_OK_AND_ASSIGN(std::vector<float> out, RunGated(p, gate_up, tokens, ffn));
        // The CPU's std::exp against the device's expf (the same expression, no fast-math):
        // a few float ulps, then one rounding.
        const double tol = std::max(testing_util::RoundingTolerance(dtype), 1e-5);
        EXPECT_TRUE(AllClose(out, testing_util::ToDouble(expected), tol, tol));
        LOOM_ASSERT_OK_AND_ASSIGN(std::vector<float> out_low,
                                  testing_util::Download(d_low, low, tokens * ffn));
        EXPECT_TRUE(
            AllClose(out_low, testing_util::ToDouble(testing_util::RoundTo(low, out)), 0.0, 0.0));
      }
    }
  }
}

TEST(CudaInPlaceTest, RejectsBadValuesBeforeLaunch) {
  float buffer[4] = {};
  InPlaceParams p;
  p.x = buffer;
  p.num_elements = 4;
  p.op = InPlaceOp::kSoftCap;
  p.value = 0.0f;  // a cap must be positive
  EXPECT_NE(CheckInPlaceParams(p).message().find("SoftCap: value 0"), std::string::npos);
  p.value = NAN;
  EXPECT_EQ(LaunchInPlace(p, nullptr).code(), absl::StatusCode::kInvalidArgument);
  p.op = InPlaceOp::kScale;
  EXPECT_NE(CheckInPlaceParams(p).message().find("Scale: value nan"), std::string::npos);
  p.value = 0.0f;  // a factor may be anything finite
  EXPECT_TRUE(CheckInPlaceParams(p).ok());
  p.value = 30.0f;
  p.x = nullptr;
  EXPECT_EQ(CheckInPlaceParams(p).code(), absl::StatusCode::kInvalidArgument);
  p.num_elements = 0;
  EXPECT_TRUE(CheckInPlaceParams(p).ok());
}

// Gemma 2's final logit soft-capping (as cpu::SoftCap) and Granite's multipliers (as
// cpu::Scale), in place.
TEST(CudaInPlaceTest, SoftCapAndScaleMatchCpu) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  for (DataType dtype : {DataType::kF32, DataType::kBF16}) {
    for (const auto& [op, value] :
         {std::pair{InPlaceOp::kSoftCap, 1.0f}, std::pair{InPlaceOp::kSoftCap, 30.0f},
          std::pair{InPlaceOp::kScale, 0.22f}, std::pair{InPlaceOp::kScale, 1.0f / 16}}) {
      SCOPED_TRACE(testing::Message()
                   << DataTypeName(dtype) << " op=" << static_cast<int>(op) << " value=" << value);
      std::vector<float> x =
          testing_util::RoundTo(dtype, testing_util::RandomFloats(100003, 77, -100, 100));
      std::vector<float> expected = x;
      if (op == InPlaceOp::kSoftCap) {
        cpu::SoftCap(expected.data(), static_cast<int64_t>(expected.size()), value);
      } else {
        cpu::Scale(expected.data(), static_cast<int64_t>(expected.size()), value);
      }
      LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_x, testing_util::Upload(dtype, x));
      InPlaceParams p;
      p.x = d_x.data();
      p.dtype = dtype;
      p.num_elements = static_cast<int64_t>(x.size());
      p.op = op;
      p.value = value;
      ASSERT_TRUE(LaunchInPlace(p, nullptr).ok());
      ASSERT_TRUE(SynchronizeStream(nullptr).ok());
      LOOM_ASSERT_OK_AND_ASSIGN(std::vector<float> out,
                                testing_util::Download(d_x, dtype, x.size()));
      const double tol = std::max(testing_util::RoundingTolerance(dtype), 1e-5);
      EXPECT_TRUE(AllClose(out, testing_util::ToDouble(expected), tol, tol));
    }
  }
}

TEST(CudaAddGatedRowsTest, RejectsBadShapesBeforeLaunch) {
  float buffer[4] = {};
  AddGatedRowsParams p{buffer, nullptr, buffer, 2, 0};
  EXPECT_NE(CheckAddGatedRowsParams(p).message().find("cols 0"), std::string::npos);
  p.cols = 2;
  EXPECT_TRUE(CheckAddGatedRowsParams(p).ok());
  p.out = nullptr;
  EXPECT_EQ(LaunchAddGatedRows(p, nullptr).code(), absl::StatusCode::kInvalidArgument);
  p.rows = 0;
  EXPECT_TRUE(CheckAddGatedRowsParams(p).ok());
}

// A gated shared expert joining the routed experts' sum, as cpu::AddSigmoidGatedRows, with
// and without gates.
TEST(CudaAddGatedRowsTest, MatchesCpu) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {7, 576}, {33, 2048}}) {
    for (bool gated : {true, false}) {
      SCOPED_TRACE(testing::Message() << rows << "x" << cols << (gated ? " gated" : ""));
      const std::vector<float> x = testing_util::RandomFloats(rows * cols, 5, -10, 10);
      const std::vector<float> gates = testing_util::RandomFloats(rows, 6, -30, 30);
      std::vector<float> expected = testing_util::RandomFloats(rows * cols, 7, -10, 10);
      LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_x, testing_util::Upload(DataType::kF32, x));
      LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_gates, testing_util::Upload(DataType::kF32, gates));
      LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_out, testing_util::Upload(DataType::kF32, expected));
      cpu::AddSigmoidGatedRows(x.data(), gated ? gates.data() : nullptr, rows, cols,
                               expected.data());
      AddGatedRowsParams p;
      p.x = static_cast<const float*>(d_x.data());
      p.gate_logits = gated ? static_cast<const float*>(d_gates.data()) : nullptr;
      p.out = static_cast<float*>(d_out.data());
      p.rows = rows;
      p.cols = cols;
      ASSERT_TRUE(LaunchAddGatedRows(p, nullptr).ok());
      ASSERT_TRUE(SynchronizeStream(nullptr).ok());
      LOOM_ASSERT_OK_AND_ASSIGN(std::vector<float> out,
                                testing_util::Download(d_out, DataType::kF32, expected.size()));
      EXPECT_TRUE(AllClose(out, testing_util::ToDouble(expected), 1e-5, 1e-5));
    }
  }
}

}  // namespace
}  // namespace loom::kernels::cuda
