#include "model/cpu_device.h"

#include <cstdint>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/kv_dtype.h"
#include "kernels/cpu/paged_attention.h"
#include "kernels/cpu/weights.h"
#include "model/cpu_kv_cache.h"
#include "model/kv_layout.h"

namespace loom::model {
namespace {

std::unique_ptr<CpuDevice> MakeDevice() {
  absl::StatusOr<std::unique_ptr<CpuDevice>> device = CpuDevice::Create({});
  EXPECT_TRUE(device.ok()) << device.status();
  return std::move(*device);
}

Tensor F32(std::vector<float>& values, std::initializer_list<int64_t> shape) {
  return Tensor::Of(values.data(), DType::kF32, DeviceType::kCpu, shape);
}

TEST(CpuDeviceTest, EmbeddingGathersTheSliceRowsAndZeroesTheOthers) {
  std::unique_ptr<CpuDevice> device = MakeDevice();
  // A rank holding vocabulary rows [10, 13) of a 3 x 2 table.
  std::vector<float> table = {1, 2, 3, 4, 5, 6};
  absl::StatusOr<kernels::cpu::PackedWeight> packed =
      kernels::cpu::PackFromF32(table.data(), 3, 2, kernels::cpu::WeightFormat::kF32, 0);
  ASSERT_TRUE(packed.ok()) << packed.status();
  absl::StatusOr<std::unique_ptr<DeviceLinear>> weight = device->UploadLinear(*packed, nullptr);
  ASSERT_TRUE(weight.ok());
  std::vector<int32_t> ids = {11, 9, 12, 13};
  std::vector<float> out(8, -1.0f);
  ASSERT_TRUE(device
                  ->Embedding(**weight, Tensor::Of(ids.data(), DType::kI32, DeviceType::kCpu, {4}),
                              10, 1.0f, F32(out, {4, 2}))
                  .ok());
  EXPECT_EQ(out, (std::vector<float>{3, 4, 0, 0, 5, 6, 0, 0}));
  ASSERT_TRUE(device
                  ->Embedding(**weight, Tensor::Of(ids.data(), DType::kI32, DeviceType::kCpu, {4}),
                              10, 0.5f, F32(out, {4, 2}))
                  .ok());
  EXPECT_EQ(out, (std::vector<float>{1.5f, 2, 0, 0, 2.5f, 3, 0, 0}));
}

TEST(CpuDeviceTest, SplitColumnsAndGatherRowsKeepOrder) {
  std::unique_ptr<CpuDevice> device = MakeDevice();
  std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8};  // [2, 4]
  std::vector<float> a(2), b(6);
  const Tensor parts[] = {F32(a, {2, 1}), F32(b, {2, 3})};
  ASSERT_TRUE(device->SplitColumns(F32(x, {2, 4}), parts).ok());
  EXPECT_EQ(a, (std::vector<float>{1, 5}));
  EXPECT_EQ(b, (std::vector<float>{2, 3, 4, 6, 7, 8}));

  std::vector<float> y = {10, 20, 30, 40, 50, 60, 70, 80};
  std::vector<int32_t> rows = {1};
  std::vector<float> out(4);
  ASSERT_TRUE(device
                  ->GatherRows(F32(x, {2, 4}), F32(y, {2, 4}),
                               Tensor::Of(rows.data(), DType::kI32, DeviceType::kCpu, {1}),
                               F32(out, {1, 4}))
                  .ok());
  EXPECT_EQ(out, (std::vector<float>{55, 66, 77, 88}));
}

TEST(CpuDeviceTest, ConcatColumnsUndoesSplitColumns) {
  std::unique_ptr<CpuDevice> device = MakeDevice();
  std::vector<float> a = {1, 5}, b = {2, 3, 4, 6, 7, 8};  // [2, 1], [2, 3]
  std::vector<float> out(8);
  const Tensor parts[] = {F32(a, {2, 1}), F32(b, {2, 3})};
  ASSERT_TRUE(device->ConcatColumns(parts, F32(out, {2, 4})).ok());
  EXPECT_EQ(out, (std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8}));
}

TEST(CpuDeviceTest, KvPoolSizeIsTheSharedLayoutFact) {
  std::unique_ptr<CpuDevice> device = MakeDevice();
  common::ModelConfig config;
  config.num_layers = 3;
  config.num_kv_heads = 2;
  config.head_dim = 16;
  absl::StatusOr<std::unique_ptr<KvCache>> cache = device->CreateKvCache(config, 5, 8);
  ASSERT_TRUE(cache.ok()) << cache.status();
  // F16 by default: 2 bytes, K and V, 3 layers x 8 slots x 2 heads x 16.
  EXPECT_EQ(KvBytesPerBlock(config, 8, 2), 2 * 3 * 8 * 2 * 16 * 2);
  EXPECT_EQ((*cache)->bytes(), 5 * KvBytesPerBlock(config, 8, 2));
  EXPECT_EQ(device->CreateKvCache(config, 0, 8).status().code(),
            absl::StatusCode::kInvalidArgument);
  // The 8-bit types: codes and their scales, the bytes the budget counted, and views that
  // carry the scales.
  for (kernels::cpu::KvDtype dtype :
       {kernels::cpu::KvDtype::kInt8, kernels::cpu::KvDtype::kFp8E4m3}) {
    absl::StatusOr<std::unique_ptr<CpuKvCache>> quantized = CpuKvCache::Create(config, 5, 8, dtype);
    ASSERT_TRUE(quantized.ok()) << quantized.status();
    EXPECT_EQ((*quantized)->bytes(), 5 * KvBytesPerBlock(config, 8, 1, 2));
    const kernels::cpu::KvLayerView view = (*quantized)->layer(2);
    EXPECT_EQ(view.dtype, dtype);
    EXPECT_NE(view.k_scale, nullptr);
    EXPECT_NE(view.v_scale, nullptr);
  }
}

// Multi-head latent attention's pool: the values are the keys, one pool a layer (half the
// bytes), written once, saved and loaded as K alone.
TEST(CpuDeviceTest, ALatentAttentionPoolHoldsItsKeysOnce) {
  common::ModelConfig config;
  config.num_layers = 2;
  config.num_kv_heads = 1;
  config.head_dim = 24;  // the rotary key part beside the latent
  common::ModelConfig latent = config;
  latent.mla_kv_lora_rank = 16;
  EXPECT_EQ(KvPoolsPerLayer(config), 2);
  EXPECT_EQ(KvPoolsPerLayer(latent), 1);
  EXPECT_EQ(2 * KvBytesPerBlock(latent, 8, 2), KvBytesPerBlock(config, 8, 2));
  for (kernels::cpu::KvDtype dtype : {kernels::cpu::KvDtype::kF16, kernels::cpu::KvDtype::kInt8}) {
    SCOPED_TRACE(static_cast<int>(dtype));
    const int64_t element = kernels::cpu::KvElementBytes(dtype);
    const int64_t scale = kernels::cpu::KvScaleBytes(dtype);
    auto pool = CpuKvCache::Create(latent, 4, 8, dtype);
    ASSERT_TRUE(pool.ok()) << pool.status();
    EXPECT_EQ((*pool)->bytes(), 4 * KvBytesPerBlock(latent, 8, element, scale));
    EXPECT_EQ((*pool)->block_bytes(), KvBytesPerBlock(latent, 8, element, scale));
    const kernels::cpu::KvLayerView view = (*pool)->layer(1);
    EXPECT_EQ(view.v, view.k);
    EXPECT_EQ(view.v_scale, view.k_scale);
    std::vector<float> key(24);
    for (size_t i = 0; i < key.size(); ++i) key[i] = 0.25f * static_cast<float>(i) - 2.0f;
    const int32_t slot = 8 + 3;  // block 1
    ASSERT_TRUE(kernels::cpu::WriteKv(view, key.data(), key.data(), &slot, 1).ok());
    std::vector<float> other(24, 1.0f);
    EXPECT_EQ(kernels::cpu::WriteKv(view, key.data(), other.data(), &slot, 1).code(),
              absl::StatusCode::kInvalidArgument);
    // A block saved from one pool and loaded into another holds the same bytes.
    std::vector<uint8_t> saved((*pool)->block_bytes()), again((*pool)->block_bytes());
    const int32_t block = 1, target = 3;
    uint8_t* save_to[] = {saved.data()};
    ASSERT_TRUE((*pool)->SaveBlocks(absl::MakeConstSpan(&block, 1), save_to).ok());
    auto other_pool = *CpuKvCache::Create(latent, 4, 8, dtype);
    const uint8_t* load_from[] = {saved.data()};
    ASSERT_TRUE(other_pool->LoadBlocks(load_from, absl::MakeConstSpan(&target, 1)).ok());
    uint8_t* again_to[] = {again.data()};
    ASSERT_TRUE(other_pool->SaveBlocks(absl::MakeConstSpan(&target, 1), again_to).ok());
    EXPECT_EQ(saved, again);
    EXPECT_NE(saved, std::vector<uint8_t>(saved.size(), 0));
  }
}

TEST(CpuDeviceTest, AllGatherColumnsOnOneRankIsACopy) {
  std::unique_ptr<CpuDevice> device = MakeDevice();
  EXPECT_EQ(device->world_size(), 1);
  std::vector<float> local = {1, 2, 3, 4, 5, 6};
  std::vector<float> out(6);
  ASSERT_TRUE(device->AllGatherColumns(F32(local, {2, 3}), F32(out, {2, 3})).ok());
  EXPECT_EQ(out, local);
}

TEST(CpuDeviceTest, RefusesZeroThreads) {
  CpuDeviceOptions options;
  options.num_threads = 0;
  EXPECT_EQ(CpuDevice::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace loom::model
