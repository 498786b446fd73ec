#include "worker/tensor_parallel.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace loom::worker {

absl::StatusOr<ShardPlan> PlanShards(const common::ModelConfig& config, int rank, int size) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrFormat("rank %d is outside a tensor-parallel group of %d", rank, size));
  }
  ShardPlan plan;
  plan.rank = rank;
  plan.size = size;
  if (config.num_heads % size != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "tensor parallel size %d does not divide the model's %d attention heads (supported "
        "sizes divide the head count)",
        size, config.num_heads));
  }
  plan.num_heads = config.num_heads / size;
  plan.head0 = rank * plan.num_heads;
  if (config.num_kv_heads % size == 0) {
    plan.num_kv_heads = config.num_kv_heads / size;
    plan.kv_head0 = rank * plan.num_kv_heads;
  } else if (size % config.num_kv_heads == 0) {
    // More ranks than KV heads: each KV head is replicated on size / kv_heads ranks, the
    // ones whose query heads read it.
    plan.num_kv_heads = 1;
    plan.kv_head0 = rank / (size / config.num_kv_heads);
  } else {
    return absl::InvalidArgumentError(absl::StrFormat(
        "tensor parallel size %d and the model's %d KV heads: one must divide the other",
        size, config.num_kv_heads));
  }
  if (config.intermediate_size % size != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "tensor parallel size %d does not divide the model's %d FFN channels", size,
        config.intermediate_size));
  }
  plan.ffn = config.intermediate_size / size;
  plan.ffn0 = rank * plan.ffn;
  plan.vocab_stride = (config.vocab_size + size - 1) / size;
  plan.vocab0 = std::min<int64_t>(config.vocab_size, rank * plan.vocab_stride);
  plan.vocab = std::min<int64_t>(config.vocab_size, plan.vocab0 + plan.vocab_stride) - plan.vocab0;
  return plan;
}

common::ModelConfig LocalConfig(const common::ModelConfig& config, const ShardPlan& plan) {
  common::ModelConfig local = config;
  local.num_heads = plan.num_heads;
  local.num_kv_heads = plan.num_kv_heads;
  local.intermediate_size = plan.ffn;
  return local;
}

}  // namespace loom::worker
