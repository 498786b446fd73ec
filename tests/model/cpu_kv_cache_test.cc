#include "model/cpu_kv_cache.h"

#include <sys/mman.h>

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

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
  ASSERT_TRUE(dest->CopyBlocksFromPeer(mapped.peer, from, to).ok());
  for (size_t i = 0; i < from.size(); ++i) EXPECT_EQ(Saved(*dest, to[i]), Saved(*source, from[i]));
  EXPECT_EQ(Saved(*dest, 0), kept);
}

INSTANTIATE_TEST_SUITE_P(KvDtypes, CpuKvCacheShareTest,
                         ::testing::Values(kernels::cpu::KvDtype::kF16, kernels::cpu::KvDtype::kF32,
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
    return into.CopyBlocksFromPeer(mapped.peer, from, to);
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
