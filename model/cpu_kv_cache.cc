#include "model/cpu_kv_cache.h"

#include <cstring>

#include "absl/strings/str_format.h"
#include "model/kv_layout.h"

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
  cache->values_are_keys_ = KvPoolsPerLayer(config) == 1;
  const size_t heads = static_cast<size_t>(num_blocks * block_size * config.num_kv_heads);
  const size_t layer_bytes = heads * config.head_dim * kernels::cpu::KvElementBytes(dtype);
  const size_t layer_scales = kernels::cpu::IsQuantizedKv(dtype) ? heads : 0;
  cache->k_.resize(config.num_layers);
  cache->v_.resize(config.num_layers);
  cache->k_scale_.resize(config.num_layers);
  cache->v_scale_.resize(config.num_layers);
  for (int64_t l = 0; l < config.num_layers; ++l) {
    cache->k_[l].resize(layer_bytes);
    cache->k_scale_[l].resize(layer_scales);
    if (cache->values_are_keys_) continue;
    cache->v_[l].resize(layer_bytes);
    cache->v_scale_[l].resize(layer_scales);
  }
  return cache;
}

kernels::cpu::KvLayerView CpuKvCache::layer(int64_t index) const {
  kernels::cpu::KvLayerView view;
  view.k = k_[index].data();
  view.v = values_are_keys_ ? view.k : v_[index].data();
  view.dtype = dtype_;
  view.num_blocks = num_blocks_;
  view.block_size = block_size_;
  view.num_kv_heads = num_kv_heads_;
  view.head_dim = head_dim_;
  if (kernels::cpu::IsQuantizedKv(dtype_)) {
    view.k_scale = k_scale_[index].data();
    view.v_scale = values_are_keys_ ? view.k_scale : v_scale_[index].data();
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

int64_t CpuKvCache::block_value_bytes() const {
  return block_size_ * num_kv_heads_ * head_dim_ *
         static_cast<int64_t>(kernels::cpu::KvElementBytes(dtype_));
}

int64_t CpuKvCache::block_scale_bytes() const {
  return kernels::cpu::IsQuantizedKv(dtype_)
             ? block_size_ * num_kv_heads_ * static_cast<int64_t>(sizeof(uint16_t))
             : 0;
}

int64_t CpuKvCache::block_bytes() const {
  return num_layers() * (values_are_keys_ ? 1 : 2) * (block_value_bytes() + block_scale_bytes());
}

template <typename Copy>
void CpuKvCache::ForEachPiece(int32_t block, Copy&& copy) const {
  const int64_t values = block_value_bytes();
  const int64_t scales = block_scale_bytes();
  int64_t offset = 0;
  for (int64_t l = 0; l < num_layers(); ++l) {
    copy(k_[l].data() + block * values, offset, values);
    offset += values;
    if (!values_are_keys_) {
      copy(v_[l].data() + block * values, offset, values);
      offset += values;
    }
    if (scales > 0) {
      copy(reinterpret_cast<uint8_t*>(k_scale_[l].data()) + block * scales, offset, scales);
      offset += scales;
      if (!values_are_keys_) {
        copy(reinterpret_cast<uint8_t*>(v_scale_[l].data()) + block * scales, offset, scales);
        offset += scales;
      }
    }
  }
}

absl::Status CpuKvCache::SaveBlocks(absl::Span<const int32_t> blocks,
                                    absl::Span<uint8_t* const> host) const {
  if (blocks.size() != host.size()) {
    return absl::InvalidArgumentError("SaveBlocks: one host slot per block");
  }
  for (size_t i = 0; i < blocks.size(); ++i) {
    ForEachPiece(blocks[i], [&](const uint8_t* pool, int64_t offset, int64_t size) {
      std::memcpy(host[i] + offset, pool, static_cast<size_t>(size));
    });
  }
  return absl::OkStatus();
}

absl::Status CpuKvCache::SaveBlockLayer(int32_t block, int64_t layer, uint8_t* host) const {
  if (block < 0 || block >= num_blocks_ || layer < 0 || layer >= num_layers()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("SaveBlockLayer: block %d or layer %d outside the pool", block, layer));
  }
  const int64_t layer_bytes = block_bytes() / num_layers();
  const int64_t begin = layer * layer_bytes, end = begin + layer_bytes;
  ForEachPiece(block, [&](const uint8_t* pool, int64_t offset, int64_t size) {
    if (offset >= begin && offset < end) {
      std::memcpy(host + (offset - begin), pool, static_cast<size_t>(size));
    }
  });
  return absl::OkStatus();
}

absl::Status CpuKvCache::LoadBlocks(absl::Span<const uint8_t* const> host,
                                    absl::Span<const int32_t> blocks) const {
  if (blocks.size() != host.size()) {
    return absl::InvalidArgumentError("LoadBlocks: one host slot per block");
  }
  for (size_t i = 0; i < blocks.size(); ++i) {
    ForEachPiece(blocks[i], [&](uint8_t* pool, int64_t offset, int64_t size) {
      std::memcpy(pool, host[i] + offset, static_cast<size_t>(size));
    });
  }
  return absl::OkStatus();
}

}  // namespace loom::model
