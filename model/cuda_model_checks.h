#pragma once

#include "absl/status/status.h"
#include "common/formats/model_config.h"

namespace loom::model {

/// The model shapes the CUDA device's kernels can run: head dim 64, 128 or 256 (the attention
/// kernels) and a hidden size of at most 65536. InvalidArgument naming the value otherwise;
/// Unimplemented for multi-head latent attention (DeepSeek's, CPU only). Checked before
/// anything is loaded onto the device.
absl::Status ValidateCudaModelConfig(const common::ModelConfig& config);

/// The slice tensor-parallel rank `tp_rank` of `tp_size` holds (PlanShards) as the CUDA
/// attention kernels need it: its query heads exactly the groups of its KV heads.
/// InvalidArgument for a size that does not split the KV heads evenly, and PlanShards'
/// own errors.
absl::Status ValidateCudaShard(const common::ModelConfig& config, int tp_rank, int tp_size);

}  // namespace loom::model
