#pragma once

#include <cstdint>

namespace loom::kernels::cpu {

/// Mixture-of-experts routing (Mixtral, Qwen3-MoE): for each of `num_tokens` rows of
/// router logits [num_tokens, num_experts], the `top_k` most probable experts under
/// softmax, most probable first (equal logits: the lower index first), and their weights:
/// the softmax probabilities, renormalized to sum to 1 over the chosen experts when
/// `normalize` (which equals a softmax over the chosen logits). chosen and weights are
/// [num_tokens, top_k]. 1 <= top_k <= num_experts. Runs on the calling thread; a row's
/// result depends on that row alone.
void MoeRoute(const float* logits, int64_t num_tokens, int64_t num_experts, int64_t top_k,
              bool normalize, int32_t* chosen, float* weights);

}  // namespace loom::kernels::cpu
