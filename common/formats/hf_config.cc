#include "common/formats/hf_config.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/formats/architecture.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace loom::common {
namespace {

using nlohmann::json;

// Reads fields of the config object with type checks; an absent or null field leaves
// the default.
class Fields {
 public:
  explicit Fields(const json& object) : object_(object) {}

  bool Has(const char* name) const {
    auto it = object_.find(name);
    return it != object_.end() && !it->is_null();
  }

  absl::StatusOr<int64_t> Int(const char* name, std::optional<int64_t> fallback) const {
    auto it = object_.find(name);
    if (it == object_.end() || it->is_null()) {
      if (fallback) return *fallback;
      return absl::InvalidArgumentError(
          absl::StrCat("config.json: required field '", name, "' is missing"));
    }
    if (!it->is_number_integer()) {
      return absl::InvalidArgumentError(
          absl::StrCat("config.json: '", name, "' is ", it->dump(), ", expected an integer"));
    }
    return it->get<int64_t>();
  }

  absl::StatusOr<double> Number(const char* name, double fallback) const {
    auto it = object_.find(name);
    if (it == object_.end() || it->is_null()) return fallback;
    if (!it->is_number()) {
      return absl::InvalidArgumentError(
          absl::StrCat("config.json: '", name, "' is ", it->dump(), ", expected a number"));
    }
    return it->get<double>();
  }

  absl::StatusOr<bool> Bool(const char* name, bool fallback) const {
    auto it = object_.find(name);
    if (it == object_.end() || it->is_null()) return fallback;
    if (!it->is_boolean()) {
      return absl::InvalidArgumentError(
          absl::StrCat("config.json: '", name, "' is ", it->dump(), ", expected true or false"));
    }
    return it->get<bool>();
  }

  absl::StatusOr<std::string> String(const char* name, std::string fallback) const {
    auto it = object_.find(name);
    if (it == object_.end() || it->is_null()) return fallback;
    if (!it->is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat("config.json: '", name, "' is ", it->dump(), ", expected a string"));
    }
    return it->get<std::string>();
  }

 private:
  const json& object_;
};

// YaRN's magnitude correction for a context stretched `scale` times (transformers'
// get_mscale).
double YarnMscale(double scale, double mscale) {
  return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

// rope_scaling "yarn" as transformers' `_compute_yarn_parameters` reads it: `factor` as
// given, the correction range over `original_max_position_embeddings` (else the model's
// max_position_embeddings), beta_fast/beta_slow defaulting to 32/1 when absent, null or 0,
// and the attention factor given, else mscale/mscale_all_dim's ratio (DeepSeek style),
// else 0.1 ln(factor) + 1.
absl::Status YarnToGguf(const Fields& fields, double factor, int64_t max_position_embeddings,
                        const std::string& arch, GgufMetadataBuilder& metadata) {
  if (!fields.Has("original_max_position_embeddings")) {
    metadata.Int(arch + ".rope.scaling.original_context_length", max_position_embeddings);
  }
  LOOM_ASSIGN_OR_RETURN(double beta_fast, fields.Number("beta_fast", 0.0));
  LOOM_ASSIGN_OR_RETURN(double beta_slow, fields.Number("beta_slow", 0.0));
  metadata.Float(arch + ".rope.scaling.yarn_beta_fast", beta_fast != 0.0 ? beta_fast : 32.0);
  metadata.Float(arch + ".rope.scaling.yarn_beta_slow", beta_slow != 0.0 ? beta_slow : 1.0);
  LOOM_ASSIGN_OR_RETURN(bool truncate, fields.Bool("truncate", true));
  metadata.Bool("loom.rope.scaling.yarn_truncate", truncate);
  LOOM_ASSIGN_OR_RETURN(double mscale, fields.Number("mscale", 0.0));
  LOOM_ASSIGN_OR_RETURN(double mscale_all_dim, fields.Number("mscale_all_dim", 0.0));
  double attention_factor = YarnMscale(factor, 1.0);
  if (mscale != 0.0 && mscale_all_dim != 0.0) {
    attention_factor = YarnMscale(factor, mscale) / YarnMscale(factor, mscale_all_dim);
  }
  if (fields.Has("attention_factor")) {
    LOOM_ASSIGN_OR_RETURN(attention_factor, fields.Number("attention_factor", 1.0));
  }
  if (!(attention_factor > 0.0) || !std::isfinite(attention_factor)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.json: rope_scaling yarn attention factor ", attention_factor, " is not positive"));
  }
  metadata.Float("loom.rope.scaling.attention_factor", attention_factor);
  // DeepSeek's attention (multi-head latent attention models only read it) scales the softmax
  // by YarnMscale(factor, mscale_all_dim)^2: llama.cpp's yarn_log_multiplier.
  if (mscale_all_dim != 0.0) {
    metadata.Float(arch + ".rope.scaling.yarn_log_multiplier", 0.1 * mscale_all_dim);
  }
  return absl::OkStatus();
}

// Phi-3's longrope: the long and short per-frequency factors (served as tensors), the
// pre-training context (rope_scaling's or config.json's original_max_position_embeddings)
// and, when given, the attention factor.
absl::Status LongRopeToGguf(const json& config, const json& scaling, const std::string& arch,
                            GgufMetadataBuilder& metadata, HfConfigInfo& info) {
  for (auto [key, out] : {std::pair{"long_factor", &info.rope_factors_long},
                          std::pair{"short_factor", &info.rope_factors_short}}) {
    auto list = scaling.find(key);
    if (list == scaling.end() || !list->is_array() || list->empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("config.json: rope_scaling longrope needs a '", key, "' list"));
    }
    for (const json& factor : *list) {
      if (!factor.is_number() || !(factor.get<double>() > 0.0)) {
        return absl::InvalidArgumentError(absl::StrCat("config.json: rope_scaling ", key, " holds ",
                                                       factor.dump(),
                                                       ", expected positive numbers"));
      }
      out->push_back(factor.get<float>());
    }
  }
  const Fields top(config), fields(scaling);
  LOOM_ASSIGN_OR_RETURN(int64_t original, top.Int("original_max_position_embeddings", 0));
  LOOM_ASSIGN_OR_RETURN(original, fields.Int("original_max_position_embeddings", original));
  if (original <= 0) {
    return absl::InvalidArgumentError(
        "config.json: rope_scaling longrope needs original_max_position_embeddings");
  }
  metadata.Int(arch + ".rope.scaling.original_context_length", original);
  if (fields.Has("attention_factor")) {
    LOOM_ASSIGN_OR_RETURN(double factor, fields.Number("attention_factor", 1.0));
    metadata.Float("loom.rope.scaling.attention_factor", factor);
  }
  return absl::OkStatus();
}

absl::Status RopeScalingToGguf(const json& config, const json& scaling, const std::string& arch,
                               int64_t max_position_embeddings, GgufMetadataBuilder& metadata,
                               HfConfigInfo& info) {
  if (scaling.is_null()) return absl::OkStatus();
  if (!scaling.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: 'rope_scaling' is ", scaling.dump(), ", expected an object"));
  }
  const Fields fields(scaling);
  // Older configs say "type", newer "rope_type".
  LOOM_ASSIGN_OR_RETURN(std::string type, fields.String("rope_type", ""));
  if (type.empty()) {
    LOOM_ASSIGN_OR_RETURN(type, fields.String("type", "default"));
  }
  if (type == "default") return absl::OkStatus();
  // Phi-3 configs say "longrope" (older ones "su"), with per-frequency factors and no factor.
  if (type == "longrope" || type == "su") {
    return LongRopeToGguf(config, scaling, arch, metadata, info);
  }
  if (type != "linear" && type != "llama3" && type != "yarn") {
    return absl::UnimplementedError(absl::StrCat("config.json: rope_scaling type '", type,
                                                 "' is not supported (supported: linear, "
                                                 "llama3, yarn, longrope)"));
  }
  metadata.String(arch + ".rope.scaling.type", type);
  LOOM_ASSIGN_OR_RETURN(double factor, fields.Number("factor", 0.0));
  if (!(factor > 0.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: rope_scaling '", type, "' needs a positive 'factor'"));
  }
  metadata.Float(arch + ".rope.scaling.factor", factor);
  if (fields.Has("original_max_position_embeddings")) {
    LOOM_ASSIGN_OR_RETURN(int64_t original, fields.Int("original_max_position_embeddings", 0));
    metadata.Int(arch + ".rope.scaling.original_context_length", original);
  }
  if (type == "llama3") {
    LOOM_ASSIGN_OR_RETURN(double low, fields.Number("low_freq_factor", 1.0));
    LOOM_ASSIGN_OR_RETURN(double high, fields.Number("high_freq_factor", 4.0));
    metadata.Float(arch + ".rope.scaling.low_freq_factor", low);
    metadata.Float(arch + ".rope.scaling.high_freq_factor", high);
  }
  if (type == "yarn") {
    LOOM_RETURN_IF_ERROR(YarnToGguf(fields, factor, max_position_embeddings, arch, metadata));
  }
  return absl::OkStatus();
}

// config.json's one `architectures` entry, as the rules of the architecture it names.
absl::StatusOr<const ArchitectureRules*> ReadArchitecture(const json& config) {
  auto architectures = config.find("architectures");
  if (architectures == config.end() || !architectures->is_array() || architectures->size() != 1 ||
      !(*architectures)[0].is_string()) {
    return absl::InvalidArgumentError(
        "config.json: 'architectures' must list exactly one architecture name");
  }
  const std::string hf_arch = (*architectures)[0].get<std::string>();
  if (const ArchitectureRules* rules = FindHfArchitecture(hf_arch)) return rules;
  std::vector<std::string> known;
  for (const ArchitectureRules& rules : Architectures()) known.emplace_back(rules.hf_class_name);
  return absl::UnimplementedError(
      absl::StrCat("config.json: architecture '", hf_arch,
                   "' is not supported (supported: ", absl::StrJoin(known, ", "), ")"));
}

// Rejects what the graph does not run: another activation, MLP biases.
absl::Status CheckSupportedFeatures(const Fields& fields, const ArchitectureRules& rules) {
  // Gemma says hidden_activation (older configs hidden_act); its GELU is the tanh one.
  const char* expected = rules.gemma ? "gelu_pytorch_tanh" : "silu";
  const char* field =
      rules.gemma && fields.Has("hidden_activation") ? "hidden_activation" : "hidden_act";
  LOOM_ASSIGN_OR_RETURN(std::string activation, fields.String(field, expected));
  // Gemma 1's configs say hidden_act "gelu" without hidden_activation: transformers runs the
  // tanh approximation for it all the same.
  if (rules.gemma && std::string_view(field) == "hidden_act" && activation == "gelu") {
    activation = expected;
  }
  if (activation != expected) {
    return absl::UnimplementedError(absl::StrCat("config.json: ", field, " '", activation,
                                                 "' is not supported (only '", expected, "')"));
  }
  LOOM_ASSIGN_OR_RETURN(bool mlp_bias, fields.Bool("mlp_bias", false));
  if (mlp_bias) return absl::UnimplementedError("config.json: mlp_bias true is not supported");
  // ERNIE 4.5's biases on every projection (false in the released checkpoints).
  LOOM_ASSIGN_OR_RETURN(bool use_bias, fields.Bool("use_bias", false));
  if (use_bias) return absl::UnimplementedError("config.json: use_bias true is not supported");
  // OLMo's option to clamp q, k and v (null in the released OLMo 2 and OLMoE checkpoints).
  if (fields.Has("clip_qkv")) {
    return absl::UnimplementedError("config.json: clip_qkv is not supported");
  }
  return absl::OkStatus();
}

// Gemma's facts as loom.* keys: the query scale, the local layers' RoPE base, RMSNorm
// weights stored as w for a scale of 1 + w.
absl::Status GemmaToGguf(const Fields& fields, GgufMetadataBuilder& metadata) {
  if (fields.Has("query_pre_attn_scalar")) {
    LOOM_ASSIGN_OR_RETURN(double scalar, fields.Number("query_pre_attn_scalar", 0.0));
    metadata.Float("loom.attention.query_pre_attn_scalar", scalar);
  }
  if (fields.Has("rope_local_base_freq")) {
    LOOM_ASSIGN_OR_RETURN(double base, fields.Number("rope_local_base_freq", 0.0));
    metadata.Float("loom.rope.local_freq_base", base);
  }
  metadata.Float("loom.norm_weight_offset", 1.0);
  return absl::OkStatus();
}

// Positive scalars as llama.cpp's keys (<arch>.<key>): Gemma 2's soft-capping of scores
// and logits, Granite's multipliers of the embeddings, sub-layer outputs, attention scores
// and (dividing) the logits.
absl::Status ScalarsToGguf(const Fields& fields, const ArchitectureRules& rules,
                           GgufMetadataBuilder& metadata) {
  for (auto [field, key] : {std::pair{"attn_logit_softcapping", "attn_logit_softcapping"},
                            std::pair{"final_logit_softcapping", "final_logit_softcapping"},
                            std::pair{"embedding_multiplier", "embedding_scale"},
                            std::pair{"residual_multiplier", "residual_scale"},
                            std::pair{"attention_multiplier", "attention.scale"},
                            std::pair{"logits_scaling", "logit_scale"}}) {
    if (!fields.Has(field)) continue;
    LOOM_ASSIGN_OR_RETURN(double value, fields.Number(field, 0.0));
    if (!(value > 0.0) || !std::isfinite(value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("config.json: ", field, " ", value, " must be positive or null"));
    }
    metadata.Float(std::string(rules.gguf_name) + "." + key, value);
  }
  // gpt-oss's clamped SwiGLU (ArchitectureRules::swiglu_limit, which a config may change).
  if (fields.Has("swiglu_limit")) {
    LOOM_ASSIGN_OR_RETURN(double limit, fields.Number("swiglu_limit", 0.0));
    metadata.Float("loom.swiglu_limit", limit);
  }
  return absl::OkStatus();
}

// Sliding windows as <arch>.attention.sliding_window and a bool per layer in
// <arch>.attention.sliding_window_pattern (what llama.cpp reads): every layer for Mistral;
// for the others the layers `layer_types` calls "sliding_attention", else with
// `use_sliding_window` those from `max_window_layers` on (transformers' Qwen2 rule).
absl::Status SlidingWindowToGguf(const json& config, const Fields& fields,
                                 const ArchitectureRules& rules, int64_t layers,
                                 GgufMetadataBuilder& metadata) {
  LOOM_ASSIGN_OR_RETURN(int64_t window, fields.Int("sliding_window", 0));
  if (window < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: sliding_window ", window, " must be positive or null"));
  }
  std::vector<bool> local(static_cast<size_t>(layers),
                          rules.sliding_window_every_layer && window > 0);
  if (auto types = config.find("layer_types"); types != config.end() && types->is_array()) {
    if (static_cast<int64_t>(types->size()) != layers) {
      return absl::InvalidArgumentError(absl::StrCat("config.json: layer_types has ", types->size(),
                                                     " entries for ", layers, " layers"));
    }
    for (size_t l = 0; l < types->size(); ++l) {
      local[l] = (*types)[l].is_string() && (*types)[l].get<std::string>() == "sliding_attention";
    }
  } else if (auto letters = config.find("sliding_window_pattern");
             letters != config.end() && letters->is_string()) {
    // EXAONE 4's "LLLG": a letter per layer, repeated (L local, G global).
    const std::string pattern = letters->get<std::string>();
    if (pattern.empty() || pattern.find_first_not_of("LG") != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("config.json: sliding_window_pattern '",
                                                     pattern, "' must be letters L and G"));
    }
    for (int64_t l = 0; l < layers; ++l)
      local[static_cast<size_t>(l)] = window > 0 && pattern[l % pattern.size()] == 'L';
  } else if (rules.default_sliding_period > 0) {
    // Gemma 3: every sliding_window_pattern-th layer global (6 when absent).
    LOOM_ASSIGN_OR_RETURN(int64_t period,
                          fields.Int("sliding_window_pattern", rules.default_sliding_period));
    if (period < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("config.json: sliding_window_pattern ", period, " must be positive"));
    }
    for (int64_t l = 0; l < layers; ++l)
      local[static_cast<size_t>(l)] = window > 0 && (l + 1) % period != 0;
  } else if (!rules.sliding_window_every_layer) {
    LOOM_ASSIGN_OR_RETURN(bool use_sliding_window, fields.Bool("use_sliding_window", false));
    LOOM_ASSIGN_OR_RETURN(int64_t first, fields.Int("max_window_layers", layers));
    for (int64_t l = 0; l < layers; ++l)
      local[static_cast<size_t>(l)] = use_sliding_window && l >= first;
  }
  if (std::find(local.begin(), local.end(), true) == local.end()) return absl::OkStatus();
  if (window == 0) {
    return absl::InvalidArgumentError(
        "config.json: sliding-window layers without a sliding_window size");
  }
  const std::string arch(rules.gguf_name);
  metadata.Int(arch + ".attention.sliding_window", window);
  metadata.BoolArray(arch + ".attention.sliding_window_pattern", local);
  return absl::OkStatus();
}

// SmolLM3's NoPE layers as `loom.rope.layers` (a bool per layer: whether it applies RoPE):
// `no_rope_layers` (1 where a layer rotates), else every `no_rope_layer_interval`-th layer
// without; neither: the architecture's rule (ArchitectureRules::no_rope_period).
absl::Status RopeLayersToGguf(const json& config, const Fields& fields, int64_t layers,
                              GgufMetadataBuilder& metadata) {
  std::vector<bool> rotates(static_cast<size_t>(layers), true);
  if (auto list = config.find("no_rope_layers"); list != config.end() && !list->is_null()) {
    if (!list->is_array() || static_cast<int64_t>(list->size()) != layers) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config.json: no_rope_layers must list one 0 or 1 per layer (", layers, ")"));
    }
    for (size_t l = 0; l < list->size(); ++l) {
      const json& flag = (*list)[l];
      if (!flag.is_number_integer() || (flag.get<int64_t>() != 0 && flag.get<int64_t>() != 1)) {
        return absl::InvalidArgumentError(absl::StrCat("config.json: no_rope_layers[", l,
                                                       "] must be 0 or 1 (1: the layer rotates)"));
      }
      rotates[l] = flag.get<int64_t>() == 1;
    }
  } else if (fields.Has("no_rope_layer_interval")) {
    LOOM_ASSIGN_OR_RETURN(int64_t interval, fields.Int("no_rope_layer_interval", 0));
    if (interval < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("config.json: no_rope_layer_interval ", interval, " must be positive"));
    }
    for (int64_t l = 0; l < layers; ++l) rotates[static_cast<size_t>(l)] = (l + 1) % interval != 0;
  } else {
    return absl::OkStatus();
  }
  metadata.BoolArray("loom.rope.layers", rotates);
  return absl::OkStatus();
}

// GLM-4.5's routing as `<arch>.*` keys: the dense layers before the sparse ones
// (first_k_dense_replace), shared experts (n_shared_experts of moe_intermediate_size each,
// ungated), sigmoid scores (glm4moe's default; DeepSeek's scoring_func) and their scale
// (routed_scaling_factor); grouped routing: the best topk_group of n_group groups (unless
// DeepSeek-V2's topk_method says "greedy", which ignores the groups).
absl::Status GlmRoutingToGguf(const Fields& fields, const std::string& arch,
                              GgufMetadataBuilder& metadata) {
  LOOM_ASSIGN_OR_RETURN(int64_t dense, fields.Int("first_k_dense_replace", 0));
  if (dense > 0) metadata.Int(arch + ".leading_dense_block_count", dense);
  LOOM_ASSIGN_OR_RETURN(int64_t shared, fields.Int("n_shared_experts", 0));
  if (shared > 0) metadata.Int(arch + ".expert_shared_count", shared);
  LOOM_ASSIGN_OR_RETURN(double scale, fields.Number("routed_scaling_factor", 1.0));
  metadata.Float(arch + ".expert_weights_scale", scale);
  LOOM_ASSIGN_OR_RETURN(std::string scoring, fields.String("scoring_func", ""));
  if (scoring == "softmax" || scoring == "sigmoid") {
    metadata.Int(arch + ".expert_gating_func", scoring == "softmax" ? 1 : 2);
  } else if (!scoring.empty()) {
    return absl::UnimplementedError(
        absl::StrCat("config.json: scoring_func '", scoring, "' is not supported"));
  }
  LOOM_ASSIGN_OR_RETURN(int64_t groups, fields.Int("n_group", 1));
  LOOM_ASSIGN_OR_RETURN(std::string method, fields.String("topk_method", ""));
  if (groups > 1 && method != "greedy") {
    LOOM_ASSIGN_OR_RETURN(int64_t used, fields.Int("topk_group", std::nullopt));
    metadata.Int(arch + ".expert_group_count", groups);
    metadata.Int(arch + ".expert_group_used_count", used);
  }
  return absl::OkStatus();
}

// ERNIE 4.5's mixture of experts (moe_* fields) as llama.cpp's keys: experts in layers
// [moe_layer_start_index, moe_layer_end_index] every moe_layer_interval-th, which Loom runs
// when they are the layers from the start index on; its router always renormalizes.
absl::Status ErnieExpertsToGguf(const Fields& fields, int64_t layers, const std::string& arch,
                                GgufMetadataBuilder& metadata) {
  LOOM_ASSIGN_OR_RETURN(int64_t experts, fields.Int("moe_num_experts", std::nullopt));
  if (experts == 0) return absl::OkStatus();  // a dense model's config may say so
  LOOM_ASSIGN_OR_RETURN(int64_t used, fields.Int("moe_k", std::nullopt));
  LOOM_ASSIGN_OR_RETURN(int64_t width, fields.Int("moe_intermediate_size", std::nullopt));
  LOOM_ASSIGN_OR_RETURN(int64_t shared, fields.Int("moe_num_shared_experts", 0));
  LOOM_ASSIGN_OR_RETURN(int64_t start, fields.Int("moe_layer_start_index", 0));
  LOOM_ASSIGN_OR_RETURN(int64_t end, fields.Int("moe_layer_end_index", layers - 1));
  LOOM_ASSIGN_OR_RETURN(int64_t interval, fields.Int("moe_layer_interval", 1));
  if (interval != 1 || (end >= 0 && end < layers - 1)) {
    return absl::UnimplementedError(
        absl::StrCat("config.json: mixture-of-experts layers other than every layer from "
                     "moe_layer_start_index on (moe_layer_interval ",
                     interval, ", moe_layer_end_index ", end, ") are not supported"));
  }
  metadata.Int(arch + ".expert_count", experts);
  metadata.Int(arch + ".expert_used_count", used);
  metadata.Int(arch + ".expert_feed_forward_length", width);
  metadata.Bool(arch + ".expert_weights_norm", true);
  if (shared > 0) metadata.Int(arch + ".expert_shared_count", shared);
  if (start > 0) metadata.Int(arch + ".leading_dense_block_count", start);
  return absl::OkStatus();
}

// A mixture of experts as `<arch>.expert_*` keys: Mixtral's num_local_experts, Qwen3-MoE's
// num_experts and moe_intermediate_size, GLM-4.5's n_routed_experts; the chosen experts'
// weights renormalized as norm_topk_prob says (Transformers' default: false for Qwen3-MoE;
// Mixtral, which has no such field, always renormalizes). Dense layers between sparse ones
// are refused (but GLM-4.5's leading ones).
absl::Status ExpertsToGguf(const json& config, const Fields& fields, const std::string& arch,
                           GgufMetadataBuilder& metadata) {
  if (fields.Has("moe_num_experts")) {
    LOOM_ASSIGN_OR_RETURN(int64_t layers, fields.Int("num_hidden_layers", std::nullopt));
    return ErnieExpertsToGguf(fields, layers, arch, metadata);
  }
  LOOM_ASSIGN_OR_RETURN(int64_t experts, fields.Int("num_local_experts", 0));
  for (const char* name : {"num_experts", "n_routed_experts"}) {
    if (experts == 0) {
      LOOM_ASSIGN_OR_RETURN(experts, fields.Int(name, 0));
    }
  }
  if (experts == 0) return absl::OkStatus();
  metadata.Int(arch + ".expert_count", experts);
  LOOM_ASSIGN_OR_RETURN(int64_t used, fields.Int("num_experts_per_tok", std::nullopt));
  metadata.Int(arch + ".expert_used_count", used);
  if (fields.Has("moe_intermediate_size")) {
    LOOM_ASSIGN_OR_RETURN(int64_t width, fields.Int("moe_intermediate_size", 0));
    metadata.Int(arch + ".expert_feed_forward_length", width);
  }
  const bool mixtral = fields.Has("num_local_experts");
  LOOM_ASSIGN_OR_RETURN(bool normalize, fields.Bool("norm_topk_prob", mixtral));
  metadata.Bool(arch + ".expert_weights_norm", normalize);
  LOOM_ASSIGN_OR_RETURN(int64_t sparse_step, fields.Int("decoder_sparse_step", 1));
  auto dense = config.find("mlp_only_layers");
  if (sparse_step != 1 || (dense != config.end() && dense->is_array() && !dense->empty())) {
    return absl::UnimplementedError(
        "config.json: dense layers between mixture-of-experts layers (decoder_sparse_step, "
        "mlp_only_layers) are not supported");
  }
  // Qwen2-MoE's shared expert (mlp.shared_expert.*, scaled by mlp.shared_expert_gate);
  // GraniteMoeShared's (shared_mlp.*, ungated; 0: none).
  for (const char* name : {"shared_expert_intermediate_size", "shared_intermediate_size"}) {
    if (!fields.Has(name)) continue;
    LOOM_ASSIGN_OR_RETURN(int64_t width, fields.Int(name, 0));
    if (width > 0) metadata.Int(arch + ".expert_shared_feed_forward_length", width);
  }
  return GlmRoutingToGguf(fields, arch, metadata);
}

// DeepSeek-V2/V3's multi-head latent attention (ArchitectureRules::mla) as llama.cpp's keys:
// the latents' widths (q_lora_rank null: queries from the hidden state), a key's width
// (qk_nope_head_dim + qk_rope_head_dim, the latter rotating) and a value's.
absl::Status LatentAttentionToGguf(const Fields& fields, const std::string& arch,
                                   GgufMetadataBuilder& metadata) {
  LOOM_ASSIGN_OR_RETURN(int64_t kv_lora, fields.Int("kv_lora_rank", std::nullopt));
  metadata.Int(arch + ".attention.kv_lora_rank", kv_lora);
  LOOM_ASSIGN_OR_RETURN(int64_t q_lora, fields.Int("q_lora_rank", 0));
  if (q_lora > 0) metadata.Int(arch + ".attention.q_lora_rank", q_lora);
  LOOM_ASSIGN_OR_RETURN(int64_t nope, fields.Int("qk_nope_head_dim", std::nullopt));
  LOOM_ASSIGN_OR_RETURN(int64_t rope, fields.Int("qk_rope_head_dim", std::nullopt));
  LOOM_ASSIGN_OR_RETURN(int64_t value, fields.Int("v_head_dim", std::nullopt));
  metadata.Int(arch + ".attention.key_length", nope + rope);
  metadata.Int(arch + ".attention.value_length", value);
  metadata.Int(arch + ".rope.dimension_count", rope);
  return absl::OkStatus();
}

// The shapes, norm epsilon, RoPE base and scaling as `<arch>.*` keys.
absl::Status HyperParametersToGguf(const json& config, const Fields& fields,
                                   const ArchitectureRules& rules, GgufMetadataBuilder& metadata,
                                   HfConfigInfo& info) {
  const std::string arch(rules.gguf_name);
  LOOM_ASSIGN_OR_RETURN(int64_t hidden, fields.Int("hidden_size", std::nullopt));
  LOOM_ASSIGN_OR_RETURN(int64_t heads, fields.Int("num_attention_heads", std::nullopt));
  LOOM_ASSIGN_OR_RETURN(int64_t kv_heads, fields.Int("num_key_value_heads", heads));
  LOOM_ASSIGN_OR_RETURN(int64_t context, fields.Int("max_position_embeddings", std::nullopt));
  const int64_t max_position_embeddings = context;
  metadata.Int(arch + ".context_length", context);
  metadata.Int(arch + ".embedding_length", hidden);
  LOOM_ASSIGN_OR_RETURN(int64_t ffn, fields.Int("intermediate_size", std::nullopt));
  metadata.Int(arch + ".feed_forward_length", ffn);
  LOOM_ASSIGN_OR_RETURN(int64_t layers, fields.Int("num_hidden_layers", std::nullopt));
  metadata.Int(arch + ".block_count", layers);
  // GLM-4.5's multi-token-prediction layers follow the model's: their tensors are skipped.
  LOOM_ASSIGN_OR_RETURN(int64_t nextn, fields.Int("num_nextn_predict_layers", 0));
  if (nextn > 0) info.first_skipped_layer = layers;
  LOOM_RETURN_IF_ERROR(ExpertsToGguf(config, fields, arch, metadata));
  metadata.Int(arch + ".attention.head_count", heads);
  metadata.Int(arch + ".attention.head_count_kv", kv_heads);
  int64_t head_dim = heads > 0 ? hidden / heads : 0;
  if (rules.mla) {
    LOOM_RETURN_IF_ERROR(LatentAttentionToGguf(fields, arch, metadata));
  } else if (fields.Has("head_dim")) {
    LOOM_ASSIGN_OR_RETURN(head_dim, fields.Int("head_dim", 0));
    metadata.Int(arch + ".attention.key_length", head_dim);
    metadata.Int(arch + ".attention.value_length", head_dim);
  }
  // Partial rotary embedding (Phi-4-mini: 0.75 of each head rotates).
  LOOM_ASSIGN_OR_RETURN(double rotary, fields.Number("partial_rotary_factor", 1.0));
  if (!(rotary > 0.0 && rotary <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: partial_rotary_factor ", rotary, " is not in (0, 1]"));
  }
  if (rotary < 1.0) {
    metadata.Int(arch + ".rope.dimension_count",
                 static_cast<int64_t>(static_cast<double>(head_dim) * rotary));
  }
  LOOM_ASSIGN_OR_RETURN(double eps, fields.Number("rms_norm_eps", 1e-6));
  metadata.Float(arch + ".attention.layer_norm_rms_epsilon", eps);
  LOOM_ASSIGN_OR_RETURN(double theta, fields.Number("rope_theta", 10000.0));
  metadata.Float(arch + ".rope.freq_base", theta);
  if (fields.Has("vocab_size")) {
    LOOM_ASSIGN_OR_RETURN(int64_t vocab, fields.Int("vocab_size", 0));
    metadata.Int(arch + ".vocab_size", vocab);
  }
  if (auto scaling = config.find("rope_scaling"); scaling != config.end()) {
    LOOM_RETURN_IF_ERROR(
        RopeScalingToGguf(config, *scaling, arch, max_position_embeddings, metadata, info));
  }
  return absl::OkStatus();
}

// transformers' Gemma3TextConfig defaults: Gemma 3's multimodal config.json files leave
// most of their text_config at them (gemma-3-4b-it's names neither heads nor vocabulary).
constexpr const char* kGemma3TextDefaults = R"({
  "vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216,
  "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
  "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
  "max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
  "attention_bias": false, "query_pre_attn_scalar": 256, "sliding_window": 4096,
  "rope_local_base_freq": 10000.0, "sliding_window_pattern": 6})";

// The text model of a multimodal checkpoint (Gemma 3 4B-27B, Mistral Small 3.1, LLaVA; Qwen2-VL
// and Qwen2.5-VL below):
// (wrapper class, text model's model_type, its causal-LM class, defaults of its fields).
struct MultimodalWrapper {
  std::string_view wrapper, model_type, text_class;
  const char* defaults;
};
constexpr MultimodalWrapper kMultimodalWrappers[] = {
    {"Gemma3ForConditionalGeneration", "gemma3_text", "Gemma3ForCausalLM", kGemma3TextDefaults},
    {"Mistral3ForConditionalGeneration", "mistral", "MistralForCausalLM", nullptr},
    {"LlavaForConditionalGeneration", "mistral", "MistralForCausalLM", nullptr},
    {"LlavaForConditionalGeneration", "llama", "LlamaForCausalLM", nullptr},
};

// `object`'s member `key` when it is a string, else "" (config.json is untrusted: json's
// value() would throw on another type).
std::string StringMember(const json& object, const char* key) {
  auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// `base`'s members overwritten by `text_config`'s that are not null (a null field keeps the
// default, as transformers reads it).
void OverlayNonNull(const json& text_config, json& base) {
  for (const auto& [key, value] : text_config.items()) {
    if (!value.is_null()) base[key] = value;
  }
}

// Qwen2-VL's and Qwen2.5-VL's text model, a Qwen2, or Qwen3-VL's, a Qwen3 (`text_class`): its
// fields at the top level (Qwen2-VL and Qwen2.5-VL as released) or in text_config. M-RoPE
// (interleaved or not) rotates text-only positions, where the temporal, height and width
// indices are all the token's position, exactly as RoPE does, so its rope_scaling
// (mrope_section) is dropped.
json QwenVlTextConfig(const json& config, const char* text_class) {
  auto text = config.find("text_config");
  json merged = config;
  merged.erase("vision_config");
  merged.erase("text_config");
  if (text != config.end() && text->is_object()) OverlayNonNull(*text, merged);
  if (auto scaling = merged.find("rope_scaling"); scaling != merged.end() && scaling->is_object()) {
    if (StringMember(*scaling, "type") == "mrope" ||
        StringMember(*scaling, "rope_type") == "mrope" || scaling->contains("mrope_section")) {
      merged.erase("rope_scaling");
    }
  }
  merged["architectures"] = json::array({text_class});
  return merged;
}

// A multimodal config.json as its text model's (`text_config` over the text model's
// defaults, named by its causal-LM class, with the file's quantization_config and name), or
// nullopt for a text model's own config. Its vision tower is not served.
absl::StatusOr<std::optional<json>> TextConfigOfMultimodal(const json& config) {
  auto architectures = config.find("architectures");
  if (architectures == config.end() || !architectures->is_array() || architectures->size() != 1 ||
      !(*architectures)[0].is_string()) {
    return std::nullopt;  // ReadArchitecture says what is wrong
  }
  const std::string wrapper = (*architectures)[0].get<std::string>();
  if (wrapper == "Qwen2VLForConditionalGeneration" ||
      wrapper == "Qwen2_5_VLForConditionalGeneration") {
    return QwenVlTextConfig(config, "Qwen2ForCausalLM");
  }
  if (wrapper == "Qwen3VLForConditionalGeneration") {
    return QwenVlTextConfig(config, "Qwen3ForCausalLM");
  }
  if (wrapper == "Qwen3VLMoeForConditionalGeneration") {
    // Its router always renormalizes the chosen experts' weights (Qwen3VLMoeTextTopKRouter).
    json text = QwenVlTextConfig(config, "Qwen3MoeForCausalLM");
    text["norm_topk_prob"] = true;
    return text;
  }
  auto text = config.find("text_config");
  std::string model_type;
  if (text != config.end() && text->is_object()) model_type = StringMember(*text, "model_type");
  bool known_wrapper = false;
  for (const MultimodalWrapper& entry : kMultimodalWrappers) {
    if (entry.wrapper != wrapper) continue;
    known_wrapper = true;
    if (text == config.end() || !text->is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat("config.json: ", wrapper, " needs a text_config object"));
    }
    if (entry.model_type != model_type) continue;
    json merged = entry.defaults != nullptr ? json::parse(entry.defaults) : json::object();
    OverlayNonNull(*text, merged);
    merged["architectures"] = json::array({std::string(entry.text_class)});
    for (const char* key : {"quantization_config", "_name_or_path"}) {
      if (config.contains(key) && !merged.contains(key)) merged[key] = config[key];
    }
    return merged;
  }
  if (known_wrapper) {
    return absl::UnimplementedError(absl::StrCat("config.json: ", wrapper,
                                                 " with a text model of model_type '", model_type,
                                                 "' is not supported"));
  }
  return std::nullopt;
}

}  // namespace

absl::StatusOr<HfConfigInfo> HfConfigToGguf(const std::string& config_json,
                                            GgufMetadataBuilder& metadata) {
  json config = json::parse(config_json, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.is_object()) {
    return absl::InvalidArgumentError("config.json: not a JSON object");
  }
  LOOM_ASSIGN_OR_RETURN(std::optional<json> text_config, TextConfigOfMultimodal(config));
  const bool multimodal = text_config.has_value();
  if (multimodal) config = *std::move(text_config);
  const Fields fields(config);
  LOOM_ASSIGN_OR_RETURN(const ArchitectureRules* rules, ReadArchitecture(config));
  LOOM_RETURN_IF_ERROR(CheckSupportedFeatures(fields, *rules));
  HfConfigInfo info;
  info.architecture = std::string(rules->gguf_name);
  info.multimodal = multimodal;
  metadata.String("general.architecture", info.architecture);
  LOOM_ASSIGN_OR_RETURN(std::string name, fields.String("_name_or_path", ""));
  if (!name.empty()) metadata.String("general.name", name);
  LOOM_RETURN_IF_ERROR(HyperParametersToGguf(config, fields, *rules, metadata, info));
  LOOM_ASSIGN_OR_RETURN(info.quantization, ParseHfQuantization(config));
  LOOM_ASSIGN_OR_RETURN(int64_t layers, fields.Int("num_hidden_layers", std::nullopt));
  LOOM_RETURN_IF_ERROR(SlidingWindowToGguf(config, fields, *rules, layers, metadata));
  LOOM_RETURN_IF_ERROR(RopeLayersToGguf(config, fields, layers, metadata));
  // Gemma's configs leave tie_word_embeddings at its default, true.
  LOOM_ASSIGN_OR_RETURN(info.tie_word_embeddings, fields.Bool("tie_word_embeddings", rules->gemma));
  if (rules->gemma) LOOM_RETURN_IF_ERROR(GemmaToGguf(fields, metadata));
  // The layer norms named as Gemma and OLMo 2 name them.
  info.sandwich_norms = rules->hf_sandwich_norms;
  LOOM_RETURN_IF_ERROR(ScalarsToGguf(fields, *rules, metadata));
  // HF checkpoints keep q/k rows in the rotate-half order (the GGUF converter permutes
  // llama's to interleaved pairs): RoPE must rotate (i, i + d/2); GLM-4's modeling code
  // rotates interleaved pairs itself.
  metadata.Bool("loom.rope.neox", !rules->hf_rope_interleaved);
  return info;
}

}  // namespace loom::common
