#pragma once

#include <cstdint>
#include <string_view>

#include "absl/types/span.h"

namespace loom::common {

/// What Loom knows about one model architecture that neither its GGUF keys nor its
/// `config.json` fields say. Every per-architecture rule lives in this table rather than as
/// name comparisons where it is used; what a file does say (Q/K/V biases, QK-norm, a
/// separate LM head) is read from its tensors instead.
struct ArchitectureRules {
  std::string_view gguf_name;      // general.architecture, the `<arch>.` key prefix
  std::string_view hf_class_name;  // config.json's `architectures[0]`
  // GGUF files of this architecture rotate (i, i + rope_dim/2) (NeoX, HF's rotate_half)
  // rather than (2i, 2i+1): false where the GGUF converter permutes the q/k rows
  // (llama, mistral) or where the model itself pairs them so (GLM-4). Hugging Face
  // checkpoints are rotate-half unless hf_rope_interleaved.
  bool gguf_rope_neox;
  // config.json's `sliding_window` applies to every layer (Mistral v0.1's 4096 tokens);
  // otherwise only with `use_sliding_window`, from layer `max_window_layers` on (Qwen2), or
  // where `layer_types` says "sliding_attention".
  bool sliding_window_every_layer;
  // Gemma: embeddings multiplied by sqrt(hidden) on the way in, a GELU (tanh) gate instead
  // of SiLU, and Hugging Face RMSNorm weights stored as w where the model scales by 1 + w
  // (llama.cpp's converter writes 1 + w into GGUFs).
  bool gemma = false;
  // Every N-th layer is global when a file with a sliding window names no layer pattern
  // (llama.cpp's rule for Gemma 3: 6); 0: every layer local then.
  int64_t default_sliding_period = 0;
  // The RoPE base of local (sliding-window) layers, which also take no RoPE scaling
  // (Gemma 3's rope_local_base_freq, 10,000); 0: every layer rotates alike.
  double local_rope_theta = 0.0;
  // Every N-th layer (the N-th, 2N-th, ...) rotates nothing: no RoPE on its queries and keys
  // (SmolLM3's NoPE layers, every 4th; llama.cpp has no key for it). A Hugging Face
  // directory's `no_rope_layers` says it per layer instead. 0: every layer rotates.
  int64_t no_rope_period = 0;
  // Hugging Face names four norms per layer: post_attention_layernorm is the norm after
  // attention, pre_feedforward_layernorm the FFN's (Gemma 2 and 3; Gemma 1 names llama's two).
  bool hf_sandwich_norms = false;
  // The Hugging Face checkpoint rotates (2i, 2i+1) pairs, as its modeling code does (GLM-4),
  // rather than transformers' usual rotate_half.
  bool hf_rope_interleaved = false;
  // The tensor a GGUF file's FFN norm is (`blk.N.<name>.weight`): llama.cpp's ffn_norm, or
  // post_attention_norm where that is the norm between attention and the FFN (gpt-oss).
  std::string_view gguf_ffn_norm = "ffn_norm";
  // > 0: the experts' activation is OpenAI's clamped SwiGLU with this limit (gpt-oss: 7;
  // llama.cpp has no key for it, hard-coding it; config.json says `swiglu_limit`).
  double swiglu_limit = 0.0;
  // With a sliding window, the global layers rotate nothing (EXAONE 4's hybrid
  // attention: global NoPE); without one every layer rotates.
  bool global_layers_unrotated = false;
  // A mixture of experts' defaults where a GGUF file has no key for them (llama.cpp's
  // rules): the chosen experts' probabilities renormalized to sum to 1
  // (<arch>.expert_weights_norm; not qwen2moe's or olmoe's), experts scored by the
  // sigmoid of their logits rather than a softmax (<arch>.expert_gating_func; glm4moe's),
  // and experts feed_forward_length / expert_used_count wide
  // (<arch>.expert_feed_forward_length; qwen2moe's).
  bool expert_weights_norm = true;
  bool expert_sigmoid = false;
  bool expert_width_per_used = false;
  // Multi-head latent attention (DeepSeek-V2's): keys and values decompressed from a latent
  // (ModelConfig::mla_kv_lora_rank), queries optionally through one; the rotary part of a
  // head is its last rope_dim dims and is shared by every head's key; YaRN's attention
  // factor multiplies the softmax scale (squared) rather than RoPE's cosines and sines.
  bool mla = false;
};

/// Every architecture Loom serves, in the order error messages list them.
absl::Span<const ArchitectureRules> Architectures();

/// The rules for GGUF architecture `gguf_name`; nullptr for one Loom does not serve.
const ArchitectureRules* FindArchitecture(std::string_view gguf_name);

/// The rules for Hugging Face model class `hf_class_name` (e.g. "Qwen2ForCausalLM");
/// nullptr for one Loom does not serve.
const ArchitectureRules* FindHfArchitecture(std::string_view hf_class_name);

}  // namespace loom::common
