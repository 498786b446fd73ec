#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/formats/model_config.h"
#include "kernels/cpu/paged_attention.h"
#include "model/device.h"

namespace loom::model {

/// The CPU device's paged KV pool (model::KvCache in host memory): for every layer, K and
/// V pools of `num_blocks` blocks of `block_size` token slots, F16, F32 or 8-bit codes with
/// a BF16 scale per token and KV head (kernels/cpu/kv_dtype.h), all in one mapping (each
/// part on a cache line). Block ids are chosen by the coordinator (the block table's owner).
/// Not thread-safe.
class CpuKvCache : public KvCache {
 public:
  /// Pool sized by block count. InvalidArgument for non-positive sizes. `shared`: the pool
  /// lives in a memory file that other processes of this machine map to copy its blocks
  /// (Share; worker/kv_pool_transfer), else in anonymous memory.
  static absl::StatusOr<std::unique_ptr<CpuKvCache>> Create(const common::ModelConfig& config,
                                                            int64_t num_blocks, int64_t block_size,
                                                            kernels::cpu::KvDtype dtype,
                                                            bool shared = false);
  ~CpuKvCache() override;

  /// Layer `index`'s K and V as the CPU kernels take them.
  kernels::cpu::KvLayerView layer(int64_t index) const;
  int64_t num_blocks() const override { return num_blocks_; }
  int64_t block_size() const override { return block_size_; }
  int64_t num_layers() const override { return static_cast<int64_t>(k_.size()); }
  int64_t bytes() const override;
  int64_t block_bytes() const override;
  absl::Status SaveBlocks(absl::Span<const int32_t> blocks,
                          absl::Span<uint8_t* const> host) const override;
  absl::Status LoadBlocks(absl::Span<const uint8_t* const> host,
                          absl::Span<const int32_t> blocks) const override;
  absl::Status SaveBlockLayer(int32_t block, int64_t layer, uint8_t* host) const override;
  absl::StatusOr<KvPoolShare> Share() const override;
  absl::Status CopyBlocksFromPeer(const PeerKvPool& peer, absl::Span<const int32_t> src_blocks,
                                  absl::Span<const int32_t> dest_blocks,
                                  const PeerHeads& heads) const override;
  kernels::cpu::KvDtype dtype() const { return dtype_; }

 private:
  CpuKvCache() = default;
  // Bytes of one block's K (or V) values, and of its K (or V) scales, in one layer.
  int64_t block_value_bytes() const;
  int64_t block_scale_bytes() const;
  // Calls copy(pool bytes, host offset, size) for each of one block's pieces, in the
  // host layout (per layer: K, V, K scales, V scales).
  template <typename Copy>
  void ForEachPiece(int32_t block, Copy&& copy) const;
  // Each part's bytes per block, in ForEachPiece's order.
  std::vector<int64_t> PartBlockBytes() const;

  int64_t num_blocks_ = 0;
  int64_t block_size_ = 0;
  int64_t num_kv_heads_ = 0;
  int64_t head_dim_ = 0;
  // The values are the keys (multi-head latent attention): no V pools (v_ and v_scale_ empty).
  bool values_are_keys_ = false;
  kernels::cpu::KvDtype dtype_ = kernels::cpu::KvDtype::kF16;
  // The mapping every part lives in, and its memory file (-1: anonymous memory).
  uint8_t* base_ = nullptr;
  int64_t mapped_bytes_ = 0;  // its parts, each padded to a cache line
  int64_t pool_bytes_ = 0;    // the parts' own bytes
  int fd_ = -1;
  // per layer: [num_blocks, block_size, kv_heads, head_dim] in the mapping, which a layer
  // view both reads and writes.
  std::vector<uint8_t*> k_;
  std::vector<uint8_t*> v_;  // empty where the values are the keys
  // 8-bit dtypes, per layer: [num_blocks, block_size, kv_heads] BF16 scales (else empty).
  std::vector<uint16_t*> k_scale_;
  std::vector<uint16_t*> v_scale_;
};

}  // namespace loom::model
