#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cpu/rope.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/rope_write_kv.h"
#include "tests/kernels/cuda_test_util.h"

namespace loom::kernels::cuda {
namespace {

using testing_util::AllClose;

TEST(CudaRopeWriteKvTest, RejectsBadShapesBeforeLaunch) {
  alignas(16) float storage[64] = {};
  int32_t ints[4] = {};
  RopeWriteKvParams p;
  p.cache = {storage, storage, DataType::kF16, 4, 16, 2, 64};
  p.qkv = storage;
  p.q_out = storage;
  p.slots = ints;
  p.positions = ints;
  p.inv_freq = storage;
  p.num_tokens = 1;
  p.num_heads = 4;
  p.rope_dim = 64;
  EXPECT_TRUE(CheckRopeWriteKvParams(p).ok());
  p.rope_dim = 66;  // more than head_dim
  absl::Status status = CheckRopeWriteKvParams(p);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("66"), std::string::npos) << status;
  p.rope_dim = 31;  // odd
  EXPECT_EQ(LaunchRopeWriteKv(p, nullptr).code(), absl::StatusCode::kInvalidArgument);
  p.rope_dim = 64;
  p.qkv_stride = 255;  // shorter than (4 + 2 * 2) heads of 64
  status = LaunchRopeWriteKv(p, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("512"), std::string::npos) << status;
  p.qkv_stride = 0;
  p.attention_factor = 0.0f;
  EXPECT_EQ(LaunchRopeWriteKv(p, nullptr).code(), absl::StatusCode::kInvalidArgument);
  p.attention_factor = 1.0f;
  p.num_heads = 0;
  EXPECT_EQ(LaunchRopeWriteKv(p, nullptr).code(), absl::StatusCode::kInvalidArgument);
  p.num_heads = 4;
  p.slots = nullptr;
  EXPECT_EQ(LaunchRopeWriteKv(p, nullptr).code(), absl::StatusCode::kInvalidArgument);
  p.slots = ints;
  p.q_norm = storage;  // without k_norm
  status = CheckRopeWriteKvParams(p);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("q_norm and k_norm"), std::string::npos) << status;
  p.k_norm = storage;
  p.norm_eps = -1.0f;
  EXPECT_EQ(LaunchRopeWriteKv(p, nullptr).code(), absl::StatusCode::kInvalidArgument);
  p.norm_eps = 1e-6f;
  EXPECT_TRUE(CheckRopeWriteKvParams(p).ok());
  // Without rotation neither positions nor rope_dim are read.
  p.inv_freq = nullptr;
  p.positions = nullptr;
  p.rope_dim = 0;
  EXPECT_TRUE(CheckRopeWriteKvParams(p).ok());
  // 8-bit caches (their rows rotated and scaled) take LaunchRope and LaunchWriteKv.
  uint16_t scales[4] = {};
  p.cache.quant = KvQuant::kInt8;
  p.cache.k_scale = p.cache.v_scale = scales;
  status = CheckRopeWriteKvParams(p);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("8-bit"), std::string::npos) << status;
}

// Against cpu::RopeReference (cos/sin in double of the same float angle) after QK-norm in double,
// and without QK-norm against what it replaces on the device: LaunchRope on the fused rows, then
// LaunchWriteKv from them, bit for bit (the same float operations). Padding slots (-1) are skipped,
// slots not written keep their contents, and the rows' padding beyond the row (qkv_stride) is never
// read into results.
TEST(CudaRopeWriteKvTest, EqualsRopeThenWriteKvAndTheCpuReference) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  struct Case {
    int64_t tokens, heads, kv_heads, head_dim, rope_dim;  // rope_dim 0: no rotation
    bool neox;
    int64_t stride_pad;
    bool qk_norm = false;  // each head of q and k RMS-normalized first (Qwen3)
  };
  uint32_t seed = 1;
  for (DataType kv : {DataType::kF16, DataType::kBF16}) {
    for (const Case& c :
         {Case{1, 1, 1, 64, 64, false, 0}, Case{5, 9, 3, 64, 64, false, 0},
          Case{7, 8, 2, 128, 128, true, 16}, Case{3, 4, 4, 128, 64, true, 0},
          Case{17, 14, 2, 64, 32, false, 8}, Case{23, 32, 8, 128, 128, false, 0},
          Case{6, 6, 2, 80, 0, false, 0}, Case{5, 8, 2, 128, 128, true, 0, true},
          Case{3, 4, 4, 64, 32, false, 8, true}, Case{4, 6, 2, 80, 0, false, 0, true}}) {
      SCOPED_TRACE(testing::Message()
                   << DataTypeName(kv) << " tokens=" << c.tokens << " heads=" << c.heads << "/"
                   << c.kv_heads << " dim=" << c.head_dim << "/" << c.rope_dim << " neox=" << c.neox
                   << " qk_norm=" << c.qk_norm);
      const int64_t q_dim = c.heads * c.head_dim, kv_dim = c.kv_heads * c.head_dim;
      const int64_t row = q_dim + 2 * kv_dim, stride = row + c.stride_pad;
      const int64_t block_size = 16, num_blocks = (c.tokens + block_size) / block_size + 1;
      const int64_t pool = num_blocks * block_size * kv_dim;
      std::vector<float> qkv = testing_util::RandomFloats(c.tokens * stride, ++seed, -2, 2);
      std::vector<int32_t> positions(c.tokens);
      std::mt19937 rng(++seed);
      for (int32_t& pos : positions) pos = std::uniform_int_distribution<int32_t>(0, 100000)(rng);
      std::vector<int32_t> all_slots(num_blocks * block_size);
      std::iota(all_slots.begin(), all_slots.end(), 0);
      std::shuffle(all_slots.begin(), all_slots.end(), rng);
      std::vector<int32_t> slots(all_slots.begin(), all_slots.begin() + c.tokens);
      for (int64_t t = 2; t < c.tokens; t += 5) slots[t] = -1;
      const bool rotate = c.rope_dim > 0;
      std::vector<float> inv_freq(std::max<int64_t>(c.rope_dim / 2, 1));
      for (size_t i = 0; i < inv_freq.size(); ++i) {
        inv_freq[i] =
            static_cast<float>(std::pow(10000.0, -2.0 * i / std::max<int64_t>(c.rope_dim, 2)));
      }
      const float attention_factor = seed % 4 == 1 ? 1.0f : 1.1386294f;
      testing_util::HostCache before = testing_util::RandomCache(kv, pool, ++seed);

      // The CPU reference: q and k normalized and rotated in double, every value as the cache
      // would hold it.
      std::vector<float> q(c.tokens * q_dim), k(c.tokens * kv_dim);
      for (int64_t t = 0; t < c.tokens; ++t) {
        std::copy_n(qkv.begin() + t * stride, q_dim, q.begin() + t * q_dim);
        std::copy_n(qkv.begin() + t * stride + q_dim, kv_dim, k.begin() + t * kv_dim);
      }
      const std::vector<float> q_norm = testing_util::RandomFloats(c.head_dim, ++seed, -2, 2);
      const std::vector<float> k_norm = testing_util::RandomFloats(c.head_dim, ++seed, -2, 2);
      constexpr float kEps = 1e-6f;
      auto normalize = [&](std::vector<float>& heads, const std::vector<float>& weight) {
        for (size_t h = 0; h < heads.size() / c.head_dim; ++h) {
          float* x = heads.data() + h * c.head_dim;
          double sum_squares = 0.0;
          for (int64_t d = 0; d < c.head_dim; ++d) sum_squares += double{x[d]} * x[d];
          const double inverse_rms = 1.0 / std::sqrt(sum_squares / c.head_dim + kEps);
          for (int64_t d = 0; d < c.head_dim; ++d) {
            x[d] = static_cast<float>(x[d] * inverse_rms * weight[d]);
          }
        }
      };
      if (c.qk_norm) {
        normalize(q, q_norm);
        normalize(k, k_norm);
      }
      if (rotate) {
        cpu::RopeParams ref{q.data(), k.data(),   positions.data(), inv_freq.data(), c.tokens,
                            c.heads,  c.kv_heads, c.head_dim,       c.rope_dim,      c.neox};
        ref.attention_factor = attention_factor;
        cpu::RopeReference(ref);
      }
      std::vector<double> expected_k = testing_util::ToDouble(before.k);
      std::vector<float> expected_v = before.v;
      for (int64_t t = 0; t < c.tokens; ++t) {
        if (slots[t] < 0) continue;
        for (int64_t i = 0; i < kv_dim; ++i) {
          expected_k[slots[t] * kv_dim + i] = k[t * kv_dim + i];
          expected_v[slots[t] * kv_dim + i] = qkv[t * stride + q_dim + kv_dim + i];
        }
      }

      LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_qkv, testing_util::Upload(DataType::kF32, qkv));
      LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_positions, testing_util::UploadRaw(positions));
      LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_slots, testing_util::UploadRaw(slots));
      LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_inv_freq,
                                testing_util::Upload(DataType::kF32, inv_freq));
      LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_k, testing_util::UploadRaw(before.k_bytes));
      LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_v, testing_util::UploadRaw(before.v_bytes));
      LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_q,
                                testing_util::Poisoned(DataType::kF32, c.tokens * q_dim));
      LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_q_norm,
                                testing_util::Upload(DataType::kF32, q_norm));
      LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_k_norm,
                                testing_util::Upload(DataType::kF32, k_norm));
      RopeWriteKvParams p;
      p.qkv = static_cast<const float*>(d_qkv.data());
      p.qkv_stride = stride;
      p.q_out = static_cast<float*>(d_q.data());
      p.cache = {d_k.data(), d_v.data(), kv, num_blocks, block_size, c.kv_heads, c.head_dim};
      p.slots = static_cast<const int32_t*>(d_slots.data());
      p.positions = static_cast<const int32_t*>(d_positions.data());
      p.inv_freq = rotate ? static_cast<const float*>(d_inv_freq.data()) : nullptr;
      p.num_tokens = c.tokens;
      p.num_heads = c.heads;
      p.rope_dim = c.rope_dim;
      p.neox = c.neox;
      p.attention_factor = attention_factor;
      if (c.qk_norm) {
        p.q_norm = static_cast<const float*>(d_q_norm.data());
        p.k_norm = static_cast<const float*>(d_k_norm.data());
        p.norm_eps = kEps;
      }
      ASSERT_TRUE(LaunchRopeWriteKv(p, nullptr).ok());
      ASSERT_TRUE(SynchronizeStream(nullptr).ok());
      LOOM_ASSERT_OK_AND_ASSIGN(std::vector<float> q_out,
                                testing_util::Download(d_q, DataType::kF32, c.tokens * q_dim));
      LOOM_ASSERT_OK_AND_ASSIGN(std::vector<float> k_out, testing_util::Download(d_k, kv, pool));
      LOOM_ASSERT_OK_AND_ASSIGN(std::vector<float> v_out, testing_util::Download(d_v, kv, pool));
      const double f32_tol = testing_util::RoundingTolerance(DataType::kF32);
      const double kv_tol = testing_util::RoundingTolerance(kv);
      EXPECT_TRUE(AllClose(q_out, testing_util::ToDouble(q), 2 * f32_tol, f32_tol));
      EXPECT_TRUE(AllClose(k_out, expected_k, 2 * kv_tol, kv_tol));
      EXPECT_TRUE(
          AllClose(v_out, testing_util::ToDouble(testing_util::RoundTo(kv, expected_v)), 0.0, 0.0));

      // The unfused launches on a second pool, from the same rows (QK-norm's sums run in
      // another order in LaunchRmsNorm: its results are the reference's above).
      if (c.qk_norm) continue;
      LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_k2, testing_util::UploadRaw(before.k_bytes));
      LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_v2, testing_util::UploadRaw(before.v_bytes));
      if (rotate) {
        RopeParams r;
        r.q = d_qkv.data();
        r.k = static_cast<float*>(d_qkv.data()) + q_dim;
        r.positions = p.positions;
        r.inv_freq = p.inv_freq;
        r.num_tokens = c.tokens;
        r.num_heads = c.heads;
        r.num_kv_heads = c.kv_heads;
        r.head_dim = c.head_dim;
        r.rope_dim = c.rope_dim;
        r.q_stride = r.k_stride = stride;
        r.neox = c.neox;
        r.attention_factor = attention_factor;
        ASSERT_TRUE(LaunchRope(r, nullptr).ok());
      }
      WriteKvParams w;
      w.cache = {d_k2.data(), d_v2.data(), kv, num_blocks, block_size, c.kv_heads, c.head_dim};
      w.k = static_cast<float*>(d_qkv.data()) + q_dim;
      w.v = static_cast<float*>(d_qkv.data()) + q_dim + kv_dim;
      w.k_stride = w.v_stride = stride;
      w.slots = p.slots;
      w.num_tokens = c.tokens;
      ASSERT_TRUE(LaunchWriteKv(w, nullptr).ok());
      ASSERT_TRUE(SynchronizeStream(nullptr).ok());
      LOOM_ASSERT_OK_AND_ASSIGN(std::vector<float> rotated,
                                testing_util::Download(d_qkv, DataType::kF32, qkv.size()));
      std::vector<double> unfused_q(c.tokens * q_dim);
      for (int64_t t = 0; t < c.tokens; ++t) {
        std::copy_n(rotated.begin() + t * stride, q_dim, unfused_q.begin() + t * q_dim);
      }
      LOOM_ASSERT_OK_AND_ASSIGN(std::vector<float> k2, testing_util::Download(d_k2, kv, pool));
      LOOM_ASSERT_OK_AND_ASSIGN(std::vector<float> v2, testing_util::Download(d_v2, kv, pool));
      EXPECT_TRUE(AllClose(q_out, unfused_q, 0.0, 0.0));
      EXPECT_TRUE(AllClose(k_out, testing_util::ToDouble(k2), 0.0, 0.0));
      EXPECT_TRUE(AllClose(v_out, testing_util::ToDouble(v2), 0.0, 0.0));
    }
  }
}

}  // namespace
}  // namespace loom::kernels::cuda
