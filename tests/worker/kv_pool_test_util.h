#pragma once

// CPU KV pools for the KV transfer and push tests (kv_transfer_test.cc, kv_push_test.cc,
// kv_pool_transfer_test.cc): their model shape, random contents, a block as a host slot holds
// it, and the slice of KV heads a tensor-parallel rank holds.

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/kv_dtype.h"
#include "model/cpu_kv_cache.h"

namespace loom::worker::test_util {

/// The transfer tests' model: 3 layers of `kv_heads` KV heads of 64.
inline common::ModelConfig PoolConfig(int64_t kv_heads = 2) {
  common::ModelConfig config;
  config.num_layers = 3;
  config.num_kv_heads = kv_heads;
  config.head_dim = 64;
  return config;
}

/// Block `block` of `pool` as a host-tier slot holds it (every layer's K, V and scales).
inline std::vector<uint8_t> SavedBlock(const model::CpuKvCache& pool, int32_t block) {
  std::vector<uint8_t> bytes(static_cast<size_t>(pool.block_bytes()));
  uint8_t* out = bytes.data();
  EXPECT_TRUE(pool.SaveBlocks(absl::MakeConstSpan(&block, 1), absl::MakeConstSpan(&out, 1)).ok());
  return bytes;
}

/// Random bytes in every K/V value (and, for 8-bit pools, every scale) of `pool`.
inline void RandomizeKvPool(const model::CpuKvCache& pool, uint32_t seed) {
  std::mt19937 rng(seed);
  for (int64_t l = 0; l < pool.num_layers(); ++l) {
    const kernels::cpu::KvLayerView view = pool.layer(l);
    const int64_t values = view.num_blocks * view.block_size * view.num_kv_heads;
    const int64_t bytes = values * view.head_dim * kernels::cpu::KvElementBytes(view.dtype);
    for (int64_t i = 0; i < bytes; ++i) {
      static_cast<uint8_t*>(view.k)[i] = static_cast<uint8_t>(rng());
      static_cast<uint8_t*>(view.v)[i] = static_cast<uint8_t>(rng());
    }
    for (int64_t i = 0; view.k_scale != nullptr && i < values; ++i) {
      view.k_scale[i] = static_cast<uint16_t>(rng());
      view.v_scale[i] = static_cast<uint16_t>(rng());
    }
  }
}

/// Copies the model's KV heads [begin, + count) of every slot of `full` into `slice`, a pool
/// of `count` heads with the same blocks, layers and dtype: what a tensor-parallel rank
/// holding those heads would have computed.
inline void CopyKvHeads(const model::CpuKvCache& full, int64_t begin, int64_t count,
                        const model::CpuKvCache& slice) {
  for (int64_t l = 0; l < slice.num_layers(); ++l) {
    const kernels::cpu::KvLayerView from = full.layer(l), to = slice.layer(l);
    const int64_t head_bytes = from.head_dim * kernels::cpu::KvElementBytes(from.dtype);
    for (int64_t token = 0; token < from.num_blocks * from.block_size; ++token) {
      for (int64_t h = 0; h < count; ++h) {
        const int64_t s = token * from.num_kv_heads + begin + h, d = token * count + h;
        std::memcpy(static_cast<uint8_t*>(to.k) + d * head_bytes,
                    static_cast<uint8_t*>(from.k) + s * head_bytes, head_bytes);
        std::memcpy(static_cast<uint8_t*>(to.v) + d * head_bytes,
                    static_cast<uint8_t*>(from.v) + s * head_bytes, head_bytes);
        if (from.k_scale != nullptr) {
          to.k_scale[d] = from.k_scale[s];
          to.v_scale[d] = from.v_scale[s];
        }
      }
    }
  }
}

}  // namespace loom::worker::test_util
