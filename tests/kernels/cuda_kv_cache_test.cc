#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <tuple>
#include <vector>

#include "kernels/cpu/kv_dtype.h"
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

TEST(CudaWriteKvTest, EightBitCachesNeedScalesAndAPowerOfTwoHeadDim) {
  alignas(16) int32_t storage[16] = {};
  uint16_t scales[4] = {};
  KvCacheView cache{storage, storage, DataType::kF16, 4, 16, 2, 64};
  cache.quant = KvQuant::kInt8;
  EXPECT_EQ(CheckKvCacheView(cache).code(), absl::StatusCode::kInvalidArgument);  // no scales
  cache.k_scale = cache.v_scale = scales;
  EXPECT_TRUE(CheckKvCacheView(cache).ok());
  EXPECT_EQ(KvCodeBytes(cache), 1);
  cache.head_dim = 80;
  const absl::Status status = CheckKvCacheView(cache);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("power-of-two head_dim"), std::string::npos) << status;
  RotateHeadsParams r;
  r.src = reinterpret_cast<const float*>(storage);
  r.dst = storage;
  r.rows = 1;
  r.head_dim = 48;
  EXPECT_EQ(CheckRotateHeadsParams(r).code(), absl::StatusCode::kInvalidArgument);
  r.head_dim = 64;
  EXPECT_TRUE(CheckRotateHeadsParams(r).ok());
  r.dst_dtype = DataType::kF16;  // in place needs F32
  EXPECT_EQ(CheckRotateHeadsParams(r).code(), absl::StatusCode::kInvalidArgument);
}

// 8-bit KV: the GPU's codes and scales equal cpu::WriteKv's bit for bit from the same F32
// rows (rotated, scaled to BF16 rounded up, rounded to nearest even), padding skipped.
// Rows include all zeros, one large outlier channel and values past fp8's range per scale.
TEST(CudaWriteKvTest, EightBitRowsEqualCpuWriteKvCodesAndScales) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  uint32_t seed = 40;
  for (const auto& [cpu_dtype, quant] : {std::pair{cpu::KvDtype::kInt8, KvQuant::kInt8},
                                         std::pair{cpu::KvDtype::kFp8E4m3, KvQuant::kFp8E4m3}}) {
    for (const auto& [kv_heads, head_dim] :
         {std::pair<int64_t, int64_t>{2, 64}, {3, 128}, {1, 32}, {2, 256}}) {
      SCOPED_TRACE(testing::Message() << cpu::KvDtypeName(cpu_dtype) << " kv_heads=" << kv_heads
                                      << " head_dim=" << head_dim);
      const int64_t num_blocks = 5, block_size = 8, row = kv_heads * head_dim;
      const int64_t slots_total = num_blocks * block_size;
      const int64_t tokens = 13;
      std::vector<int32_t> slots(tokens);
      for (int64_t t = 0; t < tokens; ++t)
        slots[t] = static_cast<int32_t>((t * 7 + 3) % slots_total);
      slots[4] = -1;
      std::vector<float> k = testing_util::RandomFloats(tokens * row, ++seed, -2, 2);
      std::vector<float> v = testing_util::RandomFloats(tokens * row, ++seed, -2, 2);
      std::fill(k.begin(), k.begin() + head_dim, 0.0f);  // an all-zero row: scale 0
      k[row + 5] = 900.0f;                               // an outlier channel
      v[2 * row + 1] = -3.0e4f;

      std::vector<uint8_t> cpu_k(slots_total * row), cpu_v(slots_total * row);
      std::vector<uint16_t> cpu_ks(slots_total * kv_heads), cpu_vs(slots_total * kv_heads);
      {
        std::vector<int32_t> cpu_slots;
        std::vector<float> kk, vv;
        for (int64_t t = 0; t < tokens; ++t) {
          if (slots[t] < 0) continue;
          cpu_slots.push_back(slots[t]);
          kk.insert(kk.end(), k.begin() + t * row, k.begin() + (t + 1) * row);
          vv.insert(vv.end(), v.begin() + t * row, v.begin() + (t + 1) * row);
        }
        cpu::KvLayerView view{cpu_k.data(), cpu_v.data(), cpu_dtype,     num_blocks,   block_size,
                              kv_heads,     head_dim,     cpu_ks.data(), cpu_vs.data()};
        ASSERT_TRUE(cpu::WriteKv(view, kk.data(), vv.data(), cpu_slots.data(),
                                 static_cast<int64_t>(cpu_slots.size()))
                        .ok());
      }
      const std::vector<uint8_t> zero_codes(slots_total * row, 0);
      const std::vector<uint16_t> zero_scales(slots_total * kv_heads, 0);
      LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_k, testing_util::UploadRaw(zero_codes));
      LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_v, testing_util::UploadRaw(zero_codes));
      LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_ks, testing_util::UploadRaw(zero_scales));
      LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_vs, testing_util::UploadRaw(zero_scales));
      LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_krows, testing_util::UploadRaw(k));
      LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_vrows, testing_util::UploadRaw(v));
      LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_slots, testing_util::UploadRaw(slots));
      WriteKvParams p;
      p.cache = {d_k.data(), d_v.data(), DataType::kF16, num_blocks,
                 block_size, kv_heads,   head_dim};
      p.cache.quant = quant;
      p.cache.k_scale = static_cast<uint16_t*>(d_ks.data());
      p.cache.v_scale = static_cast<uint16_t*>(d_vs.data());
      p.k = d_krows.data();
      p.v = d_vrows.data();
      p.src_dtype = DataType::kF32;
      p.slots = static_cast<const int32_t*>(d_slots.data());
      p.num_tokens = tokens;
      ASSERT_TRUE(LaunchWriteKv(p, nullptr).ok());
      ASSERT_TRUE(SynchronizeStream(nullptr).ok());
      std::vector<uint8_t> gpu_k(cpu_k.size()), gpu_v(cpu_v.size());
      std::vector<uint16_t> gpu_ks(cpu_ks.size()), gpu_vs(cpu_vs.size());
      ASSERT_TRUE(d_k.CopyToHost(gpu_k.data(), gpu_k.size()).ok());
      ASSERT_TRUE(d_v.CopyToHost(gpu_v.data(), gpu_v.size()).ok());
      ASSERT_TRUE(d_ks.CopyToHost(gpu_ks.data(), gpu_ks.size() * 2).ok());
      ASSERT_TRUE(d_vs.CopyToHost(gpu_vs.data(), gpu_vs.size() * 2).ok());
      EXPECT_EQ(gpu_k, cpu_k);
      EXPECT_EQ(gpu_v, cpu_v);
      EXPECT_EQ(gpu_ks, cpu_ks);
      EXPECT_EQ(gpu_vs, cpu_vs);
    }
  }
}

// The rotation of queries and outputs: F32 rows equal cpu::RotateKvRow's bit for bit (in
// place too); F16/BF16 destinations hold those values rounded once.
TEST(CudaRotateHeadsTest, EqualsCpuRotateKvRow) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  for (int64_t head_dim : {32, 64, 128, 256}) {
    SCOPED_TRACE(head_dim);
    const int64_t rows = 37;
    const std::vector<float> x = testing_util::RandomFloats(rows * head_dim, 7 + head_dim, -4, 4);
    std::vector<float> expected = x;
    for (int64_t r = 0; r < rows; ++r) cpu::RotateKvRow(expected.data() + r * head_dim, head_dim);
    LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_x, testing_util::UploadRaw(x));
    for (DataType dst : {DataType::kF16, DataType::kBF16, DataType::kF32}) {
      LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_out, testing_util::Poisoned(dst, rows * head_dim));
      RotateHeadsParams p;
      p.src = static_cast<const float*>(d_x.data());
      p.dst = dst == DataType::kF32 ? d_x.data() : d_out.data();  // F32: in place
      p.dst_dtype = dst;
      p.rows = rows;
      p.head_dim = head_dim;
      ASSERT_TRUE(LaunchRotateHeads(p, nullptr).ok());
      ASSERT_TRUE(SynchronizeStream(nullptr).ok());
      LOOM_ASSERT_OK_AND_ASSIGN(
          std::vector<float> out,
          testing_util::Download(dst == DataType::kF32 ? d_x : d_out, dst, rows * head_dim));
      EXPECT_EQ(out, testing_util::RoundTo(dst, expected)) << DataTypeName(dst);
    }
  }
}

}  // namespace
}  // namespace loom::kernels::cuda
