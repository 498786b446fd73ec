#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/formats/gguf_metadata_builder.h"
#include "common/formats/hf_quantization.h"

namespace loom::common {

/// What a Hugging Face `config.json` says beyond the GGUF hyper-parameter keys.
struct HfConfigInfo {
  std::string architecture;          // the GGUF architecture: "llama", "mistral", "qwen2", "qwen3"
  bool tie_word_embeddings = false;  // the LM head reuses model.embed_tokens.weight
  // Gemma's layer norm names: post_attention_layernorm is the attention output's norm
  // (GGUF post_attention_norm), pre_feedforward_layernorm the FFN's input norm.
  bool sandwich_norms = false;
  // Phi-3's longrope factors (rope_scaling long_factor / short_factor, [rope_dim / 2] each),
  // served as the tensors rope_factors_long.weight / rope_factors_short.weight; empty
  // without longrope.
  std::vector<float> rope_factors_long, rope_factors_short;
  // quantization_config: AWQ or GPTQ weights (common/formats/hf_quantization), or none.
  HfQuantization quantization;
  // The config was a multimodal model's (Gemma3ForConditionalGeneration,
  // Mistral3ForConditionalGeneration, LlavaForConditionalGeneration,
  // Qwen2VLForConditionalGeneration, Qwen2_5_VLForConditionalGeneration,
  // Qwen3VLForConditionalGeneration, Qwen3VLMoeForConditionalGeneration): its text model is
  // served, its vision tower's and projector's tensors are skipped.
  bool multimodal = false;
  // Layers from here on (GLM-4.5's multi-token-prediction layers, num_nextn_predict_layers
  // after num_hidden_layers) are in the checkpoint but not run: their tensors are skipped.
  // -1: none.
  int64_t first_skipped_layer = -1;
};

/// Translates `config.json` (its text) of one of common/formats/architecture's Hugging Face
/// classes, or of a multimodal wrapper around one (its `text_config`, over transformers'
/// defaults for Gemma 3), into the GGUF keys ModelConfigFromGguf reads
/// (`general.architecture`, `<arch>.embedding_length`, rope scaling, ...), appended to
/// `metadata`. HF q/k projections are in the rotate-half layout, so `loom.rope.neox` is
/// set. InvalidArgument / Unimplemented naming the architecture, field or value that Loom
/// cannot serve (another architecture, a non-SiLU activation, MLP biases, dynamic or
/// longrope scaling, sliding-window attention). Thread-safe.
absl::StatusOr<HfConfigInfo> HfConfigToGguf(const std::string& config_json,
                                            GgufMetadataBuilder& metadata);

}  // namespace loom::common
