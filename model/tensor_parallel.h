#pragma once

#include <cstdint>
#include <vector>

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
  int64_t shared_ffn = 0;  // local channels of a shared expert (Qwen2-MoE), split likewise
  int64_t shared_ffn0 = 0;
  // local channels of a mixture of experts' leading dense layers (GLM-4.5), split likewise
  int64_t dense_ffn = 0;
  int64_t dense_ffn0 = 0;
  // Vocabulary rows [vocab0, vocab0 + vocab) of a padded slice of vocab_stride rows per
  // rank (the last rank's may be shorter): the gathered logits are size x vocab_stride.
  int64_t vocab = 0;
  int64_t vocab0 = 0;
  int64_t vocab_stride = 0;
  // Pipeline parallelism: stage `stage` of `num_stages` holds layers [layer0, layer0 +
  // num_layers) (the whole model's numbering); the first stage also the embedding, the last
  // the final norm and the LM head (a tied one: the embedding table).
  int stage = 0;
  int num_stages = 1;
  int64_t layer0 = 0;
  int64_t num_layers = 0;

  bool sharded() const { return size > 1; }
  bool first_stage() const { return stage == 0; }
  bool last_stage() const { return stage == num_stages - 1; }
};

/// Where one worker sits in its replica: tensor-parallel rank `tp_rank` of `tp_size`
/// inside pipeline stage `pp_stage` of `pp_size`.
struct Parallelism {
  int tp_rank = 0;
  int tp_size = 1;
  int pp_stage = 0;
  int pp_size = 1;
  // Layers per stage, in order (pp_size entries summing to the model's layers); empty: as
  // even as possible (vLLM's VLLM_PP_LAYER_PARTITION).
  std::vector<int64_t> stage_layers;
};

/// The plan, or InvalidArgument naming what does not fit: more ranks than query heads,
/// FFN channels that do not divide. Every layer (one pipeline stage).
absl::StatusOr<ShardPlan> PlanShards(const common::ModelConfig& config, int rank, int size);

/// PlanShards for `parallel.tp_rank` of `tp_size`, holding the layers of pipeline stage
/// `pp_stage` of `pp_size`: contiguous ranges of `stage_layers`, or as even as possible,
/// the earlier stages taking the extra layers (the last one also computes the LM head).
/// InvalidArgument for more stages than layers or a partition that does not cover the
/// model's layers with one or more per stage.
absl::StatusOr<ShardPlan> PlanPartition(const common::ModelConfig& config,
                                        const Parallelism& parallel);

/// The configuration of one rank's slice (local head and FFN counts, the stage's layer
/// count; vocabulary and everything else unchanged): what its KV cache and kernels see.
common::ModelConfig LocalConfig(const common::ModelConfig& config, const ShardPlan& plan);

}  // namespace loom::model
