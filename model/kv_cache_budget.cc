#include "model/kv_cache_budget.h"

#include <algorithm>
#include <climits>
#include <fstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "model/kv_layout.h"
#include "model/tensor_parallel.h"

namespace loom::model {

KvBlockSpec KvBlockOf(const common::ModelConfig& local_config, int64_t block_size,
                      int64_t element_bytes, std::string dtype_name, int64_t scale_bytes) {
  KvBlockSpec block;
  block.block_size = block_size;
  block.bytes = KvBytesPerBlock(local_config, block_size, element_bytes, scale_bytes);
  block.dtype_name = std::move(dtype_name);
  return block;
}

absl::StatusOr<KvBlockSpec> ShardKvBlock(const common::ModelConfig& config,
                                         const Parallelism& parallel, int64_t block_size,
                                         int64_t element_bytes, std::string dtype_name,
                                         int64_t scale_bytes) {
  absl::StatusOr<ShardPlan> shard = PlanPartition(config, parallel);
  if (!shard.ok()) return shard.status();
  return KvBlockOf(LocalConfig(config, *shard), block_size, element_bytes, std::move(dtype_name),
                   scale_bytes);
}

int64_t MaxKvBlocks(int64_t block_size) { return INT32_MAX / block_size; }

absl::StatusOr<int64_t> MemAvailableBytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return absl::UnavailableError("cannot read MemAvailable from /proc/meminfo");
}

absl::StatusOr<int64_t> HostKvBudgetBytes(std::optional<int64_t> bytes,
                                          std::optional<double> fraction) {
  if (bytes.has_value()) return *bytes;
  if (fraction.has_value()) {
    absl::StatusOr<int64_t> available = MemAvailableBytes();
    if (!available.ok()) return available.status();
    return static_cast<int64_t>(static_cast<double>(*available) * *fraction);
  }
  return kDefaultHostKvBudgetBytes;
}

absl::StatusOr<int64_t> KvBlocksFromBudget(int64_t budget_bytes, const KvBlockSpec& block) {
  const int64_t num_blocks = std::min(budget_bytes / block.bytes, MaxKvBlocks(block.block_size));
  if (num_blocks < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a KV budget of %d bytes holds no block: one block of %d tokens takes %d bytes (%s KV)",
        budget_bytes, block.block_size, block.bytes, block.dtype_name));
  }
  return num_blocks;
}

absl::StatusOr<int64_t> DeviceKvBlocks(const DeviceKvBudget& budget, const DeviceMemory& memory,
                                       const KvBlockSpec& block) {
  const int64_t max_blocks = MaxKvBlocks(block.block_size) - 1;  // less the scratch block
  const double free_bytes = static_cast<double>(memory.free_bytes);
  const int64_t block_bytes = block.bytes + budget.companion_block_bytes;
  int64_t num_blocks = budget.num_blocks;
  if (num_blocks == 0 && budget.memory_utilization > 0) {
    // This forward pass's share of the device's total, less what it has taken itself (weights,
    // activations, workspaces), not less what the whole device holds: two workers that
    // split a GPU (--gpu-memory-utilization 0.45 each) then each get their share, whichever
    // starts first (their start-ups take turns: worker/device_startup_lock). Never more
    // than the default would take of what is free.
    const double allowed = static_cast<double>(memory.total_bytes) * budget.memory_utilization;
    const double own = static_cast<double>(budget.companion_bytes) +
                       static_cast<double>(memory.free_at_start > memory.free_bytes
                                               ? memory.free_at_start - memory.free_bytes
                                               : 0);
    const double room = std::min(allowed - own, free_bytes * budget.free_fraction);
    num_blocks = static_cast<int64_t>(std::max(0.0, room)) / block_bytes - 1;
  } else if (num_blocks == 0) {
    num_blocks = static_cast<int64_t>(free_bytes * budget.free_fraction) / block_bytes - 1;
  }
  num_blocks = std::min(num_blocks, max_blocks);
  if (num_blocks < 1) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("no room for a KV block of %d bytes (%d bytes free on the device)",
                        block_bytes, memory.free_bytes));
  }
  return num_blocks;
}

}  // namespace loom::model
