#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/formats/model_config.h"
#include "model/tensor_parallel.h"

namespace loom::model {

/// How big a worker's KV pool is, on either device: the bytes of one block, then blocks from
/// a byte budget (the CPU's pool in host memory, or a CUDA pool given --kv-cache-memory) or
/// from the memory a device has free (a CUDA pool otherwise). Every function here is pure
/// arithmetic over its arguments except MemAvailableBytes and HostKvBudgetBytes, which read
/// /proc/meminfo. Thread-safe.

/// The share of the device memory free after loading that a device's KV pool takes when no
/// flag says otherwise (the rest is headroom for the allocator and the libraries).
inline constexpr double kDefaultDeviceKvFraction = 0.9;
/// The host (CPU) KV pool's budget when no flag sizes it.
inline constexpr int64_t kDefaultHostKvBudgetBytes = int64_t{512} << 20;

/// One KV block as a pool holds it.
struct KvBlockSpec {
  int64_t block_size = 16;  // tokens per block, >= 1
  int64_t bytes = 0;        // K and V of every layer for block_size tokens (KvBytesPerBlock)
  std::string dtype_name;   // the KV element type ("f16", "bf16", "f32"), for messages
};

/// One block of a pool over `local_config` (a tensor-parallel rank's LocalConfig: its KV
/// heads), `block_size` tokens of `element_bytes`-byte elements named `dtype_name`, and
/// `scale_bytes` per token and head (8-bit KV).
KvBlockSpec KvBlockOf(const common::ModelConfig& local_config, int64_t block_size,
                      int64_t element_bytes, std::string dtype_name, int64_t scale_bytes = 0);

/// The block of a worker placed at `parallel` (default: the whole model): smaller than the
/// whole model's when its tensor-parallel rank keeps only some KV heads or its pipeline
/// stage only some layers. InvalidArgument from PlanPartition when the model does not
/// split that way.
absl::StatusOr<KvBlockSpec> ShardKvBlock(const common::ModelConfig& config,
                                         const Parallelism& parallel, int64_t block_size,
                                         int64_t element_bytes, std::string dtype_name,
                                         int64_t scale_bytes = 0);

/// The most blocks a pool of `block_size`-token blocks may hold: slot ids
/// (block * block_size + offset) are int32 on the wire and in the kernels.
int64_t MaxKvBlocks(int64_t block_size);

/// The host's free memory, MemAvailable from /proc/meminfo, in bytes; Unavailable where it
/// cannot be read.
absl::StatusOr<int64_t> MemAvailableBytes();

/// The host (CPU) pool's byte budget: `bytes` when set, else `fraction` of MemAvailable, else
/// kDefaultHostKvBudgetBytes. Unavailable when the fraction needs MemAvailable and it cannot
/// be read.
absl::StatusOr<int64_t> HostKvBudgetBytes(std::optional<int64_t> bytes,
                                          std::optional<double> fraction);

/// The whole blocks `budget_bytes` holds, at most MaxKvBlocks. InvalidArgument naming the
/// budget and the block's size when it holds none.
absl::StatusOr<int64_t> KvBlocksFromBudget(int64_t budget_bytes, const KvBlockSpec& block);

/// A device's memory once the forward pass has loaded its weights and reserved its buffers.
struct DeviceMemory {
  int64_t free_bytes = 0;     // free on the device now
  int64_t total_bytes = 0;    // the device's capacity
  int64_t free_at_start = 0;  // free when the forward pass began, before its own allocations
};

/// How a device's KV pool is sized.
struct DeviceKvBudget {
  // > 0: this many blocks (capped to what slot ids can address); 0: sized from free memory.
  int64_t num_blocks = 0;
  // In (0, 1]: the share of the free memory the pool takes when num_blocks is 0.
  double free_fraction = kDefaultDeviceKvFraction;
  // In (0, 1] when set (0: unset): the share of the device's total memory this forward pass may
  // use in all (vLLM's --gpu-memory-utilization); the pool gets what the forward pass's own use
  // leaves of it, never more than free_fraction of the free memory.
  double memory_utilization = 0;
  // A second pool on the device that mirrors this one block for block, its own scratch
  // block included (a draft model's: worker/draft_model): the bytes of each of its blocks,
  // set aside beside each block of this pool when it is sized from memory.
  int64_t companion_block_bytes = 0;
  // The device memory that second pool's forward pass holds already (loaded first, with a
  // one-block pool): counted as this forward pass's own use under memory_utilization.
  int64_t companion_bytes = 0;
};

/// The blocks of a device's KV pool under `budget`. The pool holds one block more than this
/// (the scratch block graph padding writes to), so memory-sized pools leave room for it and
/// the count stays below MaxKvBlocks. ResourceExhausted naming the block's bytes and the free
/// memory when not one block fits.
absl::StatusOr<int64_t> DeviceKvBlocks(const DeviceKvBudget& budget, const DeviceMemory& memory,
                                       const KvBlockSpec& block);

}  // namespace loom::model
