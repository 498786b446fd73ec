#include "model/cpu_kv_cache.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/kv_dtype.h"

namespace loom::model {
namespace {

using ::testing::HasSubstr;

common::ModelConfig Config(int64_t kv_heads = 2) {
  common::ModelConfig config;
  config.num_layers = 3;
  config.num_kv_heads = kv_heads;
  config.head_dim = 32;
  return config;
}

std::vector<uint8_t> Saved(const CpuKvCache& pool, int32_t block) {
  std::vector<uint8_t> bytes(static_cast<size_t>(pool.block_bytes()));
  uint8_t* out = bytes.data();
  EXPECT_TRUE(pool.SaveBlocks(absl::MakeConstSpan(&block, 1), absl::MakeConstSpan(&out, 1)).ok());
  return bytes;
}

void Fill(const CpuKvCache& pool, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> slot(static_cast<size_t>(pool.block_bytes()));
  for (int32_t block = 0; block < pool.num_blocks(); ++block) {
    for (uint8_t& byte : slot) byte = static_cast<uint8_t>(rng());
    const uint8_t* in = slot.data();
    ASSERT_TRUE(pool.LoadBlocks(absl::MakeConstSpan(&in, 1), absl::MakeConstSpan(&block, 1)).ok());
  }
}

// `share` as another process maps it: its memory file, mapped again (read-only).
struct Mapped {
  explicit Mapped(const KvPoolShare& share) : bytes(share.file_bytes) {
    data = static_cast<uint8_t*>(
        mmap(nullptr, static_cast<size_t>(bytes), PROT_READ, MAP_SHARED, share.fd, 0));
    peer.num_blocks = share.num_blocks;
    for (const KvPoolPart& part : share.parts) {
      peer.bases.push_back(data + part.offset);
      peer.block_bytes.push_back(part.block_bytes);
    }
  }
  ~Mapped() { munmap(data, static_cast<size_t>(bytes)); }
  int64_t bytes;
  uint8_t* data = nullptr;
  PeerKvPool peer;
};

class CpuKvCacheShareTest : public ::testing::TestWithParam<kernels::cpu::KvDtype> {};

TEST_P(CpuKvCacheShareTest, ASharedPoolIsCopiedBlockForBlockFromItsMemoryFile) {
  const std::unique_ptr<CpuKvCache> source = *CpuKvCache::Create(Config(), 12, 8, GetParam(), true);
  const std::unique_ptr<CpuKvCache> dest = *CpuKvCache::Create(Config(), 12, 8, GetParam());
  Fill(*source, 1);
  Fill(*dest, 2);
  const absl::StatusOr<KvPoolShare> share = source->Share();
  ASSERT_TRUE(share.ok()) << share.status();
  EXPECT_EQ(share->kind, KvPoolShare::Kind::kHostFile);
  EXPECT_EQ(share->num_blocks, 12);
  // Every part of a block, in the slot's order: together one slot.
  int64_t slot = 0;
  for (const KvPoolPart& part : share->parts) slot += part.block_bytes;
  EXPECT_EQ(slot, source->block_bytes());
  EXPECT_EQ(share->parts.size(), kernels::cpu::IsQuantizedKv(GetParam()) ? 12u : 6u);

  Mapped mapped(*share);
  const std::vector<uint8_t> kept = Saved(*dest, 0);
  const std::vector<int32_t> from = {11, 3, 0}, to = {2, 7, 5};
  ASSERT_TRUE(dest->CopyBlocksFromPeer(mapped.peer, from, to, {}).ok());
  for (size_t i = 0; i < from.size(); ++i) EXPECT_EQ(Saved(*dest, to[i]), Saved(*source, from[i]));
  EXPECT_EQ(Saved(*dest, 0), kept);
}

// Between pools of other tensor-parallel slices (PeerHeads): a 4-head source's heads [2, 4)
// into a 2-head pool (TP 1 to rank 1 of 2), and a 2-head source into heads [2, 4) of a 4-head
// pool (rank 1 of 2 to TP 1): every K and V value (and 8-bit scale) of each token row of the
// named heads, the other heads and blocks untouched; heads outside a row refused.
TEST_P(CpuKvCacheShareTest, PeerCopiesMapKvHeadsBetweenTensorParallelSlices) {
  constexpr int64_t kBlockSize = 8, kDim = 32;
  const int64_t value_unit = kDim * kernels::cpu::KvElementBytes(GetParam());
  const int64_t scale_unit = kernels::cpu::KvScaleBytes(GetParam());
  // Offset of (layer, part: K, V, K scales, V scales, row, head) in a slot of `heads` heads.
  auto offset = [&](int64_t heads, int64_t layer, int part, int64_t row, int64_t head) {
    const int64_t value = kBlockSize * heads * value_unit, scale = kBlockSize * heads * scale_unit;
    const int64_t unit = part < 2 ? value_unit : scale_unit;
    const int64_t base =
        layer * 2 * (value + scale) + (part < 2 ? part * value : 2 * value + (part - 2) * scale);
    return base + (row * heads + head) * unit;
  };
  struct Case {
    int64_t src_heads, dest_heads, src_first, dest_first;
  };
  for (const Case c : {Case{4, 2, 2, 0}, Case{2, 4, 0, 2}}) {
    SCOPED_TRACE(testing::Message() << c.src_heads << " -> " << c.dest_heads);
    const std::unique_ptr<CpuKvCache> source =
        *CpuKvCache::Create(Config(c.src_heads), 5, kBlockSize, GetParam(), true);
    const std::unique_ptr<CpuKvCache> dest =
        *CpuKvCache::Create(Config(c.dest_heads), 6, kBlockSize, GetParam());
    Fill(*source, 7);
    Fill(*dest, 8);
    Mapped mapped(*source->Share());
    const std::vector<uint8_t> before = Saved(*dest, 4), untouched = Saved(*dest, 0);
    const PeerHeads heads{c.src_heads, c.dest_heads, c.src_first, c.dest_first, 2};
    ASSERT_TRUE(dest->CopyBlocksFromPeer(mapped.peer, std::vector<int32_t>{3},
                                         std::vector<int32_t>{4}, heads)
                    .ok());
    const std::vector<uint8_t> from = Saved(*source, 3), after = Saved(*dest, 4);
    const int parts = scale_unit > 0 ? 4 : 2;
    for (int64_t layer = 0; layer < 3; ++layer) {
      for (int part = 0; part < parts; ++part) {
        const int64_t unit = part < 2 ? value_unit : scale_unit;
        for (int64_t row = 0; row < kBlockSize; ++row) {
          for (int64_t h = 0; h < c.dest_heads; ++h) {
            const int64_t at = offset(c.dest_heads, layer, part, row, h);
            const bool mapped_head = h >= c.dest_first && h < c.dest_first + 2;
            const std::vector<uint8_t>& want_from = mapped_head ? from : before;
            const int64_t want_at =
                mapped_head ? offset(c.src_heads, layer, part, row, h - c.dest_first + c.src_first)
                            : at;
            ASSERT_TRUE(std::equal(after.begin() + at, after.begin() + at + unit,
                                   want_from.begin() + want_at))
                << "layer " << layer << " part " << part << " row " << row << " head " << h;
          }
        }
      }
    }
    EXPECT_EQ(Saved(*dest, 0), untouched);
    PeerHeads outside = heads;
    outside.src_first = c.src_heads - 1;
    const absl::Status refused = dest->CopyBlocksFromPeer(mapped.peer, std::vector<int32_t>{3},
                                                          std::vector<int32_t>{0}, outside);
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
    PeerHeads wrong = heads;
    wrong.src_heads = c.src_heads + 1;  // the source's parts are not rows of that many heads
    EXPECT_EQ(dest->CopyBlocksFromPeer(mapped.peer, std::vector<int32_t>{3},
                                       std::vector<int32_t>{0}, wrong)
                  .code(),
              absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(Saved(*dest, 0), untouched);
  }
}

INSTANTIATE_TEST_SUITE_P(KvDtypes, CpuKvCacheShareTest,
                         ::testing::Values(kernels::cpu::KvDtype::kF16,
                                           kernels::cpu::KvDtype::kBf16,
                                           kernels::cpu::KvDtype::kF32,
                                           kernels::cpu::KvDtype::kInt8));

TEST(CpuKvCache, APrivatePoolIsNotShared) {
  const std::unique_ptr<CpuKvCache> pool =
      *CpuKvCache::Create(Config(), 4, 8, kernels::cpu::KvDtype::kF16);
  EXPECT_EQ(pool->Share().status().code(), absl::StatusCode::kUnimplemented);
}

TEST(CpuKvCache, PeerCopiesOfAnotherLayoutOrOutsideThePoolsCopyNothing) {
  const auto f16 = kernels::cpu::KvDtype::kF16;
  const std::unique_ptr<CpuKvCache> source = *CpuKvCache::Create(Config(), 4, 8, f16, true);
  const std::unique_ptr<CpuKvCache> dest = *CpuKvCache::Create(Config(), 6, 8, f16);
  const std::unique_ptr<CpuKvCache> wide = *CpuKvCache::Create(Config(3), 4, 8, f16);
  Fill(*source, 3);
  Mapped mapped(*source->Share());
  const std::vector<uint8_t> before = Saved(*dest, 1);
  auto copy = [&](const CpuKvCache& into, std::vector<int32_t> from, std::vector<int32_t> to) {
    return into.CopyBlocksFromPeer(mapped.peer, from, to, {});
  };
  absl::Status status = copy(*dest, {4}, {1});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("outside the source pool"));
  status = copy(*dest, {0, 1}, {1, 6});
  EXPECT_THAT(status.message(), HasSubstr("outside this pool"));
  status = copy(*dest, {0, 1}, {1, 1});
  EXPECT_THAT(status.message(), HasSubstr("written twice"));
  status = copy(*dest, {0, 1}, {1});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  status = copy(*wide, {0}, {1});
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Saved(*dest, 1), before);
}

}  // namespace
}  // namespace loom::model
