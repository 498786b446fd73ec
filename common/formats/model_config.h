#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/formats/gguf_file.h"
#include "common/sampling_defaults.h"

namespace loom::common {

/// RoPE frequency scaling found in GGUF metadata.
/// RoPE frequency scaling found in GGUF metadata (kLongRope: Phi-3's per-frequency factors,
/// long or short, with an attention factor).
enum class RopeScalingType { kNone, kLinear, kLlama3, kYarn, kLongRope };

/// Hyper-parameters of a llama-family model (llama, qwen2, qwen3, mistral, ... use
/// `<arch>.*` keys; SmolLM2 and TinyLlama are `llama`).
struct ModelConfig {
  std::string architecture;   // general.architecture, e.g. "llama", "qwen2"
  std::string name;           // general.name, may be empty
  int64_t vocab_size = 0;     // rows of token_embd / length of tokenizer.ggml.tokens
  int64_t context_length = 0; // <arch>.context_length
  int64_t hidden_size = 0;    // <arch>.embedding_length
  int64_t intermediate_size = 0;  // <arch>.feed_forward_length
  int64_t num_layers = 0;     // <arch>.block_count
  int64_t num_heads = 0;      // <arch>.attention.head_count
  int64_t num_kv_heads = 0;   // <arch>.attention.head_count_kv (defaults to num_heads)
  int64_t head_dim = 0;       // <arch>.attention.key_length or hidden_size / num_heads
  double rms_norm_eps = 1e-5;     // <arch>.attention.layer_norm_rms_epsilon
  double rope_theta = 10000.0;    // <arch>.rope.freq_base
  int64_t rope_dim = 0;           // <arch>.rope.dimension_count (defaults to head_dim)
  RopeScalingType rope_scaling = RopeScalingType::kNone;
  double rope_scaling_factor = 1.0;             // <arch>.rope.scaling.factor
  int64_t rope_original_context_length = 0;     // <arch>.rope.scaling.original_context_length
  double rope_low_freq_factor = 1.0;            // llama3 scaling
  double rope_high_freq_factor = 4.0;           // llama3 scaling
  double rope_yarn_beta_fast = 32.0;  // <arch>.rope.scaling.yarn_beta_fast: ramp's fast end
  double rope_yarn_beta_slow = 1.0;   // <arch>.rope.scaling.yarn_beta_slow: ramp's slow end
  bool rope_yarn_truncate = true;     // loom.rope.scaling.yarn_truncate: integer ramp ends
  // Multiplies RoPE's cosines and sines (so attention logits by its square): YaRN's
  // attention factor (`loom.rope.scaling.attention_factor`, else 0.1 ln(factor) + 1);
  // exactly 1 for every other scaling type.
  double rope_attention_factor = 1.0;
  // rope_freqs.weight present: per-frequency factors [rope_dim / 2] (Llama 3.1 GGUFs).
  bool rope_freq_factors = false;
  // The tensor of those per-frequency divisors: rope_freqs.weight, or for longrope (Phi-3)
  // rope_factors_long.weight when the context exceeds rope.scaling.original_context_length
  // (llama.cpp's choice, made once for the served context), else rope_factors_short.weight;
  // empty when there is none.
  std::string rope_factors_tensor;
  bool tied_embeddings = false;  // no output.weight tensor: LM head reuses token_embd
  bool attention_bias = false;   // blk.0.attn_q.bias present (qwen2)
  // RoPE rotates (i, i + rope_dim/2) (NeoX, HF's rotate_half) rather than (2i, 2i+1):
  // the architecture's ArchitectureRules::gguf_rope_neox (false for GGUF llama/mistral,
  // whose converter permutes q/k rows); a model read from a Hugging Face directory says so
  // with `loom.rope.neox`.
  bool rope_neox = false;
  bool qk_norm = false;  // blk.0.attn_q_norm.weight present: per-head RMSNorm of q, k (qwen3)
  // The QK-norm spans every head of q (and of k) at once rather than each head: its
  // weights are num_heads * head_dim (num_kv_heads * head_dim) long (OLMo 2, OLMoE).
  bool qk_norm_full = false;
  // An RMSNorm before attention and before the FFN (blk.0.attn_norm.weight present); OLMo 2
  // has none, normalizing each sub-layer's output instead (post_norms).
  bool pre_norms = true;
  // Sliding-window attention: a local layer's query attends to its last `sliding_window`
  // positions (<arch>.attention.sliding_window; 0: none). Which layers are local:
  // <arch>.attention.sliding_window_pattern, a bool per layer or a period N (every N-th
  // layer global, Gemma 3's 6); every layer when absent (Mistral v0.1).
  int64_t sliding_window = 0;
  std::vector<bool> sliding_layers;  // [num_layers] when sliding_window > 0
  // Gemma (ArchitectureRules::gemma): embeddings times `embedding_scale`, a GELU (tanh
  // approximation) gate, RMSNorm of the attention and FFN outputs before each joins the
  // residual stream (blk.0.post_attention_norm.weight present), queries scaled by
  // `attention_scale` (0: 1 / sqrt(head_dim)), and local layers rotating with their own base
  // `local_rope_theta` without scaling (0: as the global ones).
  float embedding_scale = 1.0f;
  bool gelu = false;
  // Added to every RMSNorm weight at load: 1 for a Gemma checkpoint read from a Hugging Face
  // directory (`loom.norm_weight_offset`), whose norms scale by 1 + w; GGUFs store 1 + w.
  float norm_weight_offset = 0.0f;
  bool post_norms = false;
  double attention_scale = 0.0;
  double local_rope_theta = 0.0;
  // Granite's multipliers: each sub-layer's output times `residual_scale` before it joins
  // the residual stream (<arch>.residual_scale), the logits divided by `logit_scale`
  // (<arch>.logit_scale); the embeddings' and queries' scales are embedding_scale
  // (<arch>.embedding_scale) and attention_scale (<arch>.attention.scale). 1: none.
  float residual_scale = 1.0f;
  float logit_scale = 1.0f;
  // Soft-capping (Gemma 2): attention scores become c * tanh(score / c) with c
  // `attn_logit_softcap`, the final logits likewise with `final_logit_softcap`
  // (<arch>.attn_logit_softcapping, <arch>.final_logit_softcapping); 0: none.
  float attn_logit_softcap = 0.0f;
  float final_logit_softcap = 0.0f;
  // Mixture of experts (Mixtral, Qwen3-MoE): every layer's FFN is `num_experts` experts of
  // `intermediate_size` channels each (<arch>.expert_feed_forward_length where the file has
  // it, else feed_forward_length), of which a router picks `num_experts_used` per token
  // (<arch>.expert_count, <arch>.expert_used_count); 0: a dense FFN.
  int64_t num_experts = 0;
  int64_t num_experts_used = 0;
  // Layers that rotate nothing (SmolLM3's NoPE layers): `loom.rope.layers`, a bool per layer
  // saying whether it applies RoPE, else the architecture's ArchitectureRules::no_rope_period;
  // empty when every layer rotates.
  std::vector<bool> rope_layers;
  // The chosen experts' router probabilities are renormalized to sum to 1
  // (<arch>.expert_weights_norm; Mixtral's and Qwen3-MoE's rule, llama.cpp's default; not
  // qwen2moe's).
  bool expert_weights_norm = true;
  // A shared expert beside the routed ones (Qwen2-MoE: blk.L.ffn_{gate,up,down}_shexp), run
  // for every token and added to their sum: a dense gated FFN of this many channels
  // (<arch>.expert_shared_feed_forward_length, else feed_forward_length); 0: none. With
  // `shared_expert_gated` its output is first scaled by sigmoid(w · x), w the [hidden]
  // gate blk.L.ffn_gate_inp_shexp.
  int64_t shared_expert_intermediate_size = 0;
  bool shared_expert_gated = false;
  // Layers [0, leading_dense_layers) of a mixture of experts are dense FFNs of
  // `dense_intermediate_size` channels (<arch>.leading_dense_block_count and
  // feed_forward_length: GLM-4.5's first_k_dense_replace); 0: every layer routes.
  int64_t leading_dense_layers = 0;
  int64_t dense_intermediate_size = 0;
  // GLM-4.5's routing: each expert's score is its logit's sigmoid, not a softmax
  // (<arch>.expert_gating_func 2; glm4moe's default), chosen with a per-expert bias added
  // (blk.L.exp_probs_b.bias present: `expert_selection_bias`), and the weights multiplied by
  // `expert_weights_scale` (<arch>.expert_weights_scale, routed_scaling_factor).
  bool expert_sigmoid = false;
  bool expert_selection_bias = false;
  float expert_weights_scale = 1.0f;
  // Grouped routing (DeepSeek-V2/V3's n_group, topk_group; <arch>.expert_group_count,
  // expert_group_used_count): the top-k is chosen inside the best `expert_groups_used` of
  // `expert_groups` equal groups of experts (kernels/cpu/moe_routing.h). 1: none.
  int64_t expert_groups = 1;
  int64_t expert_groups_used = 1;
  // Multi-token-prediction layers stored after the model's own (<arch>.nextn_predict_layers:
  // GLM-4.5's): counted by block_count, not by num_layers, and never run.
  int64_t nextn_layers = 0;
  // gpt-oss: the experts' activation is OpenAI's clamped SwiGLU with this limit
  // (ArchitectureRules::swiglu_limit, or `loom.swiglu_limit`); 0: SiLU(gate) * up.
  float swiglu_limit = 0.0f;
  // gpt-oss's tensors: an attention sink per query head (blk.0.attn_sinks.weight, a logit
  // in each attention softmax's denominator), a bias on the attention output
  // (blk.0.attn_output.bias), and biases on the router and every expert matrix
  // (blk.0.ffn_gate_inp.bias, ffn_{gate,up,down}_exps.bias).
  bool attention_sinks = false;
  bool attention_output_bias = false;
  bool expert_bias = false;
  // Multi-head latent attention (DeepSeek-V2/V3, ArchitectureRules::mla): each layer
  // projects the hidden state to a latent of `mla_kv_lora_rank` channels and a rope_dim-wide
  // key part shared by every head (attn_kv_a_mqa) and normalizes the latent
  // (attn_kv_a_norm); a head's key would be `mla_nope_dim` channels decompressed from the
  // latent (attn_kv_b, or attn_k_b) beside the rotated key part, its value `mla_value_dim`
  // channels decompressed (attn_kv_b, or attn_v_b); queries come from the hidden state
  // (attn_q) or through a normalized latent of `mla_q_lora_rank` channels (attn_q_a,
  // attn_q_a_norm, attn_q_b; 0: none), mla_nope_dim + rope_dim wide per head. Loom runs the
  // absorbed form: the KV pool holds the latent and the rotated key part (head_dim =
  // rope_dim + mla_kv_lora_rank, num_kv_heads = 1), each query head is multiplied into the
  // latent space, and each head's attention output out of it. 0: standard attention.
  int64_t mla_kv_lora_rank = 0;
  int64_t mla_q_lora_rank = 0;
  int64_t mla_nope_dim = 0;
  int64_t mla_value_dim = 0;

  /// The window every layer attends within (each one local), else 0: a sequence's KV
  /// blocks behind it can be freed only when no layer is global.
  int64_t WindowOfEveryLayer() const {
    if (sliding_window <= 0 || sliding_layers.empty()) return 0;
    for (bool local : sliding_layers) {
      if (!local) return 0;
    }
    return sliding_window;
  }
  /// The window of layer `layer`: sliding_window for a local layer, else 0 (full).
  int64_t LayerWindow(int64_t layer) const {
    return sliding_window > 0 && sliding_layers[static_cast<size_t>(layer)] ? sliding_window : 0;
  }
  /// Whether layer `layer`'s FFN is the mixture of experts (else a dense FFN).
  bool LayerHasExperts(int64_t layer) const {
    return num_experts > 0 && layer >= leading_dense_layers;
  }
  /// The width of the dense FFN layers have (those without experts).
  int64_t DenseFfnWidth() const {
    return num_experts > 0 ? dense_intermediate_size : intermediate_size;
  }
  /// Whether attention is multi-head latent attention (mla_kv_lora_rank > 0).
  bool mla() const { return mla_kv_lora_rank > 0; }
  /// Whether layer `layer` applies RoPE to its queries and keys.
  bool LayerRotates(int64_t layer) const {
    return rope_layers.empty() || rope_layers[static_cast<size_t>(layer)];
  }
  // The model's own defaults for requests that leave a sampling field unset
  // (generation_config.json of a Hugging Face directory; `loom.sampling.*`).
  SamplingDefaults sampling_defaults;
};

/// Reads and validates the hyper-parameters of a llama-family model; InvalidArgument
/// naming the key (or tensor) for missing, out-of-range or inconsistent values (e.g.
/// heads not dividing the hidden size). Thread-safe (reads `gguf` only).
absl::StatusOr<ModelConfig> ModelConfigFromGguf(const GgufFile& gguf);

}  // namespace loom::common
