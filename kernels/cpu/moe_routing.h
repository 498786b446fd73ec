#pragma once

#include <cstdint>

namespace loom::kernels::cpu {

/// How a router's logits pick and weigh experts.
struct MoeRouting {
  int64_t top_k = 1;  // experts per token, 1 <= top_k <= num_experts
  // Each expert's score: softmax over the row's logits (Mixtral, Qwen-MoE), or the
  // logit's sigmoid (GLM-4.5, DeepSeek-V3).
  bool sigmoid = false;
  // Added to the scores for choosing only (DeepSeek's e_score_correction_bias, llama.cpp's
  // exp_probs_b): [num_experts], or null. The weights stay the unbiased scores.
  const float* selection_bias = nullptr;
  // The chosen scores renormalized to sum to 1 (for a softmax, a softmax over the chosen
  // logits), then multiplied by `scale` (routed_scaling_factor).
  bool normalize = true;
  float scale = 1.0f;
  // Grouped routing (DeepSeek's n_group / topk_group; llama.cpp's expert_group_count /
  // expert_group_used_count): the experts form `groups` equal groups of consecutive indices,
  // each group scored by its best biased score (softmax routers: DeepSeek-V2's
  // group_limited_greedy) or by the sum of its two best (sigmoid routers: DeepSeek-V3's
  // noaux_tc), and the top-k is chosen inside the `groups_used` best groups only. 1: none.
  int64_t groups = 1;
  int64_t groups_used = 1;
};

/// Mixture-of-experts routing: for each of `num_tokens` rows of router logits
/// [num_tokens, num_experts], the `routing.top_k` experts of the highest score (plus
/// selection bias), highest first (equal: the lower index first; NaN ranks last), and
/// their weights as `routing` says (with groups, among the chosen groups' experts only;
/// equal group scores: the lower group first). chosen and weights are [num_tokens, top_k].
/// Runs on
/// the calling thread; a row's result depends on that row alone.
void MoeRoute(const float* logits, int64_t num_tokens, int64_t num_experts,
              const MoeRouting& routing, int32_t* chosen, float* weights);

}  // namespace loom::kernels::cpu
