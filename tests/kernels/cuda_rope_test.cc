#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/cpu/rope.h"
#include "kernels/cuda/rope.h"
#include "tests/kernels/cuda_test_util.h"

namespace loom::kernels::cuda {
namespace {

using testing_util::AllClose;

TEST(CudaRopeTest, RejectsBadShapesBeforeLaunch) {
  float buffer[64] = {};
  int32_t positions[1] = {};
  RopeParams p;
  p.q = buffer;
  p.positions = positions;
  p.inv_freq = buffer;
  p.num_tokens = 1;
  p.num_heads = 2;
  p.head_dim = 64;
  p.rope_dim = 66;  // more than head_dim
  absl::Status status = CheckRopeParams(p);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("66"), std::string::npos) << status;
  p.rope_dim = 31;  // odd
  EXPECT_EQ(LaunchRope(p, nullptr).code(), absl::StatusCode::kInvalidArgument);
  p.rope_dim = 32;
  p.q_stride = 100;  // shorter than 2 heads of 64
  EXPECT_EQ(LaunchRope(p, nullptr).code(), absl::StatusCode::kInvalidArgument);
  p.q_stride = 0;
  p.k = buffer;
  p.num_kv_heads = 0;
  EXPECT_EQ(LaunchRope(p, nullptr).code(), absl::StatusCode::kInvalidArgument);
  p.num_kv_heads = 1;
  p.attention_factor = 0.0f;
  EXPECT_EQ(LaunchRope(p, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

// cpu::RopeReference (cos/sin in double of the same float angle) on the values as stored;
// positions reach 100k so sincosf's range reduction is exercised. Q and K sit in one fused
// row, [q heads | k heads | v heads], to test the strides; V must stay untouched.
TEST(CudaRopeTest, MatchesCpuReferenceOnFusedQkvRows) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  struct Case {
    int64_t tokens, heads, kv_heads, head_dim, rope_dim;
    bool neox;
  };
  uint32_t seed = 1;
  for (DataType dtype : {DataType::kF32, DataType::kF16, DataType::kBF16}) {
    for (const Case& c : {Case{1, 1, 1, 2, 2, false}, Case{5, 9, 3, 64, 64, false},
                          Case{7, 8, 2, 128, 128, true}, Case{3, 4, 4, 128, 64, true},
                          Case{17, 14, 2, 64, 32, false}, Case{2, 32, 8, 128, 128, false}}) {
      SCOPED_TRACE(testing::Message() << DataTypeName(dtype) << " tokens=" << c.tokens << " heads="
                                      << c.heads << "/" << c.kv_heads << " dim=" << c.head_dim
                                      << "/" << c.rope_dim << " neox=" << c.neox);
      const int64_t q_dim = c.heads * c.head_dim, kv_dim = c.kv_heads * c.head_dim;
      const int64_t row = q_dim + 2 * kv_dim;
      std::vector<float> qkv =
          testing_util::RoundTo(dtype, testing_util::RandomFloats(c.tokens * row, ++seed, -2, 2));
      std::vector<int32_t> positions(c.tokens);
      std::mt19937 rng(++seed);
      for (int32_t& pos : positions) pos = std::uniform_int_distribution<int32_t>(0, 100000)(rng);
      std::vector<float> inv_freq(c.rope_dim / 2);
      for (size_t i = 0; i < inv_freq.size(); ++i) {
        inv_freq[i] = static_cast<float>(std::pow(10000.0, -2.0 * i / c.rope_dim));
      }
      // Reference on separate contiguous Q and K copies.
      std::vector<float> q(c.tokens * q_dim), k(c.tokens * kv_dim);
      for (int64_t t = 0; t < c.tokens; ++t) {
        std::copy_n(qkv.begin() + t * row, q_dim, q.begin() + t * q_dim);
        std::copy_n(qkv.begin() + t * row + q_dim, kv_dim, k.begin() + t * kv_dim);
      }
      cpu::RopeParams ref{q.data(), k.data(),   positions.data(), inv_freq.data(), c.tokens,
                          c.heads,  c.kv_heads, c.head_dim,       c.rope_dim,      c.neox};
      // YaRN's attention factor on every other case (1 elsewhere: plain RoPE).
      ref.attention_factor = seed % 4 == 1 ? 1.0f : 1.1386294f;
      cpu::RopeReference(ref);
      std::vector<double> expected(qkv.begin(), qkv.end());
      for (int64_t t = 0; t < c.tokens; ++t) {
        std::copy_n(q.begin() + t * q_dim, q_dim, expected.begin() + t * row);
        std::copy_n(k.begin() + t * kv_dim, kv_dim, expected.begin() + t * row + q_dim);
      }

      LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_qkv, testing_util::Upload(dtype, qkv));
      LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_positions, testing_util::UploadRaw(positions));
      LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_inv_freq,
                                testing_util::Upload(DataType::kF32, inv_freq));
      RopeParams p;
      p.q = d_qkv.data();
      p.k = static_cast<char*>(d_qkv.data()) + q_dim * ElementBytes(dtype);
      p.positions = static_cast<const int32_t*>(d_positions.data());
      p.inv_freq = static_cast<const float*>(d_inv_freq.data());
      p.dtype = dtype;
      p.num_tokens = c.tokens;
      p.num_heads = c.heads;
      p.num_kv_heads = c.kv_heads;
      p.head_dim = c.head_dim;
      p.rope_dim = c.rope_dim;
      p.q_stride = row;
      p.k_stride = row;
      p.neox = c.neox;
      p.attention_factor = ref.attention_factor;
      ASSERT_TRUE(LaunchRope(p, nullptr).ok());
      ASSERT_TRUE(SynchronizeStream(nullptr).ok());
      LOOM_ASSERT_OK_AND_ASSIGN(std::vector<float> out,
                                testing_util::Download(d_qkv, dtype, qkv.size()));
      // F32: float rotation and sincosf vs double, |x| <= 2: 1e-5 absolute is ~10 ulp.
      const double tol = testing_util::RoundingTolerance(dtype);
      EXPECT_TRUE(AllClose(out, expected, 2 * tol, tol));
    }
  }
}

}  // namespace
}  // namespace loom::kernels::cuda
