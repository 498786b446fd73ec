#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model_config.h"
#include "kernels/cpu/paged_attention.h"

namespace loom::worker {

/// The paged KV cache of one worker: for every layer, K and V pools of `num_blocks`
/// blocks of `block_size` token slots. Block ids are chosen by the coordinator (the
/// block table's owner); block b is the same slot range in every layer. Not thread-safe:
/// owned by the model runner.
class KvCache {
 public:
  /// Pool sized by block count. InvalidArgument for non-positive sizes.
  static absl::StatusOr<std::unique_ptr<KvCache>> Create(const common::ModelConfig& config,
                                                         int64_t num_blocks, int64_t block_size,
                                                         kernels::cpu::KvDtype dtype);
  /// Bytes one block takes across all layers (K and V).
  static int64_t BytesPerBlock(const common::ModelConfig& config, int64_t block_size,
                               kernels::cpu::KvDtype dtype);

  kernels::cpu::KvLayerView layer(int64_t index);
  int64_t num_blocks() const { return num_blocks_; }
  int64_t block_size() const { return block_size_; }
  int64_t num_layers() const { return static_cast<int64_t>(k_.size()); }
  kernels::cpu::KvDtype dtype() const { return dtype_; }
  int64_t bytes() const;

 private:
  KvCache() = default;

  int64_t num_blocks_ = 0;
  int64_t block_size_ = 0;
  int64_t num_kv_heads_ = 0;
  int64_t head_dim_ = 0;
  kernels::cpu::KvDtype dtype_ = kernels::cpu::KvDtype::kF16;
  std::vector<std::vector<uint8_t>> k_;  // per layer: [num_blocks, block_size, kv_heads, head_dim]
  std::vector<std::vector<uint8_t>> v_;
};

}  // namespace loom::worker
