#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <tuple>
#include <vector>

#include "kernels/cpu/paged_attention.h"
#include "kernels/cuda/kv_cache.h"
#include "tests/kernels/cuda_test_util.h"

namespace loom::kernels::cuda {
namespace {

using testing_util::AllClose;

TEST(CudaWriteKvTest, RejectsBadShapesBeforeLaunch) {
  alignas(16) int32_t storage[16] = {};
  WriteKvParams p;
  p.cache = {storage, storage, DataType::kF32, 4, 16, 2, 64};
  p.k = p.v = storage;
  p.slots = storage;
  p.num_tokens = 1;
  absl::Status status = CheckWriteKvParams(p);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("F32"), std::string::npos) << status;
  p.cache.dtype = DataType::kBF16;
  EXPECT_TRUE(CheckWriteKvParams(p).ok());
  p.k_stride = 64;  // shorter than 2 heads x 64
  EXPECT_EQ(LaunchWriteKv(p, nullptr).code(), absl::StatusCode::kInvalidArgument);
  p.k_stride = 0;
  p.cache.block_size = 0;
  EXPECT_EQ(LaunchWriteKv(p, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

// cpu::WriteKv semantics and layout: the GPU's F16 pool equals cpu::WriteKv's bit for bit;
// for BF16 the pool holds the rounded values. Padding slots (-1) are skipped; slots not
// written keep their old contents.
TEST(CudaWriteKvTest, MatchesCpuWriteKvLayoutAndSkipsPadding) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  uint32_t seed = 1;
  for (DataType kv : {DataType::kF16, DataType::kBF16}) {
    for (DataType src : {DataType::kF32, DataType::kF16, DataType::kBF16}) {
      for (auto [kv_heads, head_dim, block_size] :
           {std::tuple<int64_t, int64_t, int64_t>{1, 64, 16},
            {8, 128, 16},
            {3, 80, 7},
            {2, 128, 32}}) {
        SCOPED_TRACE(testing::Message()
                     << DataTypeName(kv) << " <- " << DataTypeName(src) << " kv_heads=" << kv_heads
                     << " head_dim=" << head_dim << " block=" << block_size);
        const int64_t num_blocks = 9, row = kv_heads * head_dim;
        const int64_t pool = num_blocks * block_size * row;
        testing_util::HostCache before = testing_util::RandomCache(kv, pool, ++seed);
        ++seed;
        // Tokens write a permutation of slots; every fifth is padding. K and V come from one
        // fused buffer [tokens, k row | v row] to test the strides.
        const int64_t tokens = 23;
        std::vector<int32_t> all_slots(num_blocks * block_size);
        std::iota(all_slots.begin(), all_slots.end(), 0);
        std::shuffle(all_slots.begin(), all_slots.end(), std::mt19937(++seed));
        std::vector<int32_t> slots(all_slots.begin(), all_slots.begin() + tokens);
        for (int64_t t = 0; t < tokens; t += 5) slots[t] = -1;
        std::vector<float> kv_rows =
            testing_util::RoundTo(src, testing_util::RandomFloats(tokens * 2 * row, ++seed, -3, 3));

        std::vector<float> expected_k = before.k, expected_v = before.v;
        for (int64_t t = 0; t < tokens; ++t) {
          if (slots[t] < 0) continue;
          for (int64_t i = 0; i < row; ++i) {
            expected_k[slots[t] * row + i] = kv_rows[t * 2 * row + i];
            expected_v[slots[t] * row + i] = kv_rows[t * 2 * row + row + i];
          }
        }
        expected_k = testing_util::RoundTo(kv, expected_k);
        expected_v = testing_util::RoundTo(kv, expected_v);
        if (kv == DataType::kF16) {
          // The layout is cpu::KvLayerView's: cpu::WriteKv on the same pool agrees.
          std::vector<int32_t> cpu_slots;
          std::vector<float> cpu_k, cpu_v;
          for (int64_t t = 0; t < tokens; ++t) {
            if (slots[t] < 0) continue;
            cpu_slots.push_back(slots[t]);
            cpu_k.insert(cpu_k.end(), kv_rows.begin() + t * 2 * row,
                         kv_rows.begin() + t * 2 * row + row);
            cpu_v.insert(cpu_v.end(), kv_rows.begin() + t * 2 * row + row,
                         kv_rows.begin() + (t + 1) * 2 * row);
          }
          std::vector<uint8_t> cpu_kc = before.k_bytes, cpu_vc = before.v_bytes;
          cpu::KvLayerView view{cpu_kc.data(), cpu_vc.data(), cpu::KvDtype::kF16,
                                num_blocks,    block_size,    kv_heads,
                                head_dim};
          ASSERT_TRUE(cpu::WriteKv(view, cpu_k.data(), cpu_v.data(), cpu_slots.data(),
                                   static_cast<int64_t>(cpu_slots.size()))
                          .ok());
          std::vector<float> cpu_k_values(pool);
          ConvertToFloat(DataType::kF16, cpu_kc.data(), pool, cpu_k_values.data());
          ASSERT_EQ(cpu_k_values, expected_k);
        }

        LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_k, testing_util::UploadRaw(before.k_bytes));
        LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_v, testing_util::UploadRaw(before.v_bytes));
        LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_rows, testing_util::Upload(src, kv_rows));
        LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_slots, testing_util::UploadRaw(slots));
        WriteKvParams p;
        p.cache = {d_k.data(), d_v.data(), kv, num_blocks, block_size, kv_heads, head_dim};
        p.k = d_rows.data();
        p.v = static_cast<char*>(d_rows.data()) + row * ElementBytes(src);
        p.src_dtype = src;
        p.k_stride = p.v_stride = 2 * row;
        p.slots = static_cast<const int32_t*>(d_slots.data());
        p.num_tokens = tokens;
        ASSERT_TRUE(LaunchWriteKv(p, nullptr).ok());
        ASSERT_TRUE(SynchronizeStream(nullptr).ok());
        LOOM_ASSERT_OK_AND_ASSIGN(std::vector<float> k_out, testing_util::Download(d_k, kv, pool));
        LOOM_ASSERT_OK_AND_ASSIGN(std::vector<float> v_out, testing_util::Download(d_v, kv, pool));
        EXPECT_TRUE(AllClose(k_out, testing_util::ToDouble(expected_k), 0.0, 0.0));
        EXPECT_TRUE(AllClose(v_out, testing_util::ToDouble(expected_v), 0.0, 0.0));
      }
    }
  }
}

}  // namespace
}  // namespace loom::kernels::cuda
