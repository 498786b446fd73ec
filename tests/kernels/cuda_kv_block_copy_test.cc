#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/cuda/kv_block_copy.h"
#include "tests/kernels/cuda_test_util.h"

namespace loom::kernels::cuda {
namespace {

// Pools of random bytes (per layer K, V[, K scales, V scales]) on the device, and their host copy.
struct Pools {
  std::vector<std::vector<uint8_t>> host;
  std::vector<DeviceBuffer> device;
  DeviceBuffer table;  // the bases, slot order
};

Pools MakePools(int layers, int per_layer, int64_t value_bytes, int64_t scale_bytes, int64_t blocks,
                uint32_t seed, bool zero = false) {
  Pools pools;
  std::mt19937 rng(seed);
  std::vector<uint8_t*> bases;
  for (int p = 0; p < layers * per_layer; ++p) {
    const int64_t piece = p % per_layer < 2 ? value_bytes : scale_bytes;
    std::vector<uint8_t> bytes(piece * blocks);
    for (uint8_t& b : bytes) b = zero ? 0 : static_cast<uint8_t>(rng());
    absl::StatusOr<DeviceBuffer> buffer = testing_util::UploadRaw(bytes);
    EXPECT_TRUE(buffer.ok()) << buffer.status();
    bases.push_back(static_cast<uint8_t*>(buffer->data()));
    pools.device.push_back(*std::move(buffer));
    pools.host.push_back(std::move(bytes));
  }
  absl::StatusOr<DeviceBuffer> table = testing_util::UploadRaw(bases);
  EXPECT_TRUE(table.ok()) << table.status();
  pools.table = *std::move(table);
  return pools;
}

// The slots of `blocks` as the host tier lays them out (CpuKvCache::SaveBlocks' order): per
// layer K, V, then K scales, V scales.
std::vector<uint8_t> ReferenceSlots(const Pools& pools, int layers, int per_layer,
                                    int64_t value_bytes, int64_t scale_bytes,
                                    const std::vector<int32_t>& blocks) {
  std::vector<uint8_t> out;
  for (int32_t block : blocks) {
    for (int l = 0; l < layers; ++l) {
      for (int part = 0; part < per_layer; ++part) {
        const int64_t piece = part < 2 ? value_bytes : scale_bytes;
        const std::vector<uint8_t>& pool = pools.host[l * per_layer + part];
        out.insert(out.end(), pool.begin() + block * piece, pool.begin() + (block + 1) * piece);
      }
    }
  }
  return out;
}

KvBlockCopyParams ParamsFor(const Pools& pools, int layers, int per_layer, int64_t value_bytes,
                            int64_t scale_bytes, int64_t pool_blocks) {
  KvBlockCopyParams p;
  p.pools = static_cast<uint8_t* const*>(pools.table.data());
  p.num_layers = layers;
  p.pools_per_layer = per_layer;
  p.value_bytes = value_bytes;
  p.scale_bytes = scale_bytes;
  p.pool_blocks = pool_blocks;
  return p;
}

TEST(KvBlockCopyParamsTest, RefusesBadShapesAndBlocksOutsideThePools) {
  uint8_t* fake_pools[2] = {};
  uint8_t staging = 0;
  KvBlockCopyParams good;
  good.pools = fake_pools;
  good.num_layers = 1;
  good.value_bytes = 64;
  good.pool_blocks = 4;
  good.staging = &staging;
  good.num_blocks = 2;
  good.blocks[0] = 3;
  good.blocks[1] = 0;
  EXPECT_TRUE(CheckKvBlockCopyParams(good).ok());
  EXPECT_EQ(KvBlockCopySlotBytes(good), 128);
  auto refused = [](KvBlockCopyParams p) {
    return CheckKvBlockCopyParams(p).code() == absl::StatusCode::kInvalidArgument;
  };
  KvBlockCopyParams p = good;
  p.blocks[1] = 4;  // one past the pools
  EXPECT_TRUE(refused(p));
  p = good;
  p.blocks[0] = -1;
  EXPECT_TRUE(refused(p));
  p = good;
  p.num_blocks = kKvBlockCopyMaxBlocks + 1;
  EXPECT_TRUE(refused(p));
  p = good;
  p.pools_per_layer = 3;
  EXPECT_TRUE(refused(p));
  p = good;
  p.pools_per_layer = 4;  // scales without scale bytes
  EXPECT_TRUE(refused(p));
  p = good;
  p.scale_bytes = 8;  // scale bytes without scale pools
  EXPECT_TRUE(refused(p));
  p = good;
  p.value_bytes = 0;
  EXPECT_TRUE(refused(p));
  p = good;
  p.staging = nullptr;
  EXPECT_TRUE(refused(p));
  p.num_blocks = 0;  // nothing to move: no pointers needed
  EXPECT_TRUE(CheckKvBlockCopyParams(p).ok());
}

// Gathered slots equal the host layout byte for byte, and scattering them into other blocks of
// zeroed pools puts each piece where it came from: 16-byte pieces (F16 K/V, 8-bit scales of 16
// tokens) and pieces whose size or alignment needs the byte loop (scales of 3 tokens).
TEST(CudaKvBlockCopyTest, GatherAndScatterFollowTheHostSlotLayout) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  struct Case {
    int layers, per_layer;
    int64_t value_bytes, scale_bytes;
  } cases[] = {{3, 2, 16 * 2 * 64 * 2, 0}, {2, 4, 16 * 2 * 64, 16 * 2 * 2}, {2, 4, 3 * 64, 3 * 2}};
  constexpr int64_t kPoolBlocks = 9;
  uint32_t seed = 40;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.scale_bytes);
    const Pools source =
        MakePools(c.layers, c.per_layer, c.value_bytes, c.scale_bytes, kPoolBlocks, seed++);
    const std::vector<int32_t> blocks = {7, 0, 3, 8};
    KvBlockCopyParams p =
        ParamsFor(source, c.layers, c.per_layer, c.value_bytes, c.scale_bytes, kPoolBlocks);
    const int64_t slot = KvBlockCopySlotBytes(p);
    absl::StatusOr<DeviceBuffer> staging = DeviceBuffer::Allocate(blocks.size() * slot);
    ASSERT_TRUE(staging.ok()) << staging.status();
    p.staging = static_cast<uint8_t*>(staging->data());
    p.num_blocks = static_cast<int>(blocks.size());
    for (size_t i = 0; i < blocks.size(); ++i) p.blocks[i] = blocks[i];
    ASSERT_TRUE(LaunchKvBlockCopy(p, nullptr).ok());
    std::vector<uint8_t> staged(blocks.size() * slot);
    ASSERT_TRUE(staging->CopyToHost(staged.data(), staged.size()).ok());
    EXPECT_EQ(staged,
              ReferenceSlots(source, c.layers, c.per_layer, c.value_bytes, c.scale_bytes, blocks));

    // Scattered into blocks 1, 2, 5, 6 of zeroed pools: those hold the sources' bytes, the
    // others stay zero.
    const Pools target = MakePools(c.layers, c.per_layer, c.value_bytes, c.scale_bytes, kPoolBlocks,
                                   0, /*zero=*/true);
    const std::vector<int32_t> targets = {1, 2, 5, 6};
    KvBlockCopyParams back =
        ParamsFor(target, c.layers, c.per_layer, c.value_bytes, c.scale_bytes, kPoolBlocks);
    back.staging = p.staging;
    back.num_blocks = p.num_blocks;
    back.to_staging = false;
    for (size_t i = 0; i < targets.size(); ++i) back.blocks[i] = targets[i];
    ASSERT_TRUE(LaunchKvBlockCopy(back, nullptr).ok());
    for (size_t pool = 0; pool < target.device.size(); ++pool) {
      const int64_t piece = pool % c.per_layer < 2 ? c.value_bytes : c.scale_bytes;
      std::vector<uint8_t> got(piece * kPoolBlocks), expected(piece * kPoolBlocks, 0);
      ASSERT_TRUE(target.device[pool].CopyToHost(got.data(), got.size()).ok());
      for (size_t i = 0; i < targets.size(); ++i) {
        std::copy_n(source.host[pool].begin() + blocks[i] * piece, piece,
                    expected.begin() + targets[i] * piece);
      }
      EXPECT_EQ(got, expected) << "pool " << pool;
    }
  }
}

}  // namespace
}  // namespace loom::kernels::cuda
