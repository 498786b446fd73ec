#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "common/formats/model_config.h"

namespace loom::model {

/// What rank `rank` of a tensor-parallel group of `size` holds of a llama-family model
/// (Megatron-style): Q/K/V and gate/up split by rows (heads, FFN channels), O and down by
/// columns (their partial products are summed by an all-reduce), the embedding and the LM
/// head by vocabulary rows (the embedding's rows summed by an all-reduce, the logits
/// gathered). Query heads are split as evenly as possible; each rank keeps the KV heads
/// its query heads read (split when the counts line up, a KV head shared by two ranks'
/// query heads held by both, replicated when ranks outnumber KV heads). More ranks than
/// query heads, and FFN channels that do not divide, are refused. size 1 is the whole
/// model.
struct ShardPlan {
  int rank = 0;
  int size = 1;
  int64_t num_heads = 0;     // local query heads
  int64_t head0 = 0;         // first global query head
  int64_t num_kv_heads = 0;  // local KV heads
  int64_t kv_head0 = 0;
  int64_t ffn = 0;           // local FFN channels
  int64_t ffn0 = 0;
  // Vocabulary rows [vocab0, vocab0 + vocab) of a padded slice of vocab_stride rows per
  // rank (the last rank's may be shorter): the gathered logits are size x vocab_stride.
  int64_t vocab = 0;
  int64_t vocab0 = 0;
  int64_t vocab_stride = 0;

  bool sharded() const { return size > 1; }
};

/// The plan, or InvalidArgument naming what does not fit: more ranks than query heads,
/// FFN channels that do not divide.
absl::StatusOr<ShardPlan> PlanShards(const common::ModelConfig& config, int rank, int size);

/// The configuration of one rank's slice (local head and FFN counts; vocabulary and
/// everything else unchanged): what its KV cache and kernels see.
common::ModelConfig LocalConfig(const common::ModelConfig& config, const ShardPlan& plan);

}  // namespace loom::model
