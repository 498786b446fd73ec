// The mixture-of-experts part of a model's config (model_config.h): experts, routing, shared
// experts and the multi-token-prediction layers after the model's.

#include <string>

#include "absl/strings/str_cat.h"
#include "common/formats/architecture.h"
#include "common/formats/model_config_reader.h"
#include "common/status_macros.h"

namespace loom::common::model_config_internal {

absl::Status ReadRouting(const ConfigReader& reader, ModelConfig& config);

// Mixture of experts: how many experts, how many a token uses, their width, the dense
// layers before them.
absl::Status ReadExperts(const ConfigReader& reader, ModelConfig& config) {
  const int64_t dense_ffn = config.intermediate_size;  // feed_forward_length
  LOOM_RETURN_IF_ERROR(reader.OptionalInt("expert_count", config.num_experts));
  if (config.num_experts == 0) return absl::OkStatus();
  LOOM_RETURN_IF_ERROR(CheckRange(reader, "expert_count", config.num_experts, 2, kMaxExperts));
  LOOM_ASSIGN_OR_RETURN(config.num_experts_used, reader.RequiredInt("expert_used_count"));
  LOOM_RETURN_IF_ERROR(
      CheckRange(reader, "expert_used_count", config.num_experts_used, 1, config.num_experts));
  // Files without the keys follow llama.cpp's rules for their architecture.
  const ArchitectureRules& rules = *FindArchitecture(config.architecture);
  if (rules.expert_width_per_used) config.intermediate_size /= config.num_experts_used;
  config.expert_weights_norm = rules.expert_weights_norm;
  LOOM_RETURN_IF_ERROR(reader.OptionalInt("expert_feed_forward_length", config.intermediate_size));
  LOOM_RETURN_IF_ERROR(
      CheckRange(reader, "expert_feed_forward_length", config.intermediate_size, 1, kMaxDimension));
  LOOM_RETURN_IF_ERROR(reader.OptionalBool("expert_weights_norm", config.expert_weights_norm));
  // Dense layers before the sparse ones (GLM-4.5), as wide as feed_forward_length.
  LOOM_RETURN_IF_ERROR(
      reader.OptionalInt("leading_dense_block_count", config.leading_dense_layers));
  LOOM_RETURN_IF_ERROR(CheckRange(reader, "leading_dense_block_count", config.leading_dense_layers,
                                  0, config.num_layers - 1));
  if (config.leading_dense_layers > 0) config.dense_intermediate_size = dense_ffn;
  // Sparse layers every N-th layer (llama.cpp's interleave_moe_layer_step: Llama 4 Maverick's,
  // ERNIE 4.5-VL's) are not run.
  int64_t step = 1;
  LOOM_RETURN_IF_ERROR(reader.OptionalInt("interleave_moe_layer_step", step));
  if (step > 1) {
    return absl::UnimplementedError(
        absl::StrCat("model config: '", reader.Key("interleave_moe_layer_step"), "' is ", step,
                     " (mixture-of-experts layers between dense ones are not supported)"));
  }
  return ReadRouting(reader, config);
}

// How the router weighs experts: softmax or sigmoid scores, their scale, groups (DeepSeek's).
absl::Status ReadRouting(const ConfigReader& reader, ModelConfig& config) {
  // llama.cpp's enum: 0 none (the architecture's default), 1 softmax, 2 sigmoid.
  int64_t gating = 0;
  LOOM_RETURN_IF_ERROR(reader.OptionalInt("expert_gating_func", gating));
  if (gating < 0 || gating > 2) {
    return absl::UnimplementedError(absl::StrCat("model config: '",
                                                 reader.Key("expert_gating_func"), "' is ", gating,
                                                 " (supported: 1 softmax, 2 sigmoid)"));
  }
  config.expert_sigmoid =
      gating == 2 || (gating == 0 && FindArchitecture(config.architecture)->expert_sigmoid);
  double scale = 1.0;
  LOOM_RETURN_IF_ERROR(reader.OptionalDouble("expert_weights_scale", scale));
  LOOM_RETURN_IF_ERROR(CheckPositiveFinite(reader, "expert_weights_scale", scale));
  config.expert_weights_scale = static_cast<float>(scale);
  LOOM_RETURN_IF_ERROR(reader.OptionalInt("expert_group_count", config.expert_groups));
  if (config.expert_groups <= 1) {
    config.expert_groups = 1;  // 0: none
    return absl::OkStatus();
  }
  LOOM_RETURN_IF_ERROR(
      CheckRange(reader, "expert_group_count", config.expert_groups, 2, config.num_experts));
  if (config.num_experts % config.expert_groups != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model config: '", reader.Key("expert_group_count"), "' ", config.expert_groups,
        " does not divide the ", config.num_experts, " experts"));
  }
  LOOM_ASSIGN_OR_RETURN(config.expert_groups_used, reader.RequiredInt("expert_group_used_count"));
  LOOM_RETURN_IF_ERROR(CheckRange(reader, "expert_group_used_count", config.expert_groups_used, 1,
                                  config.expert_groups));
  if (config.num_experts_used >
      config.expert_groups_used * (config.num_experts / config.expert_groups)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model config: ", config.num_experts_used, " experts per token do not fit in '",
        reader.Key("expert_group_used_count"), "' ", config.expert_groups_used, " groups of ",
        config.num_experts / config.expert_groups));
  }
  return absl::OkStatus();
}

// Multi-token-prediction layers after the model's own (GLM-4.5): block_count counts them,
// the model does not run them.
absl::Status ReadNextnLayers(const ConfigReader& reader, ModelConfig& config) {
  LOOM_RETURN_IF_ERROR(reader.OptionalInt("nextn_predict_layers", config.nextn_layers));
  LOOM_RETURN_IF_ERROR(
      CheckRange(reader, "nextn_predict_layers", config.nextn_layers, 0, config.num_layers - 1));
  config.num_layers -= config.nextn_layers;
  return absl::OkStatus();
}

// The name of tensor `suffix` in the first layer with experts (after the dense ones).
std::string FirstExpertLayerTensor(const ModelConfig& config, absl::string_view suffix) {
  return absl::StrCat("blk.", config.leading_dense_layers, ".", suffix);
}

// A shared expert (Qwen2-MoE, GLM-4.5), when the file has its tensors: its width, and whether
// a sigmoid gate scales it. `dense_ffn` is feed_forward_length, its width without the key
// (Qwen2-MoE); <arch>.expert_shared_count experts' widths where the file counts them (GLM-4.5).
absl::Status ReadSharedExpert(const ConfigReader& reader, const GgufFile& gguf, int64_t dense_ffn,
                              ModelConfig& config) {
  const std::string up = FirstExpertLayerTensor(config, "ffn_up_shexp.weight");
  int64_t count = 0;
  LOOM_RETURN_IF_ERROR(reader.OptionalInt("expert_shared_count", count));
  if (gguf.FindTensor(up) == nullptr) {
    // A width without the tensors (in a file that has layer tensors) is a broken checkpoint.
    int64_t width = 0;
    LOOM_RETURN_IF_ERROR(reader.OptionalInt("expert_shared_feed_forward_length", width));
    if ((width != 0 || count != 0) && gguf.FindTensor("blk.0.attn_norm.weight") != nullptr) {
      const char* key = width != 0 ? "expert_shared_feed_forward_length" : "expert_shared_count";
      return absl::InvalidArgumentError(
          absl::StrCat("model config: '", reader.Key(key), "' is ", width != 0 ? width : count,
                       " but the file has no shared expert (", up, ")"));
    }
    return absl::OkStatus();
  }
  if (config.num_experts == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model config: ", up, " (a shared expert) in a model without experts"));
  }
  LOOM_RETURN_IF_ERROR(CheckRange(reader, "expert_shared_count", count, 0, kMaxExperts));
  int64_t width = count > 0 ? count * config.intermediate_size : dense_ffn;
  LOOM_RETURN_IF_ERROR(reader.OptionalInt("expert_shared_feed_forward_length", width));
  LOOM_RETURN_IF_ERROR(
      CheckRange(reader, "expert_shared_feed_forward_length", width, 1, kMaxDimension));
  config.shared_expert_intermediate_size = width;
  const auto hidden = static_cast<uint64_t>(config.hidden_size);
  const auto shared = static_cast<uint64_t>(width);
  for (const char* part : {"ffn_gate_shexp.weight", "ffn_up_shexp.weight"}) {
    const std::string name = FirstExpertLayerTensor(config, part);
    if (gguf.FindTensor(name) == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("model config: the shared expert has no ", name));
    }
    LOOM_RETURN_IF_ERROR(CheckTensorShape(gguf, name, {hidden, shared}));
  }
  LOOM_RETURN_IF_ERROR(CheckTensorShape(
      gguf, FirstExpertLayerTensor(config, "ffn_down_shexp.weight"), {shared, hidden}));
  // The gate: [hidden] as llama.cpp declares it, or the [1, hidden] matrix converters write.
  const GgufTensorInfo* gate =
      gguf.FindTensor(FirstExpertLayerTensor(config, "ffn_gate_inp_shexp.weight"));
  config.shared_expert_gated = gate != nullptr;
  if (gate != nullptr && gate->shape != std::vector<uint64_t>{hidden}) {
    LOOM_RETURN_IF_ERROR(CheckTensorShape(gguf, gate->name, {hidden, 1}));
  }
  return absl::OkStatus();
}

}  // namespace loom::common::model_config_internal
