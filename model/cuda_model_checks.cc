#include "model/cuda_model_checks.h"

#include <cstdint>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "model/tensor_parallel.h"

namespace loom::model {

absl::Status ValidateCudaModelConfig(const common::ModelConfig& config) {
  if (config.mla()) {
    // The latent pool's one head is 576 wide (FlashMLA's shape), and its values are its keys.
    return absl::UnimplementedError(absl::StrFormat(
        "CUDA runner: multi-head latent attention (%s: a %d-dim latent KV head) runs on the CPU "
        "only (--device cpu)",
        config.architecture, config.head_dim));
  }
  if (config.head_dim != 64 && config.head_dim != 128 && config.head_dim != 256) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "CUDA runner: head dim %d unsupported by the attention kernels (64, 128, 256)",
        config.head_dim));
  }
  if (config.hidden_size > 65536) {
    return absl::InvalidArgumentError(
        absl::StrFormat("CUDA runner: hidden size %d above 65536", config.hidden_size));
  }
  return absl::OkStatus();
}

absl::Status ValidateCudaShard(const common::ModelConfig& config, int tp_rank, int tp_size) {
  // The CUDA attention kernels map a rank's query heads onto its KV heads by the group
  // alone: a KV head two ranks share (heads that do not split evenly) is refused here.
  LOOM_ASSIGN_OR_RETURN(const ShardPlan plan, PlanShards(config, tp_rank, tp_size));
  const int64_t group = config.num_heads / config.num_kv_heads;
  if (plan.num_heads != plan.num_kv_heads * group || plan.head0 != plan.kv_head0 * group) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "CUDA runner: tensor parallel rank %d of %d holds query heads [%d, %d) over KV heads "
        "[%d, %d), which the CUDA attention kernels cannot map (group %d): use a size that "
        "splits the %d KV heads evenly",
        plan.rank, plan.size, plan.head0, plan.head0 + plan.num_heads, plan.kv_head0,
        plan.kv_head0 + plan.num_kv_heads, group, config.num_kv_heads));
  }
  return absl::OkStatus();
}

}  // namespace loom::model
