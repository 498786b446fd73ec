#pragma once

#include <cstdint>

#include "common/formats/model_config.h"

namespace loom::model {

/// The pools a layer's KV takes: K and V, or K alone where the values are the keys (multi-head
/// latent attention's: the latent beside the rotary key part, read as both).
inline int64_t KvPoolsPerLayer(const common::ModelConfig& config) { return config.mla() ? 1 : 2; }

/// Bytes one KV block takes on any device: K and V (KvPoolsPerLayer) of every layer,
/// `block_size` token slots of `config.num_kv_heads` heads of `config.head_dim` elements of
/// `element_bytes` each, plus `scale_bytes` per token and head (the 8-bit KV types' scale,
/// kernels/cpu/kv_dtype.h). For a tensor-parallel rank pass its LocalConfig (its KV heads).
/// The one place this layout fact lives (the pools and the worker's budget use it).
inline int64_t KvBytesPerBlock(const common::ModelConfig& config, int64_t block_size,
                               int64_t element_bytes, int64_t scale_bytes = 0) {
  return KvPoolsPerLayer(config) * config.num_layers * block_size * config.num_kv_heads *
         (config.head_dim * element_bytes + scale_bytes);
}

}  // namespace loom::model
