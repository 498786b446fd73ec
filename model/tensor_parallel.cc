#include "model/tensor_parallel.h"

#include <algorithm>
#include <tuple>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace loom::model {

absl::StatusOr<ShardPlan> PlanShards(const common::ModelConfig& config, int rank, int size) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrFormat("rank %d is outside a tensor-parallel group of %d", rank, size));
  }
  ShardPlan plan;
  plan.rank = rank;
  plan.size = size;
  if (config.qk_norm_full && (config.num_heads % size != 0 || config.num_kv_heads % size != 0)) {
    // Its QK-norm gathers every rank's q and k columns, equal slices in rank order.
    return absl::InvalidArgumentError(absl::StrFormat(
        "tensor parallel size %d does not divide %s's %d attention heads and %d KV heads: its "
        "QK-norm normalizes all heads together, gathered from equal slices",
        size, config.architecture, config.num_heads, config.num_kv_heads));
  }
  if (config.num_heads < size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "tensor parallel size %d is more than the model's %d attention heads", size,
        config.num_heads));
  }
  if (config.num_kv_heads <= 0 || config.num_heads % config.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the model's %d attention heads are not a multiple of its %d KV heads",
        config.num_heads, config.num_kv_heads));
  }
  // Query heads as evenly as possible (the first num_heads % size ranks get one more);
  // each rank keeps the KV heads its query heads read, so a KV head whose group spans two
  // ranks is held by both (split when the counts line up, replicated otherwise).
  const int64_t base = config.num_heads / size, extra = config.num_heads % size;
  plan.num_heads = base + (rank < extra ? 1 : 0);
  plan.head0 = rank * base + std::min<int64_t>(rank, extra);
  const int64_t group = config.num_heads / config.num_kv_heads;
  plan.kv_head0 = plan.head0 / group;
  plan.num_kv_heads = (plan.head0 + plan.num_heads - 1) / group - plan.kv_head0 + 1;
  // FFN channels (a dense layer's or each expert's, and a shared expert's) split evenly.
  for (auto [channels, local, first, what] :
       {std::tuple{config.intermediate_size, &plan.ffn, &plan.ffn0, "FFN"},
        std::tuple{config.shared_expert_intermediate_size, &plan.shared_ffn, &plan.shared_ffn0,
                   "shared-expert FFN"},
        std::tuple{config.dense_intermediate_size, &plan.dense_ffn, &plan.dense_ffn0,
                   "dense-layer FFN"}}) {
    if (channels % size != 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("tensor parallel size %d does not divide the model's %d %s channels",
                          size, channels, what));
    }
    *local = channels / size;
    *first = rank * *local;
  }
  plan.vocab_stride = (config.vocab_size + size - 1) / size;
  plan.vocab0 = std::min<int64_t>(config.vocab_size, rank * plan.vocab_stride);
  plan.vocab = std::min<int64_t>(config.vocab_size, plan.vocab0 + plan.vocab_stride) - plan.vocab0;
  plan.num_layers = config.num_layers;
  return plan;
}

absl::StatusOr<ShardPlan> PlanPartition(const common::ModelConfig& config,
                                        const Parallelism& parallel) {
  const int stages = parallel.pp_size, stage = parallel.pp_stage;
  if (stages < 1 || stage < 0 || stage >= stages) {
    return absl::InvalidArgumentError(
        absl::StrFormat("stage %d is outside a pipeline of %d stages", stage, stages));
  }
  if (stages > config.num_layers) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "pipeline parallel size %d is more than the model's %d layers", stages, config.num_layers));
  }
  absl::StatusOr<ShardPlan> plan = PlanShards(config, parallel.tp_rank, parallel.tp_size);
  if (!plan.ok()) return plan.status();
  plan->stage = stage;
  plan->num_stages = stages;
  const std::vector<int64_t>& partition = parallel.stage_layers;
  if (partition.empty()) {
    const int64_t base = config.num_layers / stages, extra = config.num_layers % stages;
    plan->num_layers = base + (stage < extra ? 1 : 0);
    plan->layer0 = stage * base + std::min<int64_t>(stage, extra);
    return plan;
  }
  int64_t total = 0;
  bool positive = true;
  for (int64_t layers : partition) {
    total += layers;
    positive = positive && layers > 0;
  }
  if (static_cast<int>(partition.size()) != stages || total != config.num_layers || !positive) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the layer partition %s must give each of the %d pipeline stages at least one layer and "
        "%d in all (the model's)",
        absl::StrJoin(partition, ","), stages, config.num_layers));
  }
  plan->layer0 = 0;
  for (int s = 0; s < stage; ++s) plan->layer0 += partition[s];
  plan->num_layers = partition[stage];
  return plan;
}

common::ModelConfig LocalConfig(const common::ModelConfig& config, const ShardPlan& plan) {
  common::ModelConfig local = config;
  local.num_heads = plan.num_heads;
  local.num_kv_heads = plan.num_kv_heads;
  local.intermediate_size = plan.ffn;
  local.shared_expert_intermediate_size = plan.shared_ffn;
  local.dense_intermediate_size = plan.dense_ffn;
  local.num_layers = plan.num_layers;
  return local;
}

}  // namespace loom::model
