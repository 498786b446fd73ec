#include "worker/kv_host_tier.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/kv_dtype.h"
#include "model/cpu_kv_cache.h"

namespace loom::worker {
namespace {

using kernels::cpu::KvDtype;
using ::testing::HasSubstr;

constexpr int64_t kBlocks = 5;
constexpr int64_t kBlockSize = 8;

common::ModelConfig Config() {
  common::ModelConfig config;
  config.num_layers = 3;
  config.num_kv_heads = 2;
  config.head_dim = 16;
  return config;
}

// Every byte of the pool (values and scales), layer by layer, as the kernels see it.
struct PoolBytes {
  std::vector<std::vector<uint8_t>> k, v, k_scale, v_scale;
};

int64_t LayerValueBytes(KvDtype dtype) {
  return kBlocks * kBlockSize * Config().num_kv_heads * Config().head_dim *
         static_cast<int64_t>(kernels::cpu::KvElementBytes(dtype));
}

int64_t LayerScaleBytes(KvDtype dtype) {
  return kernels::cpu::IsQuantizedKv(dtype)
             ? kBlocks * kBlockSize * Config().num_kv_heads * int64_t{2}
             : 0;
}

void Randomize(const model::CpuKvCache& cache, uint32_t seed) {
  std::mt19937 rng(seed);
  const auto fill = [&](void* data, int64_t bytes) {
    auto* out = static_cast<uint8_t*>(data);
    for (int64_t i = 0; i < bytes; ++i) out[i] = static_cast<uint8_t>(rng());
  };
  for (int64_t l = 0; l < cache.num_layers(); ++l) {
    const kernels::cpu::KvLayerView view = cache.layer(l);
    fill(view.k, LayerValueBytes(cache.dtype()));
    fill(view.v, LayerValueBytes(cache.dtype()));
    if (LayerScaleBytes(cache.dtype()) > 0) {
      fill(view.k_scale, LayerScaleBytes(cache.dtype()));
      fill(view.v_scale, LayerScaleBytes(cache.dtype()));
    }
  }
}

// Block `block`'s bytes of every layer's K, V and scales.
std::vector<uint8_t> BlockBytes(const model::CpuKvCache& cache, int32_t block) {
  std::vector<uint8_t> out;
  const int64_t values = LayerValueBytes(cache.dtype()) / kBlocks;
  const int64_t scales = LayerScaleBytes(cache.dtype()) / kBlocks;
  const auto take = [&](const void* data, int64_t size) {
    const auto* bytes = static_cast<const uint8_t*>(data) + block * size;
    out.insert(out.end(), bytes, bytes + size);
  };
  for (int64_t l = 0; l < cache.num_layers(); ++l) {
    const kernels::cpu::KvLayerView view = cache.layer(l);
    take(view.k, values);
    take(view.v, values);
    if (scales > 0) {
      take(view.k_scale, scales);
      take(view.v_scale, scales);
    }
  }
  return out;
}

std::unique_ptr<model::CpuKvCache> MakePool(KvDtype dtype) {
  absl::StatusOr<std::unique_ptr<model::CpuKvCache>> cache =
      model::CpuKvCache::Create(Config(), kBlocks, kBlockSize, dtype);
  EXPECT_TRUE(cache.ok()) << cache.status();
  return *std::move(cache);
}

class KvHostTierDtypeTest : public ::testing::TestWithParam<KvDtype> {};

TEST_P(KvHostTierDtypeTest, ABlockOffloadedAndReloadedIsBitIdentical) {
  std::unique_ptr<model::CpuKvCache> pool = MakePool(GetParam());
  EXPECT_EQ(pool->block_bytes(), pool->num_layers() * 2 *
                                     (LayerValueBytes(GetParam()) + LayerScaleBytes(GetParam())) /
                                     kBlocks);
  Randomize(*pool, 1);
  const std::vector<uint8_t> saved2 = BlockBytes(*pool, 2);
  const std::vector<uint8_t> saved0 = BlockBytes(*pool, 0);
  absl::StatusOr<std::unique_ptr<KvHostTier>> tier =
      KvHostTier::Create(3 * pool->block_bytes() + 5, pool.get());
  ASSERT_TRUE(tier.ok()) << tier.status();
  EXPECT_EQ((*tier)->num_slots(), 3);
  ASSERT_TRUE((*tier)->Apply({{true, 2, 1}, {true, 0, 2}}).ok());

  // The pool is overwritten (the blocks reused), then the two come back elsewhere.
  Randomize(*pool, 2);
  const std::vector<uint8_t> untouched = BlockBytes(*pool, 3);
  ASSERT_TRUE((*tier)->Apply({{false, 4, 1}, {false, 1, 2}}).ok());
  EXPECT_EQ(BlockBytes(*pool, 4), saved2);
  EXPECT_EQ(BlockBytes(*pool, 1), saved0);
  EXPECT_EQ(BlockBytes(*pool, 3), untouched);

  const KvTransferStats& stats = (*tier)->stats();
  EXPECT_EQ(stats.blocks_to_host, 2);
  EXPECT_EQ(stats.blocks_to_device, 2);
  EXPECT_EQ(stats.bytes_to_host, 2 * pool->block_bytes());
  EXPECT_EQ(stats.bytes_to_device, 2 * pool->block_bytes());
}

INSTANTIATE_TEST_SUITE_P(Dtypes, KvHostTierDtypeTest,
                         ::testing::Values(KvDtype::kF16, KvDtype::kBf16, KvDtype::kF32,
                                           KvDtype::kInt8, KvDtype::kFp8E4m3));

TEST(KvHostTierTest, CopiesRunInOrderWithinOnePlan) {
  std::unique_ptr<model::CpuKvCache> pool = MakePool(KvDtype::kF16);
  Randomize(*pool, 3);
  const std::vector<uint8_t> block1 = BlockBytes(*pool, 1);
  const std::vector<uint8_t> block2 = BlockBytes(*pool, 2);
  absl::StatusOr<std::unique_ptr<KvHostTier>> tier =
      KvHostTier::Create(2 * pool->block_bytes(), pool.get());
  ASSERT_TRUE(tier.ok());
  // Slot 0 takes block 1, is read into block 3, then takes block 2, read into block 4;
  // block 2 is offloaded before the reload that overwrites it.
  ASSERT_TRUE((*tier)
                  ->Apply({{true, 1, 0},
                           {false, 3, 0},
                           {true, 2, 0},
                           {false, 4, 0},
                           {true, 2, 1},
                           {false, 2, 0}})
                  .ok());
  EXPECT_EQ(BlockBytes(*pool, 3), block1);
  EXPECT_EQ(BlockBytes(*pool, 4), block2);
  EXPECT_EQ(BlockBytes(*pool, 2), block2);
}

TEST(KvHostTierTest, RefusesBadCopiesByNameAndCopiesNothing) {
  std::unique_ptr<model::CpuKvCache> pool = MakePool(KvDtype::kF16);
  Randomize(*pool, 4);
  const std::vector<uint8_t> before = BlockBytes(*pool, 0);
  absl::StatusOr<std::unique_ptr<KvHostTier>> tier =
      KvHostTier::Create(2 * pool->block_bytes(), pool.get());
  ASSERT_TRUE(tier.ok());
  absl::Status status = (*tier)->Apply({{true, 1, 0}, {true, kBlocks, 1}});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("block 5 is not in the pool [0, 5)"));
  status = (*tier)->Apply({{true, 1, 0}, {true, 1, 2}});
  EXPECT_THAT(status.message(), HasSubstr("host slot 2 is not in the host tier [0, 2)"));
  status = (*tier)->Apply({{true, 1, -1}});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  // Nothing was offloaded by the refused plans: slot 0 holds no block.
  status = (*tier)->Apply({{false, 0, 0}});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("host slot 0 holds no block"));
  EXPECT_EQ(BlockBytes(*pool, 0), before);
  EXPECT_EQ((*tier)->stats().blocks_to_host, 0);
  // A pool with a block the coordinator never names (a CUDA pool's scratch block): copies
  // stop before it.
  absl::StatusOr<std::unique_ptr<KvHostTier>> short_tier =
      KvHostTier::Create(2 * pool->block_bytes(), pool.get(), 1, kBlocks - 1);
  ASSERT_TRUE(short_tier.ok());
  status = (*short_tier)->Apply({{true, kBlocks - 1, 0}});
  EXPECT_THAT(status.message(), HasSubstr("block 4 is not in the pool [0, 4)"));
  EXPECT_TRUE((*short_tier)->Apply({{true, kBlocks - 2, 0}}).ok());
}

TEST(KvHostTierTest, RefusesATierThatHoldsNoBlock) {
  std::unique_ptr<model::CpuKvCache> pool = MakePool(KvDtype::kF16);
  absl::StatusOr<std::unique_ptr<KvHostTier>> tier =
      KvHostTier::Create(pool->block_bytes() - 1, pool.get());
  EXPECT_EQ(tier.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(tier.status().message(), HasSubstr("holds no block"));
}

TEST(KvHostTierTest, MeasuresALoadWithoutChangingThePool) {
  std::unique_ptr<model::CpuKvCache> pool = MakePool(KvDtype::kInt8);
  Randomize(*pool, 5);
  const std::vector<uint8_t> before = BlockBytes(*pool, 0);
  absl::StatusOr<std::unique_ptr<KvHostTier>> tier =
      KvHostTier::Create(pool->block_bytes(), pool.get());
  ASSERT_TRUE(tier.ok());
  absl::StatusOr<double> seconds = (*tier)->MeasureLoadSeconds();
  ASSERT_TRUE(seconds.ok()) << seconds.status();
  EXPECT_GT(*seconds, 0);
  EXPECT_EQ(BlockBytes(*pool, 0), before);
  // The measurement's round trip left no offloaded block behind.
  EXPECT_EQ((*tier)->Apply({{false, 1, 0}}).code(), absl::StatusCode::kInvalidArgument);
}

TEST(KvHostTierTest, WithoutAPoolItOnlyKeepsTheBooks) {
  absl::StatusOr<std::unique_ptr<KvHostTier>> tier = KvHostTier::Create(10, nullptr, 3);
  ASSERT_TRUE(tier.ok());
  EXPECT_EQ((*tier)->num_slots(), 3);
  EXPECT_EQ((*tier)->Apply({{false, 0, 1}}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE((*tier)->Apply({{true, 7, 1}, {false, 9, 1}}).ok());
  EXPECT_EQ((*tier)->stats().bytes_to_device, 3);
}

}  // namespace
}  // namespace loom::worker
