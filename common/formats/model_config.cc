#include "common/formats/model_config.h"

#include <algorithm>
#include <cmath>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/formats/architecture.h"
#include "common/formats/model_config_reader.h"
#include "common/status_macros.h"

namespace loom::common {
namespace {

using model_config_internal::AbslView;
using model_config_internal::CheckPositiveFinite;
using model_config_internal::CheckRange;
using model_config_internal::CheckTensorShape;
using model_config_internal::ConfigReader;
using model_config_internal::FirstExpertLayerTensor;
using model_config_internal::kMaxContext;
using model_config_internal::kMaxDimension;
using model_config_internal::kMaxHeads;
using model_config_internal::kMaxLayers;
using model_config_internal::kMaxVocab;
using model_config_internal::ParseRopeScaling;
using model_config_internal::ReadExperts;
using model_config_internal::ReadNextnLayers;
using model_config_internal::ReadSharedExpert;
using model_config_internal::ShapeString;

// general.architecture (one of Architectures()) and general.name.
absl::Status ReadArchitecture(const GgufFile& gguf, ModelConfig& config) {
  if (gguf.Find("general.architecture") == nullptr) {
    return absl::InvalidArgumentError(
        "model config: required key 'general.architecture' is missing");
  }
  LOOM_ASSIGN_OR_RETURN(std::string_view architecture, gguf.GetString("general.architecture"));
  config.architecture = std::string(architecture);
  if (FindArchitecture(architecture) == nullptr) {
    std::vector<std::string> names;
    for (const ArchitectureRules& rules : Architectures()) {
      if (std::find(names.begin(), names.end(), rules.gguf_name) == names.end()) {
        names.emplace_back(rules.gguf_name);
      }
    }
    return absl::InvalidArgumentError(
        absl::StrCat("model config: unsupported architecture '", AbslView(architecture),
                     "' (supported: ", absl::StrJoin(names, ", "), ")"));
  }
  if (gguf.Find("general.name") != nullptr) {
    LOOM_ASSIGN_OR_RETURN(std::string_view name, gguf.GetString("general.name"));
    config.name = std::string(name);
  }
  return absl::OkStatus();
}

// Multi-head latent attention's widths (ModelConfig::mla_kv_lora_rank): the latents', a
// decompressed key's (its rotary part rope.dimension_count) and value's. Files converted for
// llama.cpp's absorbed MLA give the decompressed widths as key_length_mla / value_length_mla
// (key_length being the latent's then). The KV pool's one head holds the latent beside the
// rotary key part.
absl::Status ReadMlaShapes(const ConfigReader& reader, const GgufFile& gguf, ModelConfig& config) {
  LOOM_ASSIGN_OR_RETURN(config.mla_kv_lora_rank, reader.RequiredInt("attention.kv_lora_rank"));
  LOOM_RETURN_IF_ERROR(
      CheckRange(reader, "attention.kv_lora_rank", config.mla_kv_lora_rank, 1, kMaxDimension));
  LOOM_RETURN_IF_ERROR(reader.OptionalInt("attention.q_lora_rank", config.mla_q_lora_rank));
  LOOM_RETURN_IF_ERROR(
      CheckRange(reader, "attention.q_lora_rank", config.mla_q_lora_rank, 0, kMaxDimension));
  const bool absorbed = gguf.Find(reader.Key("attention.key_length_mla")) != nullptr;
  const char* key_length = absorbed ? "attention.key_length_mla" : "attention.key_length";
  const char* value_length = absorbed ? "attention.value_length_mla" : "attention.value_length";
  LOOM_ASSIGN_OR_RETURN(const int64_t key, reader.RequiredInt(key_length));
  LOOM_RETURN_IF_ERROR(CheckRange(reader, key_length, key, 2, kMaxDimension));
  LOOM_ASSIGN_OR_RETURN(config.mla_value_dim, reader.RequiredInt(value_length));
  LOOM_RETURN_IF_ERROR(CheckRange(reader, value_length, config.mla_value_dim, 1, key));
  LOOM_ASSIGN_OR_RETURN(const int64_t rope, reader.RequiredInt("rope.dimension_count"));
  LOOM_RETURN_IF_ERROR(CheckRange(reader, "rope.dimension_count", rope, 2, key - 1));
  if (rope % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model config: '", reader.Key("rope.dimension_count"), "' ", rope, " is odd"));
  }
  config.mla_nope_dim = key - rope;
  config.head_dim = rope + config.mla_kv_lora_rank;
  config.num_kv_heads = 1;
  return absl::OkStatus();
}

// Context, widths, layers and heads, the head dimension.
absl::Status ReadShapes(const ConfigReader& reader, const GgufFile& gguf, ModelConfig& config) {
  LOOM_ASSIGN_OR_RETURN(config.context_length, reader.RequiredInt("context_length"));
  LOOM_RETURN_IF_ERROR(CheckRange(reader, "context_length", config.context_length, 1, kMaxContext));
  LOOM_ASSIGN_OR_RETURN(config.hidden_size, reader.RequiredInt("embedding_length"));
  LOOM_RETURN_IF_ERROR(CheckRange(reader, "embedding_length", config.hidden_size, 1, kMaxDimension));
  LOOM_ASSIGN_OR_RETURN(config.intermediate_size, reader.RequiredInt("feed_forward_length"));
  LOOM_RETURN_IF_ERROR(
      CheckRange(reader, "feed_forward_length", config.intermediate_size, 1, kMaxDimension));
  LOOM_ASSIGN_OR_RETURN(config.num_layers, reader.RequiredInt("block_count"));
  LOOM_RETURN_IF_ERROR(CheckRange(reader, "block_count", config.num_layers, 1, kMaxLayers));
  LOOM_ASSIGN_OR_RETURN(config.num_heads, reader.RequiredInt("attention.head_count"));
  LOOM_RETURN_IF_ERROR(CheckRange(reader, "attention.head_count", config.num_heads, 1, kMaxHeads));

  config.num_kv_heads = config.num_heads;
  LOOM_RETURN_IF_ERROR(reader.OptionalInt("attention.head_count_kv", config.num_kv_heads));
  LOOM_RETURN_IF_ERROR(
      CheckRange(reader, "attention.head_count_kv", config.num_kv_heads, 1, config.num_heads));
  if (config.num_heads % config.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model config: attention.head_count ", config.num_heads,
        " is not a multiple of attention.head_count_kv ", config.num_kv_heads));
  }

  if (FindArchitecture(config.architecture)->mla) return ReadMlaShapes(reader, gguf, config);
  if (gguf.Find(reader.Key("attention.key_length")) != nullptr) {
    LOOM_RETURN_IF_ERROR(reader.OptionalInt("attention.key_length", config.head_dim));
    LOOM_RETURN_IF_ERROR(
        CheckRange(reader, "attention.key_length", config.head_dim, 1, kMaxDimension));
  } else {
    if (config.hidden_size % config.num_heads != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model config: embedding_length ", config.hidden_size,
          " is not divisible by attention.head_count ", config.num_heads,
          " and no attention.key_length is given"));
    }
    config.head_dim = config.hidden_size / config.num_heads;
  }
  if (config.head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model config: head dimension ", config.head_dim, " is odd"));
  }
  int64_t value_length = config.head_dim;
  LOOM_RETURN_IF_ERROR(reader.OptionalInt("attention.value_length", value_length));
  if (value_length != config.head_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model config: '", reader.Key("attention.value_length"), "' ", value_length,
        " differs from the key length ", config.head_dim, " (unsupported)"));
  }

  return absl::OkStatus();
}

// RMSNorm epsilon, RoPE base, rotated dimensions and style.
absl::Status ReadRope(const ConfigReader& reader, const GgufFile& gguf, ModelConfig& config) {
  LOOM_RETURN_IF_ERROR(
      reader.OptionalDouble("attention.layer_norm_rms_epsilon", config.rms_norm_eps));
  LOOM_RETURN_IF_ERROR(
      CheckPositiveFinite(reader, "attention.layer_norm_rms_epsilon", config.rms_norm_eps));
  LOOM_RETURN_IF_ERROR(reader.OptionalDouble("rope.freq_base", config.rope_theta));
  LOOM_RETURN_IF_ERROR(CheckPositiveFinite(reader, "rope.freq_base", config.rope_theta));
  config.rope_dim = config.head_dim;
  LOOM_RETURN_IF_ERROR(reader.OptionalInt("rope.dimension_count", config.rope_dim));
  LOOM_RETURN_IF_ERROR(CheckRange(reader, "rope.dimension_count", config.rope_dim, 2, config.head_dim));
  if (config.rope_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("model config: '", reader.Key("rope.dimension_count"),
                                                   "' ", config.rope_dim, " is odd"));
  }

  config.rope_neox = FindArchitecture(config.architecture)->gguf_rope_neox;
  if (gguf.Find("loom.rope.neox") != nullptr) {
    LOOM_ASSIGN_OR_RETURN(config.rope_neox, gguf.GetBool("loom.rope.neox"));
  }

  return absl::OkStatus();
}

// Phi-3's longrope: the long factors when the context exceeds the pre-training one (as
// llama.cpp chooses, once), else the short ones; cos and sin scaled by
// rope.scaling.attn_factor, else sqrt(1 + ln(s) / ln(original)) for s = context / original.
absl::Status ReadLongRope(const ConfigReader& reader, const GgufFile& gguf, ModelConfig& config) {
  config.rope_scaling = RopeScalingType::kLongRope;
  LOOM_RETURN_IF_ERROR(CheckRange(reader, "rope.scaling.original_context_length",
                                  config.rope_original_context_length, 1, kMaxContext));
  const double original = static_cast<double>(config.rope_original_context_length);
  const double stretch = static_cast<double>(config.context_length) / original;
  const bool use_long = stretch > 1.0 && gguf.FindTensor("rope_factors_long.weight") != nullptr;
  config.rope_factors_tensor = use_long || gguf.FindTensor("rope_factors_short.weight") == nullptr
                                   ? "rope_factors_long.weight"
                                   : "rope_factors_short.weight";
  config.rope_attention_factor =
      stretch > 1.0 ? std::sqrt(1.0 + std::log(stretch) / std::log(original)) : 1.0;
  LOOM_RETURN_IF_ERROR(
      reader.OptionalDouble("rope.scaling.attn_factor", config.rope_attention_factor));
  if (gguf.Find("loom.rope.scaling.attention_factor") != nullptr) {
    LOOM_ASSIGN_OR_RETURN(config.rope_attention_factor,
                          gguf.GetDouble("loom.rope.scaling.attention_factor"));
  }
  LOOM_RETURN_IF_ERROR(
      CheckPositiveFinite(reader, "rope.scaling.attn_factor", config.rope_attention_factor));
  return absl::OkStatus();
}

// RoPE scaling: linear, llama3 (parameters or per-frequency factors) or YaRN.
absl::Status ReadRopeScaling(const ConfigReader& reader, const GgufFile& gguf,
                             ModelConfig& config) {
  // RoPE scaling. Llama 3.1 GGUFs carry precomputed per-frequency factors as the
  // rope_freqs.weight tensor and often no scaling type at all.
  std::string scaling_type;
  LOOM_RETURN_IF_ERROR(reader.OptionalString("rope.scaling.type", scaling_type));
  LOOM_ASSIGN_OR_RETURN(config.rope_scaling, ParseRopeScaling(scaling_type));
  LOOM_RETURN_IF_ERROR(reader.OptionalInt("rope.scaling.original_context_length",
                                          config.rope_original_context_length));
  const bool longrope = gguf.FindTensor("rope_factors_long.weight") != nullptr ||
                        gguf.FindTensor("rope_factors_short.weight") != nullptr;
  if (longrope) {
    LOOM_RETURN_IF_ERROR(ReadLongRope(reader, gguf, config));
  } else if (gguf.FindTensor("rope_freqs.weight") != nullptr) {
    config.rope_factors_tensor = "rope_freqs.weight";
    if (config.rope_scaling == RopeScalingType::kNone) config.rope_scaling = RopeScalingType::kLlama3;
  }
  config.rope_freq_factors = !config.rope_factors_tensor.empty();
  if (config.rope_freq_factors) {
    LOOM_RETURN_IF_ERROR(CheckTensorShape(gguf, config.rope_factors_tensor,
                                          {static_cast<uint64_t>(config.rope_dim / 2)}));
  }
  LOOM_RETURN_IF_ERROR(reader.OptionalDouble("rope.scaling.factor", config.rope_scaling_factor));
  LOOM_RETURN_IF_ERROR(reader.OptionalDouble("rope.scaling.low_freq_factor", config.rope_low_freq_factor));
  LOOM_RETURN_IF_ERROR(
      reader.OptionalDouble("rope.scaling.high_freq_factor", config.rope_high_freq_factor));
  if (config.rope_scaling != RopeScalingType::kNone) {
    LOOM_RETURN_IF_ERROR(CheckPositiveFinite(reader, "rope.scaling.factor", config.rope_scaling_factor));
  }
  if (config.rope_scaling == RopeScalingType::kYarn ||
      (config.rope_scaling == RopeScalingType::kLlama3 && !config.rope_freq_factors)) {
    // These formulas are functions of the pre-training context.
    LOOM_RETURN_IF_ERROR(CheckRange(reader, "rope.scaling.original_context_length",
                                    config.rope_original_context_length, 1, kMaxContext));
  }
  if (config.rope_scaling == RopeScalingType::kYarn) {
    LOOM_RETURN_IF_ERROR(
        reader.OptionalDouble("rope.scaling.yarn_beta_fast", config.rope_yarn_beta_fast));
    LOOM_RETURN_IF_ERROR(
        reader.OptionalDouble("rope.scaling.yarn_beta_slow", config.rope_yarn_beta_slow));
    LOOM_RETURN_IF_ERROR(
        CheckPositiveFinite(reader, "rope.scaling.yarn_beta_fast", config.rope_yarn_beta_fast));
    LOOM_RETURN_IF_ERROR(
        CheckPositiveFinite(reader, "rope.scaling.yarn_beta_slow", config.rope_yarn_beta_slow));
    if (gguf.Find("loom.rope.scaling.yarn_truncate") != nullptr) {
      LOOM_ASSIGN_OR_RETURN(config.rope_yarn_truncate,
                            gguf.GetBool("loom.rope.scaling.yarn_truncate"));
    }
    // The YaRN paper's default (transformers' and vLLM's): sqrt(1/t) = 0.1 ln(s) + 1.
    const double factor = config.rope_scaling_factor;
    config.rope_attention_factor = factor > 1.0 ? 0.1 * std::log(factor) + 1.0 : 1.0;
    if (gguf.Find("loom.rope.scaling.attention_factor") != nullptr) {
      LOOM_ASSIGN_OR_RETURN(config.rope_attention_factor,
                            gguf.GetDouble("loom.rope.scaling.attention_factor"));
      if (!std::isfinite(config.rope_attention_factor) || config.rope_attention_factor <= 0.0) {
        return absl::InvalidArgumentError(
            absl::StrCat("model config: 'loom.rope.scaling.attention_factor' is ",
                         config.rope_attention_factor, ", expected a positive finite number"));
      }
    }
  }
  if (config.rope_scaling == RopeScalingType::kLlama3) {
    LOOM_RETURN_IF_ERROR(
        CheckPositiveFinite(reader, "rope.scaling.low_freq_factor", config.rope_low_freq_factor));
    LOOM_RETURN_IF_ERROR(
        CheckPositiveFinite(reader, "rope.scaling.high_freq_factor", config.rope_high_freq_factor));
    if (config.rope_high_freq_factor <= config.rope_low_freq_factor) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model config: llama3 rope high_freq_factor ", config.rope_high_freq_factor,
          " must exceed low_freq_factor ", config.rope_low_freq_factor));
    }
  }

  return absl::OkStatus();
}

// Multi-head latent attention's softmax scale, 1 / sqrt of a decompressed key's width; with
// DeepSeek's YaRN, m = 1 + yarn_log_multiplier * ln(factor) multiplies it twice and RoPE's
// cosines and sines stay unscaled unless the file says (llama.cpp's deepseek2 graph;
// transformers' mscale_all_dim and the ratio of its two mscales).
absl::Status ReadMlaScale(const ConfigReader& reader, const GgufFile& gguf, ModelConfig& config) {
  if (!config.mla()) return absl::OkStatus();
  const double key = static_cast<double>(config.mla_nope_dim + config.rope_dim);
  config.attention_scale = 1.0 / std::sqrt(key);
  if (config.rope_scaling != RopeScalingType::kYarn) return absl::OkStatus();
  double log_multiplier = 0.0;
  LOOM_RETURN_IF_ERROR(reader.OptionalDouble("rope.scaling.yarn_log_multiplier", log_multiplier));
  if (!std::isfinite(log_multiplier) || log_multiplier < 0.0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model config: '", reader.Key("rope.scaling.yarn_log_multiplier"), "' is ",
                     log_multiplier, ", expected a non-negative finite number"));
  }
  const double m = 1.0 + log_multiplier * std::log(config.rope_scaling_factor);
  config.attention_scale = m * m / std::sqrt(key);
  if (gguf.Find("loom.rope.scaling.attention_factor") == nullptr) {
    config.rope_attention_factor = 1.0;
  }
  return absl::OkStatus();
}

// The vocabulary size: rows of the embedding table, else vocab_size, else the tokenizer's.
absl::Status ReadVocabulary(const ConfigReader& reader, const GgufFile& gguf, ModelConfig& config) {
  // Vocabulary: rows of the embedding table; the tokenizer may list fewer tokens (padded
  // embeddings) but never more.
  int64_t tokenizer_tokens = 0;
  if (gguf.Find("tokenizer.ggml.tokens") != nullptr) {
    LOOM_ASSIGN_OR_RETURN(const GgufValue::Array* tokens, gguf.GetArray("tokenizer.ggml.tokens"));
    tokenizer_tokens = static_cast<int64_t>(tokens->size());
  }
  int64_t declared_vocab = 0;
  LOOM_RETURN_IF_ERROR(reader.OptionalInt("vocab_size", declared_vocab));
  if (const GgufTensorInfo* embedding = gguf.FindTensor("token_embd.weight")) {
    if (embedding->shape.size() != 2 ||
        embedding->shape[0] != static_cast<uint64_t>(config.hidden_size)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model config: tensor 'token_embd.weight' has shape ", ShapeString(embedding->shape),
          ", expected [", config.hidden_size, ", vocab]"));
    }
    if (embedding->shape[1] > static_cast<uint64_t>(kMaxVocab)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model config: token_embd.weight has ", embedding->shape[1], " rows, more than ",
          kMaxVocab));
    }
    config.vocab_size = static_cast<int64_t>(embedding->shape[1]);
  } else if (declared_vocab > 0) {
    config.vocab_size = declared_vocab;
  } else {
    config.vocab_size = tokenizer_tokens;
  }
  if (config.vocab_size <= 0) {
    return absl::InvalidArgumentError(
        "model config: cannot tell the vocabulary size (no token_embd.weight tensor, no "
        "vocab_size key, no tokenizer.ggml.tokens)");
  }
  LOOM_RETURN_IF_ERROR(CheckRange(reader, "vocab_size", config.vocab_size, 1, kMaxVocab));
  if (declared_vocab != 0 && declared_vocab != config.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model config: '", reader.Key("vocab_size"), "' is ", declared_vocab,
        " but token_embd.weight has ", config.vocab_size, " rows"));
  }
  if (tokenizer_tokens > config.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model config: tokenizer.ggml.tokens has ", tokenizer_tokens,
        " tokens, more than the vocabulary size ", config.vocab_size));
  }

  return absl::OkStatus();
}

// Soft-capping of attention scores and final logits (Gemma 2), any architecture that has it.
absl::Status ReadSoftcaps(const ConfigReader& reader, ModelConfig& config) {
  for (auto [suffix, cap] : {std::pair{"attn_logit_softcapping", &config.attn_logit_softcap},
                             std::pair{"final_logit_softcapping", &config.final_logit_softcap}}) {
    double value = 0.0;
    LOOM_RETURN_IF_ERROR(reader.OptionalDouble(suffix, value));
    if (!std::isfinite(value) || value < 0.0) {
      return absl::InvalidArgumentError(
          absl::StrCat("model config: '", reader.Key(suffix), "' ", value, " is not >= 0"));
    }
    *cap = static_cast<float>(value);
  }
  return absl::OkStatus();
}

// gpt-oss's additions, in any architecture whose file has them: attention sinks, a bias on
// the attention output, biases on the router and every expert matrix (the tensors say so),
// and the clamped SwiGLU (ArchitectureRules::swiglu_limit; `loom.swiglu_limit` overrides).
absl::Status ReadSinksAndBiases(const GgufFile& gguf, ModelConfig& config) {
  const auto hidden = static_cast<uint64_t>(config.hidden_size);
  const auto heads = static_cast<uint64_t>(config.num_heads);
  const auto experts = static_cast<uint64_t>(config.num_experts);
  const auto ffn = static_cast<uint64_t>(config.intermediate_size);
  config.attention_sinks = gguf.FindTensor("blk.0.attn_sinks.weight") != nullptr;
  LOOM_RETURN_IF_ERROR(CheckTensorShape(gguf, "blk.0.attn_sinks.weight", {heads}));
  config.attention_output_bias = gguf.FindTensor("blk.0.attn_output.bias") != nullptr;
  LOOM_RETURN_IF_ERROR(CheckTensorShape(gguf, "blk.0.attn_output.bias", {hidden}));
  config.expert_bias = gguf.FindTensor("blk.0.ffn_gate_inp.bias") != nullptr;
  if (config.expert_bias) {
    if (config.num_experts == 0) {
      return absl::InvalidArgumentError(
          "model config: blk.0.ffn_gate_inp.bias (a router's bias) in a model without experts");
    }
    LOOM_RETURN_IF_ERROR(CheckTensorShape(gguf, "blk.0.ffn_gate_inp.bias", {experts}));
    for (const char* name : {"blk.0.ffn_gate_exps.bias", "blk.0.ffn_up_exps.bias"}) {
      LOOM_RETURN_IF_ERROR(CheckTensorShape(gguf, name, {ffn, experts}));
    }
    LOOM_RETURN_IF_ERROR(CheckTensorShape(gguf, "blk.0.ffn_down_exps.bias", {hidden, experts}));
  }
  double limit = FindArchitecture(config.architecture)->swiglu_limit;
  if (gguf.Find("loom.swiglu_limit") != nullptr) {
    LOOM_ASSIGN_OR_RETURN(limit, gguf.GetDouble("loom.swiglu_limit"));
  }
  if (!std::isfinite(limit) || limit < 0.0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model config: 'loom.swiglu_limit' ", limit, " is not >= 0"));
  }
  if (limit > 0.0 && config.num_experts == 0) {
    return absl::UnimplementedError(
        "model config: OpenAI's clamped SwiGLU in a dense FFN (Loom runs it in experts only)");
  }
  config.swiglu_limit = static_cast<float>(limit);
  return absl::OkStatus();
}

// Gemma's rules (ArchitectureRules::gemma): scaled embeddings, GELU, the query scale (a
// Hugging Face directory's query_pre_attn_scalar as `loom.attention.query_pre_attn_scalar`;
// in a GGUF, which has no key for it, llama.cpp's rule: the head dim, except hidden / heads
// for the 27B models, Gemma 3's 62 layers and Gemma 2's 46), and the local layers' RoPE base.
absl::Status ReadGemma(const GgufFile& gguf, ModelConfig& config) {
  const ArchitectureRules& rules = *FindArchitecture(config.architecture);
  config.local_rope_theta = rules.local_rope_theta;
  if (gguf.Find("loom.rope.local_freq_base") != nullptr) {
    LOOM_ASSIGN_OR_RETURN(config.local_rope_theta, gguf.GetDouble("loom.rope.local_freq_base"));
  }
  if (gguf.Find("loom.norm_weight_offset") != nullptr) {
    LOOM_ASSIGN_OR_RETURN(double offset, gguf.GetDouble("loom.norm_weight_offset"));
    config.norm_weight_offset = static_cast<float>(offset);
  }
  if (!rules.gemma) return absl::OkStatus();
  config.embedding_scale = static_cast<float>(std::sqrt(static_cast<double>(config.hidden_size)));
  config.gelu = true;
  const bool large = (config.architecture == "gemma3" && config.num_layers == 62) ||
                     (config.architecture == "gemma2" && config.num_layers == 46);
  double query_pre_attn_scalar =
      static_cast<double>(large ? config.hidden_size / config.num_heads : config.head_dim);
  if (gguf.Find("loom.attention.query_pre_attn_scalar") != nullptr) {
    LOOM_ASSIGN_OR_RETURN(query_pre_attn_scalar,
                          gguf.GetDouble("loom.attention.query_pre_attn_scalar"));
  }
  if (!std::isfinite(query_pre_attn_scalar) || query_pre_attn_scalar <= 0.0) {
    return absl::InvalidArgumentError(absl::StrCat("model config: query_pre_attn_scalar ",
                                                   query_pre_attn_scalar, " is not positive"));
  }
  config.attention_scale = 1.0 / std::sqrt(query_pre_attn_scalar);
  return absl::OkStatus();
}

// Granite's multipliers (<arch>.embedding_scale, residual_scale, attention.scale,
// logit_scale), any architecture whose file has them, as llama.cpp reads them: absent or 0
// (llama.cpp's "unset") keeps the value before.
absl::Status ReadMultipliers(const ConfigReader& reader, ModelConfig& config) {
  auto read = [&](absl::string_view suffix, double& value) -> absl::Status {
    double read_value = 0.0;
    LOOM_RETURN_IF_ERROR(reader.OptionalDouble(suffix, read_value));
    if (read_value == 0.0) return absl::OkStatus();
    LOOM_RETURN_IF_ERROR(CheckPositiveFinite(reader, suffix, read_value));
    value = read_value;
    return absl::OkStatus();
  };
  double embedding = config.embedding_scale, residual = 1.0, logit = 1.0;
  LOOM_RETURN_IF_ERROR(read("embedding_scale", embedding));
  LOOM_RETURN_IF_ERROR(read("residual_scale", residual));
  LOOM_RETURN_IF_ERROR(read("logit_scale", logit));
  LOOM_RETURN_IF_ERROR(read("attention.scale", config.attention_scale));
  config.embedding_scale = static_cast<float>(embedding);
  config.residual_scale = static_cast<float>(residual);
  config.logit_scale = static_cast<float>(logit);
  return absl::OkStatus();
}

// What the tensors reveal: a separate LM head, attention biases, QK-norm; layer count.
// <arch>.attention.sliding_window and its layer pattern (ModelConfig::sliding_layers).
absl::Status ReadSlidingWindow(const ConfigReader& reader, const GgufFile& gguf,
                               ModelConfig& config) {
  LOOM_RETURN_IF_ERROR(reader.OptionalInt("attention.sliding_window", config.sliding_window));
  LOOM_RETURN_IF_ERROR(
      CheckRange(reader, "attention.sliding_window", config.sliding_window, 0, kMaxContext));
  if (config.sliding_window == 0) return absl::OkStatus();
  config.sliding_layers.assign(static_cast<size_t>(config.num_layers), true);
  const std::string key = reader.Key("attention.sliding_window_pattern");
  const GgufValue* pattern = gguf.Find(key);
  const int64_t default_period = FindArchitecture(config.architecture)->default_sliding_period;
  if (pattern == nullptr && default_period > 0) {
    for (int64_t l = 0; l < config.num_layers; ++l) {
      config.sliding_layers[static_cast<size_t>(l)] = (l + 1) % default_period != 0;
    }
  }
  if (pattern == nullptr) return absl::OkStatus();
  if (absl::StatusOr<const GgufValue::Array*> flags = pattern->AsArray(); flags.ok()) {
    if (static_cast<int64_t>((*flags)->size()) != config.num_layers) {
      return absl::InvalidArgumentError(absl::StrCat("model config: '", key, "' has ",
                                                     (*flags)->size(), " entries for ",
                                                     config.num_layers, " layers"));
    }
    for (size_t l = 0; l < (*flags)->size(); ++l) {
      LOOM_ASSIGN_OR_RETURN(bool local, (**flags)[l].AsBool());
      config.sliding_layers[l] = local;
    }
    return absl::OkStatus();
  }
  LOOM_ASSIGN_OR_RETURN(int64_t period, gguf.GetInt(key));
  LOOM_RETURN_IF_ERROR(
      CheckRange(reader, "attention.sliding_window_pattern", period, 1, config.num_layers + 1));
  for (int64_t l = 0; l < config.num_layers; ++l) {
    config.sliding_layers[static_cast<size_t>(l)] = (l + 1) % period != 0;
  }
  return absl::OkStatus();
}

// The layers that apply RoPE (ModelConfig::rope_layers): `loom.rope.layers` (a Hugging Face
// directory's no_rope_layers), else the architecture's period of NoPE layers.
absl::Status ReadRopeLayers(const GgufFile& gguf, ModelConfig& config) {
  constexpr char kKey[] = "loom.rope.layers";
  const GgufValue* layers = gguf.Find(kKey);
  const ArchitectureRules& rules = *FindArchitecture(config.architecture);
  const int64_t period = rules.no_rope_period;
  if (layers == nullptr && rules.global_layers_unrotated && config.sliding_window > 0) {
    config.rope_layers = config.sliding_layers;  // only the local layers rotate
    return absl::OkStatus();
  }
  if (layers == nullptr) {
    if (period == 0) return absl::OkStatus();
    config.rope_layers.resize(static_cast<size_t>(config.num_layers));
    for (int64_t l = 0; l < config.num_layers; ++l) {
      config.rope_layers[static_cast<size_t>(l)] = (l + 1) % period != 0;
    }
    return absl::OkStatus();
  }
  LOOM_ASSIGN_OR_RETURN(const GgufValue::Array* flags, layers->AsArray());
  if (static_cast<int64_t>(flags->size()) != config.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("model config: '", kKey, "' has ", flags->size(),
                                                   " entries for ", config.num_layers, " layers"));
  }
  config.rope_layers.resize(flags->size());
  for (size_t l = 0; l < flags->size(); ++l) {
    LOOM_ASSIGN_OR_RETURN(bool rotates, (*flags)[l].AsBool());
    config.rope_layers[l] = rotates;
  }
  if (std::find(config.rope_layers.begin(), config.rope_layers.end(), false) ==
      config.rope_layers.end()) {
    config.rope_layers.clear();  // every layer rotates
  }
  return absl::OkStatus();
}

absl::Status ReadLayout(const ConfigReader& reader, const GgufFile& gguf, ModelConfig& config) {
  // Tensors that reveal the layout: a separate LM head, and qwen2's attention biases.
  const auto hidden = static_cast<uint64_t>(config.hidden_size);
  const auto vocab = static_cast<uint64_t>(config.vocab_size);
  // A query head is as wide as a key head, but under latent attention (a decompressed key).
  const auto q_rows = static_cast<uint64_t>(
      config.num_heads * (config.mla() ? config.mla_nope_dim + config.rope_dim : config.head_dim));
  const auto kv_rows = static_cast<uint64_t>(config.num_kv_heads * config.head_dim);
  config.tied_embeddings = gguf.FindTensor("output.weight") == nullptr;
  LOOM_RETURN_IF_ERROR(CheckTensorShape(gguf, "output.weight", {hidden, vocab}));
  config.attention_bias = gguf.FindTensor("blk.0.attn_q.bias") != nullptr;
  const GgufTensorInfo* q_norm = gguf.FindTensor("blk.0.attn_q_norm.weight");
  config.qk_norm = q_norm != nullptr;
  config.qk_norm_full = q_norm != nullptr && config.num_heads > 1 && !q_norm->shape.empty() &&
                        q_norm->shape[0] == q_rows;
  // gpt-oss's post_attention_norm is its FFN norm, not a norm of the attention output.
  config.post_norms = gguf.FindTensor("blk.0.post_attention_norm.weight") != nullptr &&
                      FindArchitecture(config.architecture)->gguf_ffn_norm != "post_attention_norm";
  // No norm before attention but ones after it: OLMo 2's layout (a model without either
  // fails where its weights load, naming the missing tensor).
  config.pre_norms = gguf.FindTensor("blk.0.attn_norm.weight") != nullptr || !config.post_norms;
  const auto head_dim = static_cast<uint64_t>(config.head_dim);
  LOOM_RETURN_IF_ERROR(CheckTensorShape(gguf, "blk.0.attn_q_norm.weight",
                                        {config.qk_norm_full ? q_rows : head_dim}));
  LOOM_RETURN_IF_ERROR(CheckTensorShape(gguf, "blk.0.attn_k_norm.weight",
                                        {config.qk_norm_full ? kv_rows : head_dim}));
  LOOM_RETURN_IF_ERROR(CheckTensorShape(gguf, "blk.0.attn_q.weight", {hidden, q_rows}));
  LOOM_RETURN_IF_ERROR(CheckTensorShape(gguf, "blk.0.attn_k.weight", {hidden, kv_rows}));
  LOOM_RETURN_IF_ERROR(CheckTensorShape(gguf, "blk.0.attn_v.weight", {hidden, kv_rows}));
  LOOM_RETURN_IF_ERROR(CheckTensorShape(gguf, "blk.0.attn_q.bias", {q_rows}));
  LOOM_RETURN_IF_ERROR(CheckTensorShape(gguf, "blk.0.attn_k.bias", {kv_rows}));
  LOOM_RETURN_IF_ERROR(CheckTensorShape(gguf, "blk.0.attn_v.bias", {kv_rows}));
  const auto ffn = static_cast<uint64_t>(config.DenseFfnWidth());
  // Phi-3 fuses gate and up into ffn_up (gate rows first) and Q, K, V into attn_qkv.
  const bool fused_gate_up = gguf.FindTensor("blk.0.ffn_gate.weight") == nullptr;
  LOOM_RETURN_IF_ERROR(
      CheckTensorShape(gguf, "blk.0.ffn_up.weight", {hidden, fused_gate_up ? 2 * ffn : ffn}));
  LOOM_RETURN_IF_ERROR(
      CheckTensorShape(gguf, "blk.0.attn_qkv.weight", {hidden, q_rows + 2 * kv_rows}));
  if (config.num_experts > 0) {
    const auto experts = static_cast<uint64_t>(config.num_experts);
    const auto expert_ffn = static_cast<uint64_t>(config.intermediate_size);
    LOOM_RETURN_IF_ERROR(CheckTensorShape(
        gguf, FirstExpertLayerTensor(config, "ffn_gate_inp.weight"), {hidden, experts}));
    LOOM_RETURN_IF_ERROR(CheckTensorShape(
        gguf, FirstExpertLayerTensor(config, "ffn_up_exps.weight"), {hidden, expert_ffn, experts}));
    LOOM_RETURN_IF_ERROR(CheckTensorShape(gguf,
                                          FirstExpertLayerTensor(config, "ffn_down_exps.weight"),
                                          {expert_ffn, hidden, experts}));
    // GLM-4.5's selection bias (DeepSeek's e_score_correction_bias).
    const std::string bias = FirstExpertLayerTensor(config, "exp_probs_b.bias");
    config.expert_selection_bias = gguf.FindTensor(bias) != nullptr;
    LOOM_RETURN_IF_ERROR(CheckTensorShape(gguf, bias, {experts}));
  }
  // A file with per-layer tensors must hold exactly block_count layers (the model's and any
  // multi-token-prediction ones), counted by the norm each layer has.
  const char* norm = config.pre_norms ? ".attn_norm.weight" : ".post_attention_norm.weight";
  if (gguf.FindTensor(absl::StrCat("blk.0", norm)) != nullptr) {
    const int64_t blocks = config.num_layers + config.nextn_layers;
    const std::string last = absl::StrCat("blk.", blocks - 1, norm);
    const std::string beyond = absl::StrCat("blk.", blocks, norm);
    if (gguf.FindTensor(last) == nullptr || gguf.FindTensor(beyond) != nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("model config: '", reader.Key("block_count"), "' is ", blocks,
                       " but the file's layer tensors do not match (", last,
                       gguf.FindTensor(last) == nullptr ? " missing" : " present", ", ", beyond,
                       gguf.FindTensor(beyond) == nullptr ? " absent)" : " present)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelConfig> ModelConfigFromGguf(const GgufFile& gguf) {
  ModelConfig config;
  LOOM_RETURN_IF_ERROR(ReadArchitecture(gguf, config));
  const ConfigReader reader(gguf, config.architecture);
  LOOM_RETURN_IF_ERROR(ReadShapes(reader, gguf, config));
  LOOM_RETURN_IF_ERROR(ReadNextnLayers(reader, config));
  const int64_t dense_ffn = config.intermediate_size;  // feed_forward_length
  LOOM_RETURN_IF_ERROR(ReadExperts(reader, config));
  LOOM_RETURN_IF_ERROR(ReadSharedExpert(reader, gguf, dense_ffn, config));
  LOOM_RETURN_IF_ERROR(ReadRope(reader, gguf, config));
  LOOM_RETURN_IF_ERROR(ReadRopeScaling(reader, gguf, config));
  LOOM_RETURN_IF_ERROR(ReadMlaScale(reader, gguf, config));
  LOOM_ASSIGN_OR_RETURN(config.sampling_defaults, SamplingDefaultsFromGguf(gguf));
  LOOM_RETURN_IF_ERROR(ReadVocabulary(reader, gguf, config));
  LOOM_RETURN_IF_ERROR(ReadLayout(reader, gguf, config));
  LOOM_RETURN_IF_ERROR(ReadSlidingWindow(reader, gguf, config));
  LOOM_RETURN_IF_ERROR(ReadRopeLayers(gguf, config));
  LOOM_RETURN_IF_ERROR(ReadGemma(gguf, config));
  LOOM_RETURN_IF_ERROR(ReadMultipliers(reader, config));
  LOOM_RETURN_IF_ERROR(ReadSoftcaps(reader, config));
  LOOM_RETURN_IF_ERROR(ReadSinksAndBiases(gguf, config));
  return config;
}

}  // namespace loom::common
