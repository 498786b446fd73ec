#include "common/formats/architecture.h"

#include <array>

namespace loom::common {
namespace {

// Mistral's and Qwen's layouts are llama's (same tensor names and hyper-parameters); the
// mixture-of-experts ones add a router and experts (`<arch>.expert_count`). Mixtral's GGUF
// files are `llama` ones with experts: its entry maps the Hugging Face class only (names are
// looked up first match first).
// llama.cpp's deepseek2 (DeepSeek-V2, V3 and their derivatives under either Hugging Face
// class): multi-head latent attention with interleaved RoPE pairs on a shared key part, the
// first layers dense, the rest routed (by softmax probability, not renormalized, unless the
// file says otherwise) beside ungated shared experts.
constexpr ArchitectureRules DeepSeekRules(std::string_view hf_class_name) {
  return {.gguf_name = "deepseek2",
          .hf_class_name = hf_class_name,
          .gguf_rope_neox = false,
          .sliding_window_every_layer = false,
          .gemma = false,
          .default_sliding_period = 0,
          .local_rope_theta = 0.0,
          .hf_rope_interleaved = true,
          .expert_weights_norm = false,
          .mla = true};
}

constexpr std::array<ArchitectureRules, 26> kArchitectures = {{
    {.gguf_name = "llama",
     .hf_class_name = "LlamaForCausalLM",
     .gguf_rope_neox = false,
     .sliding_window_every_layer = false,
     .gemma = false,
     .default_sliding_period = 0,
     .local_rope_theta = 0.0},
    {.gguf_name = "mistral",
     .hf_class_name = "MistralForCausalLM",
     .gguf_rope_neox = false,
     .sliding_window_every_layer = true,
     .gemma = false,
     .default_sliding_period = 0,
     .local_rope_theta = 0.0},
    {.gguf_name = "qwen2",
     .hf_class_name = "Qwen2ForCausalLM",
     .gguf_rope_neox = true,
     .sliding_window_every_layer = false,
     .gemma = false,
     .default_sliding_period = 0,
     .local_rope_theta = 0.0},
    {.gguf_name = "qwen3",
     .hf_class_name = "Qwen3ForCausalLM",
     .gguf_rope_neox = true,
     .sliding_window_every_layer = false,
     .gemma = false,
     .default_sliding_period = 0,
     .local_rope_theta = 0.0},
    {.gguf_name = "qwen3moe",
     .hf_class_name = "Qwen3MoeForCausalLM",
     .gguf_rope_neox = true,
     .sliding_window_every_layer = false,
     .gemma = false,
     .default_sliding_period = 0,
     .local_rope_theta = 0.0},
    // Qwen2-MoE (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): Qwen2's attention (Q/K/V biases) and
    // routed experts beside a shared expert scaled by a sigmoid gate (ffn_*_shexp,
    // ffn_gate_inp_shexp); the routed probabilities not renormalized unless the file says.
    {.gguf_name = "qwen2moe",
     .hf_class_name = "Qwen2MoeForCausalLM",
     .gguf_rope_neox = true,
     .sliding_window_every_layer = false,
     .gemma = false,
     .default_sliding_period = 0,
     .local_rope_theta = 0.0,
     .expert_weights_norm = false,
     .expert_width_per_used = true},
    {.gguf_name = "llama",
     .hf_class_name = "MixtralForCausalLM",
     .gguf_rope_neox = false,
     .sliding_window_every_layer = true,
     .gemma = false,
     .default_sliding_period = 0,
     .local_rope_theta = 0.0},
    // Phi-3 and Phi-4 (fused QKV and gate/up; longrope factors; a sliding window on every
    // layer where the config gives one).
    {.gguf_name = "phi3",
     .hf_class_name = "Phi3ForCausalLM",
     .gguf_rope_neox = true,
     .sliding_window_every_layer = true,
     .gemma = false,
     .default_sliding_period = 0,
     .local_rope_theta = 0.0},
    // Gemma 3's text model (llama.cpp's gemma3; Hugging Face's Gemma3ForCausalLM, the 1B
    // checkpoint: the larger ones are multimodal Gemma3ForConditionalGeneration).
    {.gguf_name = "gemma3",
     .hf_class_name = "Gemma3ForCausalLM",
     .gguf_rope_neox = true,
     .sliding_window_every_layer = false,
     .gemma = true,
     .default_sliding_period = 6,
     .local_rope_theta = 10000.0,
     .hf_sandwich_norms = true},
    // Gemma 2 (llama.cpp's gemma2, Hugging Face's Gemma2ForCausalLM): Gemma 3's layout
    // without QK-norm, every other layer local (even ones), one RoPE base, and soft-capped
    // attention scores and final logits (<arch>.attn_logit_softcapping,
    // <arch>.final_logit_softcapping).
    {.gguf_name = "gemma2",
     .hf_class_name = "Gemma2ForCausalLM",
     .gguf_rope_neox = true,
     .sliding_window_every_layer = false,
     .gemma = true,
     .default_sliding_period = 2,
     .local_rope_theta = 0.0,
     .hf_sandwich_norms = true},
    // SmolLM3 (llama.cpp's smollm3, Hugging Face's SmolLM3ForCausalLM): llama's layout (the
    // GGUF converter permutes q/k as for llama) with every 4th layer taking no RoPE.
    {.gguf_name = "smollm3",
     .hf_class_name = "SmolLM3ForCausalLM",
     .gguf_rope_neox = false,
     .sliding_window_every_layer = false,
     .gemma = false,
     .default_sliding_period = 0,
     .local_rope_theta = 0.0,
     .no_rope_period = 4},
    // Granite 3 (llama.cpp's granite, Hugging Face's GraniteForCausalLM): llama's layout (q/k
    // permuted by the GGUF converter) with multipliers on the embeddings, the attention
    // scores, each sub-layer's output and the logits (<arch>.embedding_scale, ...).
    {.gguf_name = "granite",
     .hf_class_name = "GraniteForCausalLM",
     .gguf_rope_neox = false,
     .sliding_window_every_layer = false,
     .gemma = false,
     .default_sliding_period = 0,
     .local_rope_theta = 0.0,
     .no_rope_period = 0},
    // Granite 3 MoE (llama.cpp's granitemoe, Hugging Face's GraniteMoeForCausalLM: granite-3.1-
    // 1b-a400m, -3b-a800m): Granite's multipliers over a mixture of experts routed by a softmax
    // over the chosen logits (renormalized); GraniteMoeShared adds an ungated shared expert
    // (<arch>.expert_shared_feed_forward_length, shared_intermediate_size). Its HF
    // experts are stacked: input_linear [E, 2 * ffn, hidden] (gate rows, then up rows) and
    // output_linear [E, hidden, ffn].
    {.gguf_name = "granitemoe",
     .hf_class_name = "GraniteMoeForCausalLM",
     .gguf_rope_neox = false,
     .sliding_window_every_layer = false,
     .gemma = false,
     .default_sliding_period = 0,
     .local_rope_theta = 0.0},
    {.gguf_name = "granitemoe",
     .hf_class_name = "GraniteMoeSharedForCausalLM",
     .gguf_rope_neox = false,
     .sliding_window_every_layer = false,
     .gemma = false,
     .default_sliding_period = 0,
     .local_rope_theta = 0.0},
    // GLM-4 (llama.cpp's glm4, Hugging Face's Glm4ForCausalLM: GLM-4-0414, GLM-Z1): norms
    // before and after each sub-layer (post_attention_norm / post_ffw_norm), gate and up
    // fused, Q/K/V biases, half of each head rotating in interleaved pairs in both formats.
    {.gguf_name = "glm4",
     .hf_class_name = "Glm4ForCausalLM",
     .gguf_rope_neox = false,
     .sliding_window_every_layer = false,
     .gemma = false,
     .default_sliding_period = 0,
     .local_rope_theta = 0.0,
     .no_rope_period = 0,
     .hf_rope_interleaved = true},
    // Gemma 1 (llama.cpp's gemma, Hugging Face's GemmaForCausalLM; CodeGemma): Gemma's scaled
    // embeddings, GELU and 1 + w norms, llama's two norms per layer, no window or caps.
    {.gguf_name = "gemma",
     .hf_class_name = "GemmaForCausalLM",
     .gguf_rope_neox = true,
     .sliding_window_every_layer = false,
     .gemma = true,
     .default_sliding_period = 0,
     .local_rope_theta = 0.0},
    // gpt-oss (llama.cpp's gpt-oss, Hugging Face's GptOssForCausalLM): a mixture of experts
    // with biases on Q/K/V, the attention output, the router and every expert matrix, an
    // attention sink per query head, OpenAI's clamped SwiGLU, YaRN, and even layers local
    // (a 128-token window). Its FFN norm is the file's post_attention_norm.
    {.gguf_name = "gpt-oss",
     .hf_class_name = "GptOssForCausalLM",
     .gguf_rope_neox = true,
     .sliding_window_every_layer = false,
     .gemma = false,
     .default_sliding_period = 2,
     .local_rope_theta = 0.0,
     .gguf_ffn_norm = "post_attention_norm",
     .swiglu_limit = 7.0},
    // GLM-4.5 and GLM-4.5-Air (llama.cpp's glm4moe, Hugging Face's Glm4MoeForCausalLM): Q/K/V
    // biases, optional QK-norm, half of each head rotating (NeoX pairs), the first layers
    // dense, the rest routed by sigmoid scores chosen with a per-expert bias, times a scale,
    // beside an ungated shared expert; the FFN norm named post_attention_norm; the
    // multi-token-prediction layers after the model's are not run.
    {.gguf_name = "glm4moe",
     .hf_class_name = "Glm4MoeForCausalLM",
     .gguf_rope_neox = true,
     .sliding_window_every_layer = false,
     .gemma = false,
     .default_sliding_period = 0,
     .local_rope_theta = 0.0,
     .gguf_ffn_norm = "post_attention_norm",
     .expert_sigmoid = true},
    // DeepSeek-V2 and V2-Lite (Hugging Face's DeepseekV2ForCausalLM); DeepSeek-V3 and R1, Kimi
    // K2, Moonlight (DeepseekV3ForCausalLM: sigmoid scores with a selection bias inside the
    // best expert groups, as its config.json says; the multi-token-prediction layer not run).
    DeepSeekRules("DeepseekV2ForCausalLM"),
    DeepSeekRules("DeepseekV3ForCausalLM"),
    // OLMo 2 (llama.cpp's olmo2, Hugging Face's Olmo2ForCausalLM): no norm before attention
    // or the FFN, each sub-layer's output RMS-normalized before it joins the residual stream
    // (Hugging Face's post_attention_layernorm and post_feedforward_layernorm), and a
    // QK-norm over all heads at once. With a sliding window (OLMo 3) every 4th layer is global
    // unless the file says otherwise (llama.cpp's rule).
    {.gguf_name = "olmo2",
     .hf_class_name = "Olmo2ForCausalLM",
     .gguf_rope_neox = true,
     .sliding_window_every_layer = false,
     .gemma = false,
     .default_sliding_period = 4,
     .local_rope_theta = 0.0,
     .hf_sandwich_norms = true},
    // OLMo 3: OLMo 2 with three of every four layers local (`layer_types`); llama.cpp
    // writes its GGUFs as olmo2 ones with a window.
    {.gguf_name = "olmo2",
     .hf_class_name = "Olmo3ForCausalLM",
     .gguf_rope_neox = true,
     .sliding_window_every_layer = false,
     .gemma = false,
     .default_sliding_period = 4,
     .local_rope_theta = 0.0,
     .hf_sandwich_norms = true},
    // OLMoE (llama.cpp's olmoe, Hugging Face's OlmoeForCausalLM): llama's norms, a QK-norm
    // over all heads, 64 experts of which 8 route each token, their probabilities not
    // renormalized.
    {.gguf_name = "olmoe",
     .hf_class_name = "OlmoeForCausalLM",
     .gguf_rope_neox = true,
     .sliding_window_every_layer = false,
     .gemma = false,
     .default_sliding_period = 0,
     .local_rope_theta = 0.0,
     .expert_weights_norm = false},
    // ERNIE 4.5 dense (llama.cpp's ernie4_5, Hugging Face's Ernie4_5ForCausalLM: ERNIE-4.5-0.3B):
    // llama's layout rotating interleaved pairs in both formats, as GLM-4 does (its converter
    // does not permute the rows).
    {.gguf_name = "ernie4_5",
     .hf_class_name = "Ernie4_5ForCausalLM",
     .gguf_rope_neox = false,
     .sliding_window_every_layer = false,
     .gemma = false,
     .default_sliding_period = 0,
     .local_rope_theta = 0.0,
     .hf_rope_interleaved = true},
    // ERNIE 4.5 mixture of experts (llama.cpp's ernie4_5-moe, Hugging Face's
    // Ernie4_5_MoeForCausalLM: ERNIE-4.5-21B-A3B, -300B-A47B): ERNIE 4.5's attention, dense
    // layers before the sparse ones, softmax scores chosen with a per-expert bias, renormalized,
    // beside ungated shared experts; its multi-token-prediction tensors are not run.
    {.gguf_name = "ernie4_5-moe",
     .hf_class_name = "Ernie4_5_MoeForCausalLM",
     .gguf_rope_neox = false,
     .sliding_window_every_layer = false,
     .gemma = false,
     .default_sliding_period = 0,
     .local_rope_theta = 0.0,
     .hf_rope_interleaved = true},
    // EXAONE 4.0 (llama.cpp's exaone4, Hugging Face's Exaone4ForCausalLM): OLMo 2's norms after
    // each sub-layer and none before, a per-head QK-norm, and (32B) three local layers of four
    // whose global ones rotate nothing; the 1.2B model has no window and rotates every layer.
    {.gguf_name = "exaone4",
     .hf_class_name = "Exaone4ForCausalLM",
     .gguf_rope_neox = true,
     .sliding_window_every_layer = false,
     .gemma = false,
     .default_sliding_period = 4,
     .local_rope_theta = 0.0,
     .hf_sandwich_norms = true,
     .global_layers_unrotated = true},
}};

}  // namespace

absl::Span<const ArchitectureRules> Architectures() { return kArchitectures; }

const ArchitectureRules* FindArchitecture(std::string_view gguf_name) {
  for (const ArchitectureRules& rules : kArchitectures) {
    if (rules.gguf_name == gguf_name) return &rules;
  }
  return nullptr;
}

const ArchitectureRules* FindHfArchitecture(std::string_view hf_class_name) {
  for (const ArchitectureRules& rules : kArchitectures) {
    if (rules.hf_class_name == hf_class_name) return &rules;
  }
  return nullptr;
}

}  // namespace loom::common
