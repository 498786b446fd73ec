#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/types.h"
#include "kernels/cuda_device.h"
#include "model/cuda_device.h"
#include "model/cuda_device_internal.h"
#include "model/kv_pool_share.h"
#include "tests/kernels/cuda_test_util.h"

// CudaKvCache's pool-to-pool copies in one process: the source pool reached through its own
// device pointers (a PeerKvPool built here, as OpenPeer builds one from another process's IPC
// handles), checked against both pools' SaveBlocks; Share's answer and OpenPeer's refusals.
// The copy between two processes is bench/kv_pool_transfer_bench's.

namespace loom::model {
namespace {

common::ModelConfig SmallConfig() {
  common::ModelConfig config;
  config.num_layers = 3;
  config.num_heads = 4;
  config.num_kv_heads = 2;
  config.head_dim = 64;
  return config;
}

std::unique_ptr<CudaDevice> MakeDevice(kernels::cuda::KvQuant quant) {
  CudaDeviceOptions options;
  options.kv_quant = quant;
  absl::StatusOr<std::unique_ptr<CudaDevice>> device = CudaDevice::Create(options);
  EXPECT_TRUE(device.ok()) << device.status();
  return device.ok() ? std::move(*device) : nullptr;
}

// `pool` as another pool of this process reaches it: its parts' device pointers, unopened.
PeerKvPool LocalPeer(const KvCache& pool) {
  PeerKvPool peer;
  for (const cuda_detail::CudaKvCache::Part& part : cuda_detail::AsCuda(pool).Parts()) {
    peer.bases.push_back(part.base);
    peer.block_bytes.push_back(part.block_bytes);
  }
  peer.num_blocks = pool.num_blocks();
  return peer;
}

// Every block of `pool` filled with random bytes (LoadBlocks), never zeros.
void FillRandom(const KvCache& pool, uint32_t seed) {
  const int64_t slot = pool.block_bytes();
  std::vector<uint8_t> bytes(pool.num_blocks() * slot);
  std::mt19937 rng(seed);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
  std::vector<const uint8_t*> slots;
  std::vector<int32_t> blocks;
  for (int64_t b = 0; b < pool.num_blocks(); ++b) {
    slots.push_back(bytes.data() + b * slot);
    blocks.push_back(static_cast<int32_t>(b));
  }
  ASSERT_TRUE(pool.LoadBlocks(slots, blocks).ok());
}

// Every block of `pool` as SaveBlocks lays it out, block after block.
std::vector<uint8_t> SaveAll(const KvCache& pool) {
  const int64_t slot = pool.block_bytes();
  std::vector<uint8_t> bytes(pool.num_blocks() * slot);
  std::vector<uint8_t*> slots;
  std::vector<int32_t> blocks;
  for (int64_t b = 0; b < pool.num_blocks(); ++b) {
    slots.push_back(bytes.data() + b * slot);
    blocks.push_back(static_cast<int32_t>(b));
  }
  const absl::Status saved = pool.SaveBlocks(blocks, slots);
  EXPECT_TRUE(saved.ok()) << saved;
  return bytes;
}

// A source and a destination pool on one device (KV quantization `quant`), every block random
// (seeds `seed` and seed + 1), and what each held before a copy. Null pools where a part of it
// failed (the failure is reported).
struct FilledPools {
  std::unique_ptr<CudaDevice> device;
  std::unique_ptr<KvCache> src, dest;
  std::vector<uint8_t> source, before;  // SaveAll of each
};

FilledPools MakeFilledPools(kernels::cuda::KvQuant quant, const common::ModelConfig& src_config,
                            int64_t src_blocks, const common::ModelConfig& dest_config,
                            int64_t dest_blocks, uint32_t seed) {
  FilledPools pools;
  pools.device = MakeDevice(quant);
  if (pools.device == nullptr) return pools;
  absl::StatusOr<std::unique_ptr<KvCache>> src =
      pools.device->CreateKvCache(src_config, src_blocks, 16);
  absl::StatusOr<std::unique_ptr<KvCache>> dest =
      pools.device->CreateKvCache(dest_config, dest_blocks, 16);
  EXPECT_TRUE(src.ok() && dest.ok()) << src.status() << dest.status();
  if (!src.ok() || !dest.ok()) return pools;
  pools.src = *std::move(src);
  pools.dest = *std::move(dest);
  FillRandom(*pools.src, seed);
  FillRandom(*pools.dest, seed + 1);
  pools.source = SaveAll(*pools.src);
  pools.before = SaveAll(*pools.dest);
  return pools;
}

// More blocks than one launch moves (source blocks repeated, destinations scattered) between
// pools of different sizes: each destination block equals its source block bit for bit, F16
// and 8-bit KV (its scales), and every other destination block keeps its bytes. Layouts that
// differ and blocks outside either pool are refused with nothing copied.
TEST(CudaKvPoolShareTest, CopyFromAnotherPoolMatchesBothPoolsSavedBlocks) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  for (const kernels::cuda::KvQuant quant :
       {kernels::cuda::KvQuant::kNone, kernels::cuda::KvQuant::kInt8}) {
    SCOPED_TRACE(static_cast<int>(quant));
    constexpr int64_t kSrcBlocks = 90, kDestBlocks = 150, kCopies = 140;
    const FilledPools pools =
        MakeFilledPools(quant, SmallConfig(), kSrcBlocks, SmallConfig(), kDestBlocks, 70);
    ASSERT_TRUE(pools.src != nullptr && pools.dest != nullptr);

    std::mt19937 rng(72);
    std::vector<int32_t> dest_blocks(kDestBlocks), src_blocks(kCopies);
    for (int64_t b = 0; b < kDestBlocks; ++b) dest_blocks[b] = static_cast<int32_t>(b);
    std::shuffle(dest_blocks.begin(), dest_blocks.end(), rng);
    dest_blocks.resize(kCopies);
    for (int32_t& b : src_blocks) b = static_cast<int32_t>(rng() % kSrcBlocks);
    const PeerKvPool peer = LocalPeer(*pools.src);

    // Refused first: the pool is unchanged after each.
    const std::vector<int32_t> outside = {static_cast<int32_t>(kSrcBlocks)}, zero = {0};
    EXPECT_EQ(pools.dest->CopyBlocksFromPeer(peer, outside, zero, {}).code(),
              absl::StatusCode::kInvalidArgument);
    const std::vector<int32_t> twice = {1, 2}, same = {3, 3};
    EXPECT_EQ(pools.dest->CopyBlocksFromPeer(peer, twice, same, {}).code(),
              absl::StatusCode::kInvalidArgument);
    PeerKvPool other_layout = peer;
    other_layout.block_bytes[0] /= 2;
    EXPECT_EQ(pools.dest->CopyBlocksFromPeer(other_layout, zero, zero, {}).code(),
              absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(SaveAll(*pools.dest), pools.before);

    const absl::Status copied = pools.dest->CopyBlocksFromPeer(peer, src_blocks, dest_blocks, {});
    ASSERT_TRUE(copied.ok()) << copied;
    const std::vector<uint8_t> after = SaveAll(*pools.dest);
    const int64_t slot = pools.dest->block_bytes();
    std::vector<bool> written(kDestBlocks, false);
    for (int64_t i = 0; i < kCopies; ++i) {
      written[dest_blocks[i]] = true;
      ASSERT_EQ(std::memcmp(after.data() + dest_blocks[i] * slot,
                            pools.source.data() + src_blocks[i] * slot, slot),
                0)
          << "block " << src_blocks[i] << " -> " << dest_blocks[i];
    }
    for (int64_t b = 0; b < kDestBlocks; ++b) {
      if (written[b]) continue;
      ASSERT_EQ(std::memcmp(after.data() + b * slot, pools.before.data() + b * slot, slot), 0)
          << "block " << b << " was not to be written";
    }
  }
}

// Between pools of other tensor-parallel slices (PeerHeads): a 4-KV-head pool's heads [2, 4)
// into a 2-head pool's [0, 2), F16 and 8-bit KV (each token row's values and scales of those
// heads, kernels/cuda/kv_block_copy's KvHeadCopy), other blocks untouched.
TEST(CudaKvPoolShareTest, CopyFromAPoolOfOtherHeadsMovesTheNamedHeadsOfEveryRow) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  for (const kernels::cuda::KvQuant quant :
       {kernels::cuda::KvQuant::kNone, kernels::cuda::KvQuant::kInt8}) {
    SCOPED_TRACE(static_cast<int>(quant));
    common::ModelConfig wide = SmallConfig();
    wide.num_heads = 8;
    wide.num_kv_heads = 4;
    constexpr int64_t kBlockSize = 16, kLayers = 3, kDim = 64;
    const FilledPools pools = MakeFilledPools(quant, wide, 20, SmallConfig(), 30, 80);
    ASSERT_TRUE(pools.src != nullptr && pools.dest != nullptr);
    const std::vector<int32_t> from = {19, 4, 0}, to = {0, 29, 7};
    const absl::Status copied =
        pools.dest->CopyBlocksFromPeer(LocalPeer(*pools.src), from, to, PeerHeads{4, 2, 2, 0, 2});
    ASSERT_TRUE(copied.ok()) << copied;
    const std::vector<uint8_t> after = SaveAll(*pools.dest);
    const bool eight_bit = quant != kernels::cuda::KvQuant::kNone;
    const int64_t value_unit = kDim * (eight_bit ? 1 : 2), scale_unit = eight_bit ? 2 : 0;
    // Offset in a slot of `heads` heads of (layer, part: K, V, K scales, V scales, row, head).
    auto offset = [&](int64_t heads, int64_t layer, int part, int64_t row, int64_t head) {
      const int64_t value = kBlockSize * heads * value_unit,
                    scale = kBlockSize * heads * scale_unit;
      return layer * 2 * (value + scale) +
             (part < 2 ? part * value : 2 * value + (part - 2) * scale) +
             (row * heads + head) * (part < 2 ? value_unit : scale_unit);
    };
    const int64_t src_slot = pools.src->block_bytes(), dest_slot = pools.dest->block_bytes();
    for (size_t i = 0; i < from.size(); ++i) {
      for (int64_t layer = 0; layer < kLayers; ++layer) {
        for (int part = 0; part < (eight_bit ? 4 : 2); ++part) {
          for (int64_t row = 0; row < kBlockSize; ++row) {
            for (int64_t head = 0; head < 2; ++head) {
              ASSERT_EQ(
                  std::memcmp(after.data() + to[i] * dest_slot + offset(2, layer, part, row, head),
                              pools.source.data() + from[i] * src_slot +
                                  offset(4, layer, part, row, head + 2),
                              part < 2 ? value_unit : scale_unit),
                  0)
                  << "block " << from[i] << " layer " << layer << " part " << part << " row " << row
                  << " head " << head;
            }
          }
        }
      }
    }
    ASSERT_EQ(
        std::memcmp(after.data() + 1 * dest_slot, pools.before.data() + 1 * dest_slot, dest_slot),
        0);
    EXPECT_EQ(
        pools.dest->CopyBlocksFromPeer(LocalPeer(*pools.src), from, to, PeerHeads{4, 2, 3, 0, 2})
            .code(),
        absl::StatusCode::kInvalidArgument);
  }
}

// Share names one IPC handle per part (K, V and, with 8-bit KV, their scales, per layer), each
// its own allocation at offset 0, with the part's bytes per block, the pool's block count and
// this device's 16-byte UUID; a second call answers the same.
TEST(CudaKvPoolShareTest, ShareExportsEveryPartInSlotOrder) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  for (const kernels::cuda::KvQuant quant :
       {kernels::cuda::KvQuant::kNone, kernels::cuda::KvQuant::kInt8}) {
    SCOPED_TRACE(static_cast<int>(quant));
    std::unique_ptr<CudaDevice> device = MakeDevice(quant);
    ASSERT_NE(device, nullptr);
    absl::StatusOr<std::unique_ptr<KvCache>> pool = device->CreateKvCache(SmallConfig(), 20, 16);
    ASSERT_TRUE(pool.ok()) << pool.status();
    absl::StatusOr<KvPoolShare> share = (*pool)->Share();
    if (!share.ok() && share.status().code() == absl::StatusCode::kFailedPrecondition) {
      GTEST_SKIP() << "CUDA IPC unavailable on this machine: " << share.status();
    }
    ASSERT_TRUE(share.ok()) << share.status();
    EXPECT_EQ(share->kind, KvPoolShare::Kind::kCudaIpc);
    EXPECT_EQ(share->num_blocks, 20);
    EXPECT_EQ(share->cuda_device_uuid.size(), 16u);
    const PeerKvPool local = LocalPeer(**pool);
    const size_t per_layer = quant == kernels::cuda::KvQuant::kNone ? 2 : 4;
    ASSERT_EQ(share->parts.size(), 3 * per_layer);
    ASSERT_EQ(share->cuda_ipc_handles.size(), share->parts.size());
    std::set<std::string> distinct;
    for (size_t p = 0; p < share->parts.size(); ++p) {
      EXPECT_EQ(share->parts[p].allocation, static_cast<int32_t>(p));
      EXPECT_EQ(share->parts[p].offset, 0);
      EXPECT_EQ(share->parts[p].block_bytes, local.block_bytes[p]);
      EXPECT_EQ(share->cuda_ipc_handles[p].size(), share->cuda_ipc_handles[0].size());
      distinct.insert(share->cuda_ipc_handles[p]);
    }
    EXPECT_EQ(distinct.size(), share->parts.size());
    const int64_t value_bytes = 16 * 2 * 64 * (quant == kernels::cuda::KvQuant::kNone ? 2 : 1);
    EXPECT_EQ(share->parts[0].block_bytes, value_bytes);
    absl::StatusOr<KvPoolShare> again = (*pool)->Share();
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->cuda_ipc_handles, share->cuda_ipc_handles);
  }
}

// OpenPeer refuses a memory-file share, a malformed one and one from a device this process does
// not see, before opening anything; whatever the driver answers to a process opening its own
// handles, the next copy is not blamed for it (the error is cleared).
TEST(CudaKvPoolShareTest, OpenPeerRefusesSharesItCannotOpen) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  std::unique_ptr<CudaDevice> device = MakeDevice(kernels::cuda::KvQuant::kNone);
  ASSERT_NE(device, nullptr);
  absl::StatusOr<std::unique_ptr<KvCache>> src = device->CreateKvCache(SmallConfig(), 8, 16);
  absl::StatusOr<std::unique_ptr<KvCache>> dest = device->CreateKvCache(SmallConfig(), 8, 16);
  ASSERT_TRUE(src.ok() && dest.ok()) << src.status() << dest.status();
  absl::StatusOr<KvPoolShare> share = (*src)->Share();
  if (!share.ok() && share.status().code() == absl::StatusCode::kFailedPrecondition) {
    GTEST_SKIP() << "CUDA IPC unavailable on this machine: " << share.status();
  }
  ASSERT_TRUE(share.ok()) << share.status();

  KvPoolShare file = *share;
  file.kind = KvPoolShare::Kind::kHostFile;
  EXPECT_EQ((*dest)->OpenPeer(file).status().code(), absl::StatusCode::kInvalidArgument);
  KvPoolShare short_handle = *share;
  short_handle.cuda_ipc_handles[1].pop_back();
  EXPECT_EQ((*dest)->OpenPeer(short_handle).status().code(), absl::StatusCode::kInvalidArgument);
  KvPoolShare bad_part = *share;
  bad_part.parts[2].allocation = static_cast<int32_t>(bad_part.cuda_ipc_handles.size());
  EXPECT_EQ((*dest)->OpenPeer(bad_part).status().code(), absl::StatusCode::kInvalidArgument);
  KvPoolShare elsewhere = *share;
  elsewhere.cuda_device_uuid.assign(16, '\xff');
  const absl::Status unseen = (*dest)->OpenPeer(elsewhere).status();
  EXPECT_EQ(unseen.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(unseen.message().find("GPU-ffffffff-ffff-ffff-ffff-ffffffffffff"), std::string::npos)
      << unseen;

  absl::StatusOr<PeerKvPool> own = (*dest)->OpenPeer(*share);
  if (own.ok()) {
    // This driver maps a process's own handles: the copy through them must work too.
    EXPECT_EQ(own->bases.size(), share->parts.size());
  } else {
    EXPECT_TRUE(own.status().code() == absl::StatusCode::kFailedPrecondition ||
                own.status().code() == absl::StatusCode::kUnavailable)
        << own.status();
  }
  FillRandom(**src, 80);
  const std::vector<int32_t> from = {5, 0}, to = {1, 6};
  const absl::Status copied =
      (*dest)->CopyBlocksFromPeer(own.ok() ? *own : LocalPeer(**src), from, to, {});
  ASSERT_TRUE(copied.ok()) << copied;
  const std::vector<uint8_t> source = SaveAll(**src), after = SaveAll(**dest);
  const int64_t slot = (*src)->block_bytes();
  for (size_t i = 0; i < from.size(); ++i) {
    EXPECT_EQ(std::memcmp(after.data() + to[i] * slot, source.data() + from[i] * slot, slot), 0);
  }
}

}  // namespace
}  // namespace loom::model
