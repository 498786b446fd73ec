#include "common/formats/hf_model.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/formats/architecture.h"
#include "common/formats/gguf_metadata_builder.h"
#include "common/formats/hf_config.h"
#include "common/formats/hf_gpt_oss_experts.h"
#include "common/formats/safetensors_file.h"
#include "common/sampling_defaults.h"
#include "common/status_macros.h"
#include "common/tokenizer/hf_tokenizer.h"
#include "nlohmann/json.hpp"

namespace loom::common {
namespace {

namespace fs = std::filesystem;

// HF per-layer suffix -> GGUF per-layer suffix.
constexpr std::pair<std::string_view, std::string_view> kLayerTensors[] = {
    {"input_layernorm.weight", "attn_norm.weight"},
    {"self_attn.q_proj.weight", "attn_q.weight"},
    {"self_attn.k_proj.weight", "attn_k.weight"},
    {"self_attn.v_proj.weight", "attn_v.weight"},
    {"self_attn.q_proj.bias", "attn_q.bias"},
    {"self_attn.k_proj.bias", "attn_k.bias"},
    {"self_attn.v_proj.bias", "attn_v.bias"},
    {"self_attn.o_proj.weight", "attn_output.weight"},
    // gpt-oss: the attention output's bias, the sinks, and the router with its bias.
    {"self_attn.o_proj.bias", "attn_output.bias"},
    {"self_attn.sinks", "attn_sinks.weight"},
    {"mlp.router.weight", "ffn_gate_inp.weight"},
    {"mlp.router.bias", "ffn_gate_inp.bias"},
    {"self_attn.q_norm.weight", "attn_q_norm.weight"},
    // DeepSeek-V2/V3's multi-head latent attention.
    {"self_attn.q_a_proj.weight", "attn_q_a.weight"},
    {"self_attn.q_a_layernorm.weight", "attn_q_a_norm.weight"},
    {"self_attn.q_b_proj.weight", "attn_q_b.weight"},
    {"self_attn.kv_a_proj_with_mqa.weight", "attn_kv_a_mqa.weight"},
    {"self_attn.kv_a_layernorm.weight", "attn_kv_a_norm.weight"},
    {"self_attn.kv_b_proj.weight", "attn_kv_b.weight"},
    {"self_attn.k_norm.weight", "attn_k_norm.weight"},
    {"post_attention_layernorm.weight", "ffn_norm.weight"},
    {"mlp.gate_proj.weight", "ffn_gate.weight"},
    {"mlp.up_proj.weight", "ffn_up.weight"},
    {"mlp.down_proj.weight", "ffn_down.weight"},
    // Phi-3: fused projections (gate rows first in gate_up_proj, as in GGUF's ffn_up).
    {"self_attn.qkv_proj.weight", "attn_qkv.weight"},
    {"mlp.gate_up_proj.weight", "ffn_up.weight"},
    // GLM-4: a norm after each sub-layer besides the ones before (post_attention_layernorm
    // is its pre-FFN norm, as above).
    {"post_self_attn_layernorm.weight", "post_attention_norm.weight"},
    {"post_mlp_layernorm.weight", "post_ffw_norm.weight"},
};

// Gemma's four norms per layer (input_layernorm as everywhere).
constexpr std::pair<std::string_view, std::string_view> kSandwichNorms[] = {
    {"post_attention_layernorm.weight", "post_attention_norm.weight"},
    {"pre_feedforward_layernorm.weight", "ffn_norm.weight"},
    {"post_feedforward_layernorm.weight", "post_ffw_norm.weight"},
};

// An expert's HF suffix (Mixtral's w1/w3/w2, Qwen3-MoE's MLP names) -> GGUF matrix name.
constexpr std::pair<std::string_view, std::string_view> kExpertTensors[] = {
    {"w1.weight", "ffn_gate"},    {"w3.weight", "ffn_up"},
    {"w2.weight", "ffn_down"},    {"gate_proj.weight", "ffn_gate"},
    {"up_proj.weight", "ffn_up"}, {"down_proj.weight", "ffn_down"},
};

// "model.layers.N.REST": N in `layer` and REST in `rest`; false for any other name.
bool SplitLayerName(absl::string_view name, uint32_t& layer, absl::string_view& rest) {
  if (!absl::ConsumePrefix(&name, "model.layers.")) return false;
  const size_t dot = name.find('.');
  if (dot == absl::string_view::npos || !absl::SimpleAtoi(name.substr(0, dot), &layer)) {
    return false;
  }
  rest = name.substr(dot + 1);
  return true;
}

// One AWQ/GPTQ linear layer's packed tensors (prefix.qweight, .qzeros, .scales, .g_idx).
struct QuantizedParts {
  const SafetensorsTensorInfo* qweight = nullptr;
  const SafetensorsTensorInfo* qzeros = nullptr;
  const SafetensorsTensorInfo* scales = nullptr;
  absl::Span<const uint8_t> qweight_data, qzeros_data, scales_data, g_idx_data;
};

// Files `entry` under its layer in `parts` when it is one of a quantized layer's tensors.
bool AddQuantizedPart(const SafetensorsCheckpoint::Entry& entry,
                      std::map<std::string, QuantizedParts>& parts) {
  const std::string& name = entry.tensor->name;
  for (const char* suffix : {".qweight", ".qzeros", ".scales", ".g_idx"}) {
    if (!absl::EndsWith(name, suffix)) continue;
    QuantizedParts& layer = parts[name.substr(0, name.size() - std::strlen(suffix))];
    const absl::Span<const uint8_t> bytes = entry.file->TensorData(*entry.tensor);
    if (std::strcmp(suffix, ".qweight") == 0) {
      layer.qweight = entry.tensor;
      layer.qweight_data = bytes;
    } else if (std::strcmp(suffix, ".qzeros") == 0) {
      layer.qzeros = entry.tensor;
      layer.qzeros_data = bytes;
    } else if (std::strcmp(suffix, ".scales") == 0) {
      layer.scales = entry.tensor;
      layer.scales_data = bytes;
    } else {
      layer.g_idx_data = bytes;
    }
    return true;
  }
  return false;
}

// One FP8 linear layer: prefix.weight (F8_E4M3) and its prefix.weight_scale(_inv).
struct Fp8Parts {
  const SafetensorsTensorInfo* weight = nullptr;
  const SafetensorsTensorInfo* scale = nullptr;
  absl::Span<const uint8_t> weight_data, scale_data;
};

// Files `entry` under its layer in `parts` when it is an FP8 weight or one of its scales
// (an activation's input_scale is dropped: Loom multiplies in F32 on the CPU).
bool AddFp8Part(const SafetensorsCheckpoint::Entry& entry, std::map<std::string, Fp8Parts>& parts) {
  const std::string& name = entry.tensor->name;
  const absl::Span<const uint8_t> bytes = entry.file->TensorData(*entry.tensor);
  if (entry.tensor->dtype == SafetensorsDtype::kF8E4M3 && absl::EndsWith(name, ".weight")) {
    Fp8Parts& layer = parts[name.substr(0, name.size() - std::strlen(".weight"))];
    layer.weight = entry.tensor;
    layer.weight_data = bytes;
    return true;
  }
  for (const char* suffix : {".weight_scale_inv", ".weight_scale", ".input_scale"}) {
    if (!absl::EndsWith(name, suffix)) continue;
    Fp8Parts& layer = parts[name.substr(0, name.size() - std::strlen(suffix))];
    if (std::strcmp(suffix, ".input_scale") != 0) {
      layer.scale = entry.tensor;
      layer.scale_data = bytes;
    }
    return true;
  }
  return false;
}

// A file of the directory as text; "" when it does not exist.
absl::StatusOr<std::string> ReadOptional(const fs::path& path) {
  std::error_code error;
  if (!fs::exists(path, error)) return std::string();
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("cannot read '", path.string(), "'"));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

GgmlType GgmlTypeOf(SafetensorsDtype dtype) {
  switch (dtype) {
    case SafetensorsDtype::kF32:
      return GgmlType::kF32;
    case SafetensorsDtype::kF16:
      return GgmlType::kF16;
    case SafetensorsDtype::kBF16:
      return GgmlType::kBF16;
    case SafetensorsDtype::kI32:
      return GgmlType::kI32;
    case SafetensorsDtype::kF8E4M3:
    case SafetensorsDtype::kU8:
      return GgmlType::kI8;  // never served as such: FP8 and MXFP4 layers are converted
  }
  return GgmlType::kF32;
}

// Files `entry` under its layer in `parts` when it is one of a layer's stacked expert tensors
// (model.layers.L.mlp.experts.SUFFIX, no expert index: every expert in one tensor; gpt-oss's,
// Qwen3-VL-MoE's under model.language_model.layers), or one of GraniteMoe's fused ones
// (block_sparse_moe.input_linear / output_linear, shared_mlp.input_linear: filed under their
// full suffix).
bool AddStackedExpertPart(const SafetensorsCheckpoint::Entry& entry,
                          std::map<int64_t, GptOssExpertParts>& parts) {
  absl::string_view rest(entry.tensor->name);
  if (!absl::ConsumePrefix(&rest, "model.layers.") &&
      !absl::ConsumePrefix(&rest, "model.language_model.layers.")) {
    return false;
  }
  const size_t dot = rest.find('.');
  int64_t layer = 0;
  if (dot == absl::string_view::npos || !absl::SimpleAtoi(rest.substr(0, dot), &layer)) {
    return false;
  }
  rest.remove_prefix(dot + 1);
  for (const absl::string_view granite : kGraniteMoeExpertSuffixes) {
    if (rest == granite) {
      parts[layer][std::string(rest)] = {entry.file->TensorData(*entry.tensor), entry.tensor->shape,
                                         GgmlTypeOf(entry.tensor->dtype)};
      return true;
    }
  }
  if (!absl::ConsumePrefix(&rest, "mlp.experts.") || rest.empty() ||
      absl::ascii_isdigit(static_cast<unsigned char>(rest[0]))) {
    return false;
  }
  parts[layer][std::string(rest)] = {entry.file->TensorData(*entry.tensor), entry.tensor->shape,
                                     GgmlTypeOf(entry.tensor->dtype)};
  return true;
}

// The tensors the view makes rather than maps: Phi-3's longrope factors from config.json,
// AWQ/GPTQ layers in Loom's encoding, FP8 layers as F16 (errors name the layer).
absl::StatusOr<std::vector<OwnedTensor>> OwnedTensors(
    const HfConfigInfo& info, const std::map<std::string, QuantizedParts>& quantized,
    const std::map<std::string, Fp8Parts>& fp8,
    const std::map<int64_t, GptOssExpertParts>& stacked_experts) {
  std::vector<OwnedTensor> owned;
  for (const auto& [layer, parts] : stacked_experts) {
    LOOM_ASSIGN_OR_RETURN(std::vector<OwnedTensor> converted,
                          info.architecture == "gpt-oss" ? ConvertGptOssExperts(layer, parts)
                          : info.architecture == "granitemoe"
                              ? ConvertGraniteMoeExperts(layer, parts)
                              : ConvertConcatenatedExperts(layer, parts));
    for (OwnedTensor& tensor : converted) owned.push_back(std::move(tensor));
  }
  for (const auto& [name, factors] :
       {std::pair{"rope_factors_long.weight", &info.rope_factors_long},
        std::pair{"rope_factors_short.weight", &info.rope_factors_short}}) {
    if (factors->empty()) continue;
    std::vector<uint8_t> bytes(factors->size() * sizeof(float));
    std::memcpy(bytes.data(), factors->data(), bytes.size());
    owned.push_back({name, {factors->size()}, GgmlType::kF32, std::move(bytes)});
  }
  if (!quantized.empty() && info.quantization.method == HfQuantization::Method::kNone) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensors such as ", quantized.begin()->first,
                     ".qweight are quantized but config.json has no quantization_config"));
  }
  for (const auto& [prefix, parts] : quantized) {
    const std::string name = GgufTensorName(prefix + ".weight", info.sandwich_norms);
    if (name.empty() || parts.qweight == nullptr || parts.qzeros == nullptr ||
        parts.scales == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "quantized layer ", prefix,
          name.empty() ? " has no place in the graph" : " lacks qweight, qzeros or scales"));
    }
    const QuantizedLinearTensors packed{
        parts.qweight_data,   parts.qzeros_data,   parts.scales_data,  parts.g_idx_data,
        parts.qweight->shape, parts.qzeros->shape, parts.scales->shape};
    LOOM_ASSIGN_OR_RETURN(std::vector<OwnedTensor> converted,
                          ConvertQuantizedLinear(info.quantization, name, packed));
    for (OwnedTensor& tensor : converted) owned.push_back(std::move(tensor));
  }
  if (!fp8.empty() && info.quantization.method != HfQuantization::Method::kFp8) {
    return absl::InvalidArgumentError(absl::StrCat(
        fp8.begin()->first, " holds FP8 values but config.json's quantization_config is not FP8"));
  }
  for (const auto& [prefix, parts] : fp8) {
    if (parts.weight == nullptr) continue;  // an input_scale alone: activations, unused here
    const std::string name = GgufTensorName(prefix + ".weight", info.sandwich_norms);
    if (name.empty() || parts.scale == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("FP8 layer ", prefix,
                       name.empty() ? " has no place in the graph"
                                    : " has no weight_scale or weight_scale_inv"));
    }
    const Fp8LinearTensors tensors{parts.weight_data,
                                   parts.scale_data,
                                   parts.weight->shape,
                                   parts.scale->shape,
                                   GgmlTypeOf(parts.scale->dtype),
                                   info.quantization.fp8_block_rows,
                                   info.quantization.fp8_block_cols};
    LOOM_ASSIGN_OR_RETURN(OwnedTensor converted, DequantizeFp8Linear(name, tensors));
    owned.push_back(std::move(converted));
    LOOM_ASSIGN_OR_RETURN(std::optional<OwnedTensor> row_scales, Fp8RowScales(name, tensors));
    if (row_scales.has_value()) owned.push_back(*std::move(row_scales));
  }
  return owned;
}

}  // namespace

std::string GgufTensorName(std::string_view hf_name, bool sandwich_norms) {
  // A multimodal checkpoint's text model, under the text model's own names.
  std::string text_name;
  if (absl::string_view name(hf_name.data(), hf_name.size());
      absl::ConsumePrefix(&name, "language_model.")) {
    text_name = std::string(name);
  } else if (absl::ConsumePrefix(&name, "model.language_model.")) {
    text_name = absl::StrCat("model.", name);
  }
  if (!text_name.empty()) hf_name = text_name;
  if (hf_name == "model.embed_tokens.weight") return "token_embd.weight";
  if (hf_name == "model.norm.weight") return "output_norm.weight";
  if (hf_name == "lm_head.weight") return "output.weight";
  uint32_t layer = 0;
  absl::string_view rest;
  if (!SplitLayerName(absl::string_view(hf_name.data(), hf_name.size()), layer, rest)) return "";
  if (sandwich_norms) {
    for (const auto& [hf, gguf] : kSandwichNorms) {
      if (rest == absl::string_view(hf.data(), hf.size())) {
        return absl::StrCat("blk.", layer, ".", absl::string_view(gguf.data(), gguf.size()));
      }
    }
  }
  for (const auto& [hf, gguf] : kLayerTensors) {
    if (rest == absl::string_view(hf.data(), hf.size())) {
      return absl::StrCat("blk.", layer, ".", absl::string_view(gguf.data(), gguf.size()));
    }
  }
  // Mixture of experts: the router, and expert E's matrices under llama.cpp's per-expert
  // names (blk.L.ffn_gate.E.weight; the loader also reads the stacked *_exps tensors).
  if (rest == "block_sparse_moe.gate.weight" || rest == "mlp.gate.weight" ||
      rest == "block_sparse_moe.router.layer.weight") {
    return absl::StrCat("blk.", layer, ".ffn_gate_inp.weight");
  }
  // GLM-4.5's selection bias (DeepSeek's e_score_correction_bias), ERNIE 4.5's ([1, experts]).
  if (rest == "mlp.gate.e_score_correction_bias" ||
      rest == "mlp.moe_statics.e_score_correction_bias") {
    return absl::StrCat("blk.", layer, ".exp_probs_b.bias");
  }
  // Qwen2-MoE's shared expert and its gate; GLM-4.5's shared experts (one tensor for all).
  if (rest == "mlp.shared_expert_gate.weight") {
    return absl::StrCat("blk.", layer, ".ffn_gate_inp_shexp.weight");
  }
  // GraniteMoeShared's down projection (its input_linear is split on load).
  if (rest == "shared_mlp.output_linear.weight") {
    return absl::StrCat("blk.", layer, ".ffn_down_shexp.weight");
  }
  if (absl::ConsumePrefix(&rest, "mlp.shared_expert.") ||
      absl::ConsumePrefix(&rest, "mlp.shared_experts.")) {
    for (const auto& [hf, gguf] : kExpertTensors) {
      if (rest == absl::string_view(hf.data(), hf.size())) {
        return absl::StrCat("blk.", layer, ".", absl::string_view(gguf.data(), gguf.size()),
                            "_shexp.weight");
      }
    }
    return "";
  }
  if (!absl::ConsumePrefix(&rest, "block_sparse_moe.experts.") &&
      !absl::ConsumePrefix(&rest, "mlp.experts.")) {
    return "";
  }
  const size_t expert_dot = rest.find('.');
  uint32_t expert = 0;
  if (expert_dot == absl::string_view::npos ||
      !absl::SimpleAtoi(rest.substr(0, expert_dot), &expert)) {
    return "";
  }
  rest.remove_prefix(expert_dot + 1);
  for (const auto& [hf, gguf] : kExpertTensors) {
    if (rest == absl::string_view(hf.data(), hf.size())) {
      return absl::StrCat("blk.", layer, ".", absl::string_view(gguf.data(), gguf.size()), ".",
                          expert, ".weight");
    }
  }
  return "";
}

namespace {

// Whether `hf_name` is a tensor of decoder layer `first` or a later one (model.layers.L.*).
bool InLayersFrom(std::string_view hf_name, int64_t first) {
  uint32_t layer = 0;
  absl::string_view rest;
  return first >= 0 &&
         SplitLayerName(absl::string_view(hf_name.data(), hf_name.size()), layer, rest) &&
         layer >= first;
}

}  // namespace

bool IsVisionTensorName(std::string_view hf_name) {
  for (std::string_view prefix : {"vision_tower.", "multi_modal_projector.", "model.vision_tower.",
                                  "model.multi_modal_projector.", "visual.", "model.visual."}) {
    if (hf_name.substr(0, prefix.size()) == prefix) return true;
  }
  return false;
}

absl::StatusOr<std::unique_ptr<GgufFile>> OpenHfDirectory(const std::string& dir) {
  const fs::path root(dir);
  GgufMetadataBuilder metadata;
  LOOM_ASSIGN_OR_RETURN(std::string config_json, ReadOptional(root / "config.json"));
  if (config_json.empty()) {
    return absl::NotFoundError(absl::StrCat("'", dir,
                                            "' has no config.json (a Hugging Face "
                                            "model directory needs one)"));
  }
  absl::StatusOr<HfConfigInfo> info = HfConfigToGguf(config_json, metadata);
  if (!info.ok()) {
    return absl::Status(info.status().code(), absl::StrCat(dir, "/", info.status().message()));
  }

  HfTokenizerFiles tokenizer_files;
  LOOM_ASSIGN_OR_RETURN(tokenizer_files.tokenizer_json, ReadOptional(root / "tokenizer.json"));
  if (tokenizer_files.tokenizer_json.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "'", dir, "' has no tokenizer.json (Loom reads the fast-tokenizer file only)"));
  }
  LOOM_ASSIGN_OR_RETURN(tokenizer_files.tokenizer_config_json,
                        ReadOptional(root / "tokenizer_config.json"));
  LOOM_ASSIGN_OR_RETURN(tokenizer_files.generation_config_json,
                        ReadOptional(root / "generation_config.json"));
  LOOM_ASSIGN_OR_RETURN(tokenizer_files.chat_template_jinja,
                        ReadOptional(root / "chat_template.jinja"));
  if (tokenizer_files.chat_template_jinja.empty()) {
    // Multimodal exports keep the processor's template in chat_template.json.
    LOOM_ASSIGN_OR_RETURN(std::string chat_json, ReadOptional(root / "chat_template.json"));
    if (!chat_json.empty()) {
      const nlohmann::json chat = nlohmann::json::parse(chat_json, nullptr, false);
      if (chat.is_discarded() || !chat.is_object() || !chat.contains("chat_template") ||
          !chat["chat_template"].is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat(dir, "/chat_template.json: needs a 'chat_template' string"));
      }
      tokenizer_files.chat_template_jinja = chat["chat_template"].get<std::string>();
    }
  }
  if (absl::Status status = HfTokenizerToGguf(tokenizer_files, metadata); !status.ok()) {
    return absl::Status(status.code(), absl::StrCat(dir, "/", status.message()));
  }
  if (absl::Status status =
          GenerationConfigToGguf(tokenizer_files.generation_config_json, metadata);
      !status.ok()) {
    return absl::Status(status.code(), absl::StrCat(dir, "/", status.message()));
  }

  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsCheckpoint> checkpoint,
                        SafetensorsCheckpoint::Open(dir));
  std::vector<GgufTensorInfo> tensors;
  std::vector<absl::Span<const uint8_t>> data;
  // AWQ/GPTQ and FP8 layers: prefix -> its tensors, converted below.
  std::map<std::string, QuantizedParts> quantized;
  std::map<std::string, Fp8Parts> fp8;
  // Experts stacked into one tensor per layer (gpt-oss, Qwen3-VL-MoE).
  std::map<int64_t, GptOssExpertParts> stacked_experts;
  // gpt-oss's FFN norm (post_attention_layernorm) under the name its GGUFs give it.
  const std::string ffn_norm = absl::StrCat(
      ".", std::string(FindArchitecture(info->architecture)->gguf_ffn_norm), ".weight");
  for (const SafetensorsCheckpoint::Entry& entry : checkpoint->entries()) {
    const SafetensorsTensorInfo& tensor = *entry.tensor;
    if (absl::EndsWith(tensor.name, "rotary_emb.inv_freq")) continue;  // recomputed
    if (info->multimodal && IsVisionTensorName(tensor.name)) continue;  // the text model only
    if (InLayersFrom(tensor.name, info->first_skipped_layer)) continue;  // GLM-4.5's MTP layers
    if (absl::StartsWith(tensor.name, "model.mtp_")) continue;  // ERNIE 4.5's, not run either
    if (AddQuantizedPart(entry, quantized)) continue;
    if (AddFp8Part(entry, fp8)) continue;
    if (AddStackedExpertPart(entry, stacked_experts)) continue;
    // A tied LM head may still be saved; HF ignores it then, and so does Loom.
    if (info->tie_word_embeddings &&
        (tensor.name == "lm_head.weight" || tensor.name == "language_model.lm_head.weight")) {
      continue;
    }
    std::string name = GgufTensorName(tensor.name, info->sandwich_norms);
    if (absl::EndsWith(name, ".ffn_norm.weight")) {
      name = name.substr(0, name.size() - std::strlen(".ffn_norm.weight")) + ffn_norm;
    }
    if (name.empty()) {
      return absl::UnimplementedError(absl::StrCat(entry.file->path(), ": tensor '", tensor.name,
                                                   "' has no place in the ", info->architecture,
                                                   " graph"));
    }
    GgufTensorInfo gguf;
    gguf.name = std::move(name);
    gguf.shape.assign(tensor.shape.rbegin(), tensor.shape.rend());  // ggml order
    // ERNIE 4.5 keeps its selection bias as [1, experts]; llama.cpp's is [experts].
    if (absl::EndsWith(gguf.name, ".exp_probs_b.bias") && gguf.shape.size() == 2 &&
        gguf.shape[1] == 1) {
      gguf.shape.pop_back();
    }
    gguf.type = GgmlTypeOf(tensor.dtype);
    gguf.num_elements = tensor.num_bytes / SafetensorsDtypeSize(tensor.dtype);
    gguf.num_bytes = tensor.num_bytes;
    tensors.push_back(std::move(gguf));
    data.push_back(entry.file->TensorData(tensor));
  }
  if (!info->tie_word_embeddings &&
      std::none_of(tensors.begin(), tensors.end(),
                   [](const GgufTensorInfo& t) { return t.name == "output.weight"; })) {
    return absl::InvalidArgumentError(absl::StrCat(
        dir, ": config.json says tie_word_embeddings false but there is no lm_head.weight"));
  }
  absl::StatusOr<std::vector<OwnedTensor>> owned =
      OwnedTensors(*info, quantized, fp8, stacked_experts);
  if (!owned.ok()) {
    return absl::Status(owned.status().code(), absl::StrCat(dir, ": ", owned.status().message()));
  }
  // What the view's tensors point into: the mapped files and the tensors made here.
  struct Backing {
    std::unique_ptr<SafetensorsCheckpoint> checkpoint;
    std::vector<OwnedTensor> owned;
  };
  auto backing = std::make_shared<Backing>();
  backing->checkpoint = std::move(checkpoint);
  backing->owned = *std::move(owned);
  for (const OwnedTensor& tensor : backing->owned) {
    GgufTensorInfo gguf;
    gguf.name = tensor.name;
    gguf.shape = tensor.shape;
    gguf.type = tensor.type;
    gguf.num_elements = 1;
    for (uint64_t d : tensor.shape) gguf.num_elements *= d;
    gguf.num_bytes = tensor.bytes.size();
    tensors.push_back(std::move(gguf));
    data.emplace_back(tensor.bytes.data(), tensor.bytes.size());
  }
  return GgufFile::FromParts(std::move(metadata.entries()), std::move(tensors), std::move(data),
                             std::shared_ptr<const void>(backing, backing.get()));
}

namespace {
ModelLocator& Locator() {
  static ModelLocator* locator = new ModelLocator();
  return *locator;
}
}  // namespace

void SetModelLocator(ModelLocator locator) { Locator() = std::move(locator); }

absl::StatusOr<std::string> LocateModel(const std::string& model) {
  std::error_code error;
  if (fs::exists(model, error) || !Locator()) return model;
  return Locator()(model);
}

absl::StatusOr<std::unique_ptr<GgufFile>> OpenModelFile(const std::string& model) {
  LOOM_ASSIGN_OR_RETURN(const std::string path, LocateModel(model));
  std::error_code error;
  if (fs::is_directory(path, error)) return OpenHfDirectory(path);
  return GgufFile::Open(path);
}

}  // namespace loom::common
