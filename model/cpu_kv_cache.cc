#include "model/cpu_kv_cache.h"

#include "absl/strings/str_format.h"

namespace loom::model {

absl::StatusOr<std::unique_ptr<CpuKvCache>> CpuKvCache::Create(const common::ModelConfig& config,
                                                               int64_t num_blocks,
                                                               int64_t block_size,
                                                               kernels::cpu::KvDtype dtype) {
  if (num_blocks <= 0 || block_size <= 0 || block_size > 1024) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "KV cache needs num_blocks > 0 and 0 < block_size <= 1024, got %d blocks of %d",
        num_blocks, block_size));
  }
  std::unique_ptr<CpuKvCache> cache(new CpuKvCache());
  cache->num_blocks_ = num_blocks;
  cache->block_size_ = block_size;
  cache->num_kv_heads_ = config.num_kv_heads;
  cache->head_dim_ = config.head_dim;
  cache->dtype_ = dtype;
  const size_t heads = static_cast<size_t>(num_blocks * block_size * config.num_kv_heads);
  const size_t layer_bytes = heads * config.head_dim * kernels::cpu::KvElementBytes(dtype);
  const size_t layer_scales = kernels::cpu::IsQuantizedKv(dtype) ? heads : 0;
  cache->k_.resize(config.num_layers);
  cache->v_.resize(config.num_layers);
  cache->k_scale_.resize(config.num_layers);
  cache->v_scale_.resize(config.num_layers);
  for (int64_t l = 0; l < config.num_layers; ++l) {
    cache->k_[l].resize(layer_bytes);
    cache->v_[l].resize(layer_bytes);
    cache->k_scale_[l].resize(layer_scales);
    cache->v_scale_[l].resize(layer_scales);
  }
  return cache;
}

kernels::cpu::KvLayerView CpuKvCache::layer(int64_t index) const {
  kernels::cpu::KvLayerView view;
  view.k = k_[index].data();
  view.v = v_[index].data();
  view.dtype = dtype_;
  view.num_blocks = num_blocks_;
  view.block_size = block_size_;
  view.num_kv_heads = num_kv_heads_;
  view.head_dim = head_dim_;
  if (kernels::cpu::IsQuantizedKv(dtype_)) {
    view.k_scale = k_scale_[index].data();
    view.v_scale = v_scale_[index].data();
  }
  return view;
}

int64_t CpuKvCache::bytes() const {
  int64_t total = 0;
  for (size_t l = 0; l < k_.size(); ++l) {
    total +=
        k_[l].size() + v_[l].size() + sizeof(uint16_t) * (k_scale_[l].size() + v_scale_[l].size());
  }
  return total;
}

}  // namespace loom::model
