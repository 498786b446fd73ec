#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
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
  // A block named twice: gathered twice is fine, scattered twice (two slots racing into one
  // block) refused.
  p = good;
  p.blocks[1] = 3;
  EXPECT_TRUE(CheckKvBlockCopyParams(p).ok());
  p.to_staging = false;
  EXPECT_NE(CheckKvBlockCopyParams(p).message().find("blocks[1] 3 repeats blocks[0]"),
            std::string::npos)
      << CheckKvBlockCopyParams(p);
}

KvPoolCopyParams GoodPoolCopy(uint8_t* const* src_parts, uint8_t* const* dest_parts) {
  KvPoolCopyParams p;
  p.src_parts = src_parts;
  p.dest_parts = dest_parts;
  p.num_layers = 1;
  p.value_bytes = 64;
  p.src_pool_blocks = 3;
  p.dest_pool_blocks = 5;
  p.num_blocks = 2;
  p.src_blocks[0] = 2;
  p.src_blocks[1] = 2;  // a source block may go to several destinations
  p.dest_blocks[0] = 4;
  p.dest_blocks[1] = 0;
  return p;
}

TEST(KvBlockCopyParamsTest, PoolToPoolRefusesBadShapesBlocksOutsideEitherPoolAndRepeats) {
  uint8_t* fake_parts[2] = {};
  const KvPoolCopyParams good = GoodPoolCopy(fake_parts, fake_parts);
  EXPECT_TRUE(CheckKvPoolCopyParams(good).ok());
  auto refusal = [](const KvPoolCopyParams& p) { return CheckKvPoolCopyParams(p); };
  KvPoolCopyParams p = good;
  p.src_blocks[1] = 3;  // one past the source pool (the destination has 5)
  EXPECT_EQ(refusal(p).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refusal(p).message().find("src_blocks[1] 3"), std::string::npos) << refusal(p);
  p = good;
  p.dest_blocks[0] = 5;  // one past the destination pool
  EXPECT_NE(refusal(p).message().find("dest_blocks[0] 5"), std::string::npos) << refusal(p);
  p = good;
  p.dest_blocks[1] = -1;
  EXPECT_EQ(refusal(p).code(), absl::StatusCode::kInvalidArgument);
  p = good;
  p.dest_blocks[1] = 4;  // written twice
  EXPECT_NE(refusal(p).message().find("repeats dest_blocks[0]"), std::string::npos) << refusal(p);
  p = good;
  p.num_blocks = kKvBlockCopyMaxBlocks + 1;
  EXPECT_NE(refusal(p).message().find("num_blocks"), std::string::npos) << refusal(p);
  p = good;
  p.num_blocks = -1;
  EXPECT_EQ(refusal(p).code(), absl::StatusCode::kInvalidArgument);
  p = good;
  p.pools_per_layer = 3;
  EXPECT_NE(refusal(p).message().find("pools_per_layer 3"), std::string::npos) << refusal(p);
  p = good;
  p.num_layers = 0;
  EXPECT_NE(refusal(p).message().find("num_layers 0"), std::string::npos) << refusal(p);
  p = good;
  p.pools_per_layer = 4;  // scales without scale bytes
  EXPECT_NE(refusal(p).message().find("scale_bytes 0"), std::string::npos) << refusal(p);
  p = good;
  p.scale_bytes = 8;  // scale bytes without scale parts
  EXPECT_NE(refusal(p).message().find("scale_bytes 8"), std::string::npos) << refusal(p);
  p = good;
  p.value_bytes = 0;
  EXPECT_NE(refusal(p).message().find("value_bytes 0"), std::string::npos) << refusal(p);
  p = good;
  p.src_parts = nullptr;
  EXPECT_NE(refusal(p).message().find("null src_parts"), std::string::npos) << refusal(p);
  p.num_blocks = 0;  // nothing to move: no pointers needed
  EXPECT_TRUE(CheckKvPoolCopyParams(p).ok());
  p = good;
  p.dest_parts = nullptr;
  EXPECT_EQ(refusal(p).code(), absl::StatusCode::kInvalidArgument);
  // The launch checks first, with or without CUDA.
  p = good;
  p.dest_blocks[1] = 4;
  EXPECT_EQ(LaunchKvPoolCopy(p, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

// The reference itself, on parts whose every byte names its part and block: each destination
// block of each part holds its source block of the same part, the other blocks are untouched,
// and a refused copy writes nothing.
TEST(KvBlockCopyParamsTest, PoolToPoolHostReferenceCopiesEachPartsBlockToItsDestination) {
  constexpr int kLayers = 2, kPerLayer = 4;
  constexpr int64_t kValue = 6, kScale = 2, kSrcBlocks = 3, kDestBlocks = 4;
  std::vector<std::vector<uint8_t>> src(kLayers * kPerLayer), dest(kLayers * kPerLayer);
  std::vector<uint8_t*> src_parts, dest_parts;
  for (int part = 0; part < kLayers * kPerLayer; ++part) {
    const int64_t piece = part % kPerLayer < 2 ? kValue : kScale;
    for (int64_t b = 0; b < kSrcBlocks * piece; ++b) {
      src[part].push_back(static_cast<uint8_t>(16 * part + b / piece));
    }
    dest[part].assign(kDestBlocks * piece, 0xee);
    src_parts.push_back(src[part].data());
    dest_parts.push_back(dest[part].data());
  }
  KvPoolCopyParams p;
  p.src_parts = src_parts.data();
  p.dest_parts = dest_parts.data();
  p.num_layers = kLayers;
  p.pools_per_layer = kPerLayer;
  p.value_bytes = kValue;
  p.scale_bytes = kScale;
  p.src_pool_blocks = kSrcBlocks;
  p.dest_pool_blocks = kDestBlocks;
  p.num_blocks = 3;
  const int32_t from[] = {2, 0, 2}, to[] = {0, 3, 1};
  std::copy_n(from, 3, p.src_blocks);
  std::copy_n(to, 3, p.dest_blocks);
  ASSERT_TRUE(KvPoolCopyOnHost(p).ok());
  for (int part = 0; part < kLayers * kPerLayer; ++part) {
    const int64_t piece = part % kPerLayer < 2 ? kValue : kScale;
    const int expected_block[kDestBlocks] = {2, 2, -1, 0};  // -1: untouched
    for (int64_t b = 0; b < kDestBlocks * piece; ++b) {
      const int block = expected_block[b / piece];
      EXPECT_EQ(dest[part][b], block < 0 ? 0xee : 16 * part + block)
          << "part " << part << " byte " << b;
    }
  }
  const std::vector<std::vector<uint8_t>> before = dest;
  p.src_blocks[0] = 1;           // would change destination block 0 ...
  p.src_blocks[2] = kSrcBlocks;  // ... but the last entry is refused: nothing is written
  EXPECT_EQ(KvPoolCopyOnHost(p).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(dest, before);
}

// Gathered slots equal the host layout byte for byte, and scattering them into other blocks of
// zeroed pools puts each piece where it came from: 16-byte pieces (F16 K/V, 8-bit scales of 16
// tokens) and pieces whose size or alignment needs the byte loop (scales of 3 tokens).
// Some heads of each token row between pools of other tensor-parallel slices: the reference
// against the layout element by element (every byte names its part, block, row and head), the
// other heads of a destination row and the other blocks untouched; and the shapes refused.
TEST(KvBlockCopyParamsTest, PoolToPoolHostReferenceMapsHeadsRowByRow) {
  constexpr int kLayers = 2, kPerLayer = 4, kRows = 3;
  constexpr int64_t kValueHead = 4, kScaleHead = 2, kSrcBlocks = 2, kDestBlocks = 3;
  struct Case {
    int src_heads, dest_heads, src_first, dest_first, count;
  } cases[] = {{4, 2, 2, 0, 2}, {2, 4, 0, 2, 2}, {3, 3, 1, 0, 2}};
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::Message() << c.src_heads << "->" << c.dest_heads);
    std::vector<std::vector<uint8_t>> src(kLayers * kPerLayer), dest(kLayers * kPerLayer);
    std::vector<uint8_t*> src_parts, dest_parts;
    for (int part = 0; part < kLayers * kPerLayer; ++part) {
      const int64_t head = part % kPerLayer < 2 ? kValueHead : kScaleHead;
      for (int64_t b = 0; b < kSrcBlocks * kRows * c.src_heads * head; ++b) {
        src[part].push_back(static_cast<uint8_t>(b * 7 + part));  // distinct within a part
      }
      dest[part].assign(kDestBlocks * kRows * c.dest_heads * head, 0xee);
      src_parts.push_back(src[part].data());
      dest_parts.push_back(dest[part].data());
    }
    KvPoolCopyParams p;
    p.src_parts = src_parts.data();
    p.dest_parts = dest_parts.data();
    p.num_layers = kLayers;
    p.pools_per_layer = kPerLayer;
    p.value_bytes = kRows * c.dest_heads * kValueHead;
    p.scale_bytes = kRows * c.dest_heads * kScaleHead;
    p.src_pool_blocks = kSrcBlocks;
    p.dest_pool_blocks = kDestBlocks;
    p.num_blocks = 2;
    p.src_blocks[0] = 1, p.dest_blocks[0] = 2;
    p.src_blocks[1] = 0, p.dest_blocks[1] = 0;
    p.heads = {kRows, c.src_heads, c.dest_heads, c.src_first, c.dest_first, c.count};
    ASSERT_TRUE(KvPoolCopyOnHost(p).ok());
    const int source_of[kDestBlocks] = {0, -1, 1};
    for (int part = 0; part < kLayers * kPerLayer; ++part) {
      const int64_t head = part % kPerLayer < 2 ? kValueHead : kScaleHead;
      for (int block = 0; block < kDestBlocks; ++block) {
        for (int row = 0; row < kRows; ++row) {
          for (int h = 0; h < c.dest_heads; ++h) {
            for (int64_t byte = 0; byte < head; ++byte) {
              const int64_t at = ((block * kRows + row) * c.dest_heads + h) * head + byte;
              const int s = h - c.dest_first + c.src_first;  // the source row's head
              const bool copied =
                  source_of[block] >= 0 && h >= c.dest_first && h < c.dest_first + c.count;
              const uint8_t want =
                  copied ? src[part]
                              [((source_of[block] * kRows + row) * c.src_heads + s) * head + byte]
                         : 0xee;
              ASSERT_EQ(dest[part][at], want) << "part " << part << " block " << block << " row "
                                              << row << " head " << h << " byte " << byte;
            }
          }
        }
      }
    }
    // A mapping past either row, or parts that are not rows of whole heads, is refused.
    KvPoolCopyParams bad = p;
    bad.heads.src_first = c.src_heads - c.count + 1;
    EXPECT_NE(CheckKvPoolCopyParams(bad).message().find("outside a row"), std::string::npos);
    bad = p;
    bad.heads.dest_first = c.dest_heads - c.count + 1;
    EXPECT_EQ(CheckKvPoolCopyParams(bad).code(), absl::StatusCode::kInvalidArgument);
    bad = p;
    bad.value_bytes += 1;
    EXPECT_NE(CheckKvPoolCopyParams(bad).message().find("is not 3 rows"), std::string::npos)
        << CheckKvPoolCopyParams(bad);
    EXPECT_EQ(KvPoolCopySourceBytes(p, 0), kRows * c.src_heads * kValueHead);
    EXPECT_EQ(KvPoolCopySourceBytes(p, 3), kRows * c.src_heads * kScaleHead);
  }
}

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

// Pool to pool: a full launch of kKvBlockCopyMaxBlocks entries (source blocks repeated,
// destinations scattered) between random pools of different block counts equals the host
// reference over the whole destination pool, bit for bit (the blocks not written keep their
// random bytes): F16 K/V, 8-bit KV with its scales, pieces long enough for the unrolled 16-byte
// rounds and their tail, and pieces that need the byte loop (scales of 3 tokens).
// Launches `p` (between the device parts of `src` and `dest`) and holds each destination part
// against KvPoolCopyOnHost over the host copies of both: equal, and changed by the copy.
void ExpectLaunchMatchesHostReference(KvPoolCopyParams p, const Pools& src, const Pools& dest) {
  p.src_parts = static_cast<const uint8_t* const*>(src.table.data());
  p.dest_parts = static_cast<uint8_t* const*>(dest.table.data());
  ASSERT_TRUE(LaunchKvPoolCopy(p, nullptr).ok());
  std::vector<std::vector<uint8_t>> expected = dest.host;
  std::vector<uint8_t*> host_src, host_dest;
  for (size_t part = 0; part < expected.size(); ++part) {
    host_src.push_back(const_cast<uint8_t*>(src.host[part].data()));
    host_dest.push_back(expected[part].data());
  }
  KvPoolCopyParams reference = p;
  reference.src_parts = host_src.data();
  reference.dest_parts = host_dest.data();
  ASSERT_TRUE(KvPoolCopyOnHost(reference).ok());
  for (size_t part = 0; part < expected.size(); ++part) {
    std::vector<uint8_t> got(expected[part].size());
    ASSERT_TRUE(dest.device[part].CopyToHost(got.data(), got.size()).ok());
    EXPECT_EQ(got, expected[part]) << "part " << part;
    EXPECT_NE(expected[part], dest.host[part]) << "part " << part << ": nothing was copied";
  }
}

TEST(CudaKvBlockCopyTest, PoolToPoolCopyMatchesTheHostReference) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  struct Case {
    int layers, per_layer;
    int64_t value_bytes, scale_bytes;
  } cases[] = {{3, 2, 16 * 2 * 64 * 2, 0},
               {2, 4, 16 * 2 * 64, 16 * 2 * 2},
               {2, 2, 16 * 5 * 128 * 2, 0},  // 1,280 16-byte words: a 1,024-word round + tail
               {2, 4, 3 * 64, 3 * 2}};
  constexpr int64_t kSrcBlocks = 70, kDestBlocks = 90;
  uint32_t seed = 60;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.value_bytes);
    const Pools src =
        MakePools(c.layers, c.per_layer, c.value_bytes, c.scale_bytes, kSrcBlocks, seed++);
    const Pools dest =
        MakePools(c.layers, c.per_layer, c.value_bytes, c.scale_bytes, kDestBlocks, seed++);
    std::mt19937 rng(seed++);
    std::vector<int32_t> dest_ids(kDestBlocks);
    for (int64_t b = 0; b < kDestBlocks; ++b) dest_ids[b] = static_cast<int32_t>(b);
    std::shuffle(dest_ids.begin(), dest_ids.end(), rng);
    KvPoolCopyParams p;
    p.num_layers = c.layers;
    p.pools_per_layer = c.per_layer;
    p.value_bytes = c.value_bytes;
    p.scale_bytes = c.scale_bytes;
    p.src_pool_blocks = kSrcBlocks;
    p.dest_pool_blocks = kDestBlocks;
    p.num_blocks = kKvBlockCopyMaxBlocks;
    for (int i = 0; i < kKvBlockCopyMaxBlocks; ++i) {
      p.src_blocks[i] = static_cast<int32_t>(rng() % kSrcBlocks);
      p.dest_blocks[i] = dest_ids[i];
    }
    ExpectLaunchMatchesHostReference(p, src, dest);
  }
}

// The same with heads mapped between pools of other tensor-parallel slices (KvHeadCopy): half
// of an 8-head source row into a 4-head row and a 4-head row into half of an 8-head one (16-byte
// runs), BF16 scales (2 bytes a head: the byte path), and an odd 3-head source.
TEST(CudaKvBlockCopyTest, PoolToPoolHeadCopyMatchesTheHostReference) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  struct Case {
    int per_layer;
    int64_t value_head, scale_head;
    KvHeadCopy heads;
  } cases[] = {{2, 128 * 2, 0, {16, 8, 4, 4, 0, 4}},
               {4, 64, 2, {16, 4, 8, 0, 4, 4}},
               {2, 64 * 2, 0, {16, 3, 2, 1, 0, 2}}};
  constexpr int kLayers = 2;
  constexpr int64_t kSrcBlocks = 70, kDestBlocks = 90;
  uint32_t seed = 90;
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::Message() << c.heads.src_heads << "->" << c.heads.dest_heads);
    const int64_t rows = c.heads.block_size;
    const Pools src = MakePools(kLayers, c.per_layer, rows * c.heads.src_heads * c.value_head,
                                rows * c.heads.src_heads * c.scale_head, kSrcBlocks, seed++);
    const Pools dest = MakePools(kLayers, c.per_layer, rows * c.heads.dest_heads * c.value_head,
                                 rows * c.heads.dest_heads * c.scale_head, kDestBlocks, seed++);
    KvPoolCopyParams p;
    p.num_layers = kLayers;
    p.pools_per_layer = c.per_layer;
    p.value_bytes = rows * c.heads.dest_heads * c.value_head;
    p.scale_bytes = rows * c.heads.dest_heads * c.scale_head;
    p.src_pool_blocks = kSrcBlocks;
    p.dest_pool_blocks = kDestBlocks;
    p.heads = c.heads;
    p.num_blocks = kKvBlockCopyMaxBlocks;
    std::mt19937 rng(seed++);
    for (int i = 0; i < kKvBlockCopyMaxBlocks; ++i) {
      p.src_blocks[i] = static_cast<int32_t>(rng() % kSrcBlocks);
      p.dest_blocks[i] = static_cast<int32_t>(kDestBlocks - 1 - i);
    }
    ExpectLaunchMatchesHostReference(p, src, dest);
  }
}

}  // namespace
}  // namespace loom::kernels::cuda
