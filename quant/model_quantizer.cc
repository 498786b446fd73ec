#include "quant/model_quantizer.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/formats/model_config.h"
#include "common/status_macros.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/quantize.h"
#include "kernels/cpu/thread_pool.h"
#include "model/quantized_gguf.h"
#include "quant/awq.h"
#include "worker/cpu_forward_pass.h"

namespace loom::quant {

using worker::AppendSequence;
using worker::CpuForwardPass;
using worker::CpuForwardPassOptions;
using worker::StepBatch;
namespace {

namespace cpu = kernels::cpu;
using common::GgmlType;

constexpr int64_t kCalibrationBlockSize = 16;
// Tokens per calibration step: large enough for the GEMM kernel to run at speed.
constexpr int64_t kCalibrationStepTokens = 2048;

const char* FormatName(QuantizeFormat format) {
  switch (format) {
    case QuantizeFormat::kF32:
      return "f32";
    case QuantizeFormat::kF16:
      return "f16";
    case QuantizeFormat::kBf16:
      return "bf16";
    case QuantizeFormat::kInt8:
      return "int8";
    case QuantizeFormat::kInt4:
      return "int4";
  }
  return "?";
}

bool IsInteger(QuantizeFormat format) {
  return format == QuantizeFormat::kInt8 || format == QuantizeFormat::kInt4;
}

cpu::WeightFormat WeightFormatOf(QuantizeFormat format) {
  return format == QuantizeFormat::kInt8 ? cpu::WeightFormat::kInt8 : cpu::WeightFormat::kInt4;
}

// Input statistics of the three linear groups AWQ scales in one layer.
struct LayerStats {
  ActivationStats qkv;
  ActivationStats gate_up;
  ActivationStats down;
};

// Runs the calibration sequences through the model and gathers every layer's inputs.
absl::StatusOr<std::vector<LayerStats>> Calibrate(
    const common::GgufFile& in, const common::ModelConfig& config,
    const std::vector<std::vector<int32_t>>& calibration, const QuantizerOptions& options) {
  int64_t total = 0, longest = 0;
  for (const std::vector<int32_t>& sequence : calibration) {
    if (sequence.empty()) return absl::InvalidArgumentError("empty calibration sequence");
    if (static_cast<int64_t>(sequence.size()) > config.context_length) {
      return absl::InvalidArgumentError(
          absl::StrFormat("calibration sequence of %d tokens exceeds the context length %d",
                          sequence.size(), config.context_length));
    }
    total += static_cast<int64_t>(sequence.size());
    longest = std::max<int64_t>(longest, static_cast<int64_t>(sequence.size()));
  }
  if (total == 0) return absl::InvalidArgumentError("AWQ needs calibration text");
  const int64_t sample_every =
      std::max<int64_t>(1, total / std::max<int64_t>(1, options.awq_max_samples));
  const int64_t blocks_per_sequence = (longest + kCalibrationBlockSize - 1) / kCalibrationBlockSize;
  const int64_t sequences_per_step = std::max<int64_t>(1, kCalibrationStepTokens / longest);

  CpuForwardPassOptions pass_options;
  pass_options.num_threads = options.num_threads;
  pass_options.block_size = kCalibrationBlockSize;
  pass_options.num_kv_blocks = blocks_per_sequence * sequences_per_step;
  pass_options.kv_dtype = cpu::KvDtype::kF32;
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<CpuForwardPass> forward_pass,
                        CpuForwardPass::Create(in, pass_options));

  std::vector<LayerStats> stats;
  stats.reserve(config.num_layers);
  for (int64_t l = 0; l < config.num_layers; ++l) {
    stats.push_back({ActivationStats(config.hidden_size, options.awq_max_samples, sample_every),
                     ActivationStats(config.hidden_size, options.awq_max_samples, sample_every),
                     // The down projection's input: a dense layer's FFN width (GLM-4.5's leading
                     // dense layers are wider than its experts, whose inputs are not observed).
                     ActivationStats(config.LayerHasExperts(l) ? config.intermediate_size
                                                               : config.DenseFfnWidth(),
                                     options.awq_max_samples, sample_every)});
  }
  forward_pass->SetActivationObserver(
      [&stats](int64_t layer, model::LinearInput input, const float* x, int64_t num_tokens) {
        switch (input) {
          case model::LinearInput::kQkv:
            stats[layer].qkv.Add(x, num_tokens);
            break;
          case model::LinearInput::kGateUp:
            stats[layer].gate_up.Add(x, num_tokens);
            break;
          case model::LinearInput::kDown:
            stats[layer].down.Add(x, num_tokens);
            break;
          case model::LinearInput::kAttnOutput:
            break;  // not scaled (see docs/quantization.md)
        }
      });
  std::vector<float> logits;
  for (size_t first = 0; first < calibration.size(); first += sequences_per_step) {
    StepBatch batch;
    const size_t end =
        std::min(calibration.size(), first + static_cast<size_t>(sequences_per_step));
    for (size_t s = first; s < end; ++s) {
      std::vector<int32_t> blocks(blocks_per_sequence);
      for (int64_t b = 0; b < blocks_per_sequence; ++b) {
        blocks[b] = static_cast<int32_t>((s - first) * blocks_per_sequence + b);
      }
      LOOM_RETURN_IF_ERROR(AppendSequence(batch, calibration[s], 0, blocks,
                                          static_cast<int32_t>(kCalibrationBlockSize),
                                          /*sample_last=*/false));
    }
    LOOM_RETURN_IF_ERROR(forward_pass->Step(batch, logits));
  }
  return stats;
}

// Float copies of one layer's linear weights and norms.
struct LayerFloats {
  std::map<std::string, std::vector<float>> matrices;  // name -> [rows, cols]
  std::map<std::string, std::pair<int64_t, int64_t>> shapes;
};

std::vector<float> Stack(const std::vector<const std::vector<float>*>& parts) {
  std::vector<float> out;
  for (const std::vector<float>* part : parts) out.insert(out.end(), part->begin(), part->end());
  return out;
}

}  // namespace

absl::StatusOr<int64_t> GroupSizeFor(QuantizeFormat format, int64_t requested, int64_t cols) {
  if (cols <= 0 || cols % 32 != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a matrix with %d columns cannot take Loom's integer formats (needs a multiple of 32)",
        cols));
  }
  if (requested == 0) {
    if (format == QuantizeFormat::kInt8) return cols;
    requested = 128;
  }
  if (requested < 32 || requested % 32 != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("group size %d must be a positive multiple of 32", requested));
  }
  if (cols % requested == 0) return requested;
  int64_t group = 32;
  while (group * 2 < requested && cols % (group * 2) == 0) group *= 2;
  return group;
}

namespace {

// The output's metadata: the input's verbatim, then what changed (the file type, and
// loom.quantization.* for Loom's integer formats).
void WriteQuantizationMetadata(const common::GgufFile& in, const QuantizerOptions& options,
                               bool awq, common::GgufWriter& out) {
  out.CopyMetadata(in);
  std::vector<std::string> stale;
  for (const auto& [key, value] : in.metadata()) {
    if (absl::StartsWith(key, "loom.quantization.")) stale.push_back(key);
  }
  for (const std::string& key : stale) out.Remove(key);
  if (options.format == QuantizeFormat::kF32) {
    out.SetUint32("general.file_type", 0);  // ggml's ALL_F32
  } else if (options.format == QuantizeFormat::kF16) {
    out.SetUint32("general.file_type", 1);  // MOSTLY_F16
  } else if (options.format == QuantizeFormat::kBf16) {
    out.SetUint32("general.file_type", 32);  // MOSTLY_BF16
  } else {
    // No ggml file type describes Loom's formats; loom.quantization.* does.
    out.Remove("general.file_type");
    out.SetUint32(model::kQuantizationVersionKey, model::kQuantizationVersion);
    out.SetString("loom.quantization.format", FormatName(options.format));
    out.SetUint32(
        "loom.quantization.group_size",
        static_cast<uint32_t>(options.group_size == 0 && options.format == QuantizeFormat::kInt4
                                  ? 128
                                  : options.group_size));
    out.SetString("loom.quantization.method", awq ? "awq" : "rtn");
    if (awq) {
      out.SetUint32("loom.quantization.awq.grid", static_cast<uint32_t>(options.awq_grid));
      out.SetBool("loom.quantization.awq.clip",
                  options.awq_clip && options.format == QuantizeFormat::kInt4);
      out.SetString("loom.quantization.calibration", options.calibration_description);
    }
  }
}

// The names of every layer's linear weights.
absl::flat_hash_set<std::string> LinearWeights(const common::ModelConfig& config) {
  absl::flat_hash_set<std::string> linear;
  for (int64_t l = 0; l < config.num_layers; ++l) {
    for (const char* part :
         {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"}) {
      linear.insert(absl::StrCat("blk.", l, ".", part, ".weight"));
    }
  }
  return linear;
}

// F32 / F16 / BF16: every matrix converted (rounded to nearest even), vectors kept.
absl::Status ConvertToFloat(const common::GgufFile& in, const QuantizerOptions& options,
                            std::map<std::string, int>& conversions, common::GgufWriter& out) {
  for (const common::GgufTensorInfo& tensor : in.tensors()) {
    // A Loom-encoded matrix is converted where its values tensor stood.
    std::string name = tensor.name;
    const auto loom = model::LoomMatrixOf(in, tensor.name);
    if (loom.has_value()) {
      if (!loom->second) continue;  // .scale / .min
      name = loom->first;
    }
    if (!loom.has_value() && tensor.shape.size() != 2) {
      LOOM_RETURN_IF_ERROR(
          out.AddTensorView(tensor.name, tensor.shape, tensor.type, in.TensorData(tensor)));
      continue;
    }
    int64_t rows = 0, cols = 0;
    LOOM_ASSIGN_OR_RETURN(std::vector<float> values, model::ReadMatrixF32(in, name, rows, cols));
    std::vector<uint8_t> bytes;
    GgmlType type = GgmlType::kF32;
    if (options.format == QuantizeFormat::kF32) {
      bytes.resize(values.size() * 4);
      std::memcpy(bytes.data(), values.data(), bytes.size());
    } else {
      const bool bf16 = options.format == QuantizeFormat::kBf16;
      type = bf16 ? GgmlType::kBF16 : GgmlType::kF16;
      bytes.resize(values.size() * 2);
      for (size_t i = 0; i < values.size(); ++i) {
        const uint16_t half = bf16 ? cpu::FloatToBf16(values[i]) : cpu::FloatToHalf(values[i]);
        std::memcpy(bytes.data() + 2 * i, &half, 2);
      }
    }
    conversions[absl::StrCat(loom.has_value()
                                 ? std::string("Loom")
                                 : common::RawGgmlTypeName(static_cast<uint32_t>(tensor.type)),
                             " -> ", common::RawGgmlTypeName(static_cast<uint32_t>(type)))]++;
    LOOM_RETURN_IF_ERROR(out.AddTensor(
        name, {static_cast<uint64_t>(cols), static_cast<uint64_t>(rows)}, type, std::move(bytes)));
  }
  return absl::OkStatus();
}

// AWQ on layer `l` (name prefix `p`): scales searched for Q/K/V, gate/up and down, folded
// into the RMSNorm weights (`rescaled_norms`) and up's rows, then INT4 clipping.
absl::Status ApplyAwq(const common::GgufFile& in, int64_t l, const std::string& p,
                      LayerFloats& layer, const LayerStats& layer_stats,
                      const QuantizerOptions& options, cpu::WeightFormat weight_format,
                      cpu::ThreadPool& pool, QuantizerReport& report,
                      absl::flat_hash_map<std::string, std::vector<float>>& rescaled_norms) {
  auto& q = layer.matrices[p + "attn_q.weight"];
  auto& k = layer.matrices[p + "attn_k.weight"];
  auto& v = layer.matrices[p + "attn_v.weight"];
  auto& gate = layer.matrices[p + "ffn_gate.weight"];
  auto& up = layer.matrices[p + "ffn_up.weight"];
  auto& down = layer.matrices[p + "ffn_down.weight"];
  const int64_t hidden = layer.shapes[p + "attn_q.weight"].second;
  const int64_t ffn = layer.shapes[p + "ffn_down.weight"].second;
  const std::string attn_norm_name = p + "attn_norm.weight";
  const std::string ffn_norm_name = p + "ffn_norm.weight";
  const common::GgufTensorInfo* attn_norm_tensor = in.FindTensor(attn_norm_name);
  const common::GgufTensorInfo* ffn_norm_tensor = in.FindTensor(ffn_norm_name);
  if (attn_norm_tensor == nullptr || ffn_norm_tensor == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layer ", l,
        " has no RMSNorm before attention and the FFN (OLMo 2 has none): AWQ folds "
        "its scales into them; quantize this model with round-to-nearest (--method rtn)"));
  }
  LOOM_ASSIGN_OR_RETURN(std::vector<float> attn_norm, in.DequantizeTensor(*attn_norm_tensor));
  LOOM_ASSIGN_OR_RETURN(std::vector<float> ffn_norm, in.DequantizeTensor(*ffn_norm_tensor));
  if (static_cast<int64_t>(attn_norm.size()) != hidden ||
      static_cast<int64_t>(ffn_norm.size()) != hidden) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer ", l, ": RMSNorm sizes differ from ", hidden));
  }
  AwqOptions awq_options;
  awq_options.format = weight_format;
  awq_options.grid = options.awq_grid;
  auto search = [&](const std::vector<float>& weight, int64_t cols, const ActivationStats& input,
                    const char* group) -> absl::StatusOr<AwqResult> {
    LOOM_ASSIGN_OR_RETURN(awq_options.group_size,
                          GroupSizeFor(options.format, options.group_size, cols));
    const int64_t rows = static_cast<int64_t>(weight.size()) / cols;
    LOOM_ASSIGN_OR_RETURN(AwqResult result,
                          SearchAwqScales(weight.data(), rows, cols, input, awq_options, pool));
    report.awq.push_back({l, group, result.alpha, result.error, result.rtn_error});
    return result;
  };
  // Q, K and V read the attention norm's output: one scale vector, folded into it.
  LOOM_ASSIGN_OR_RETURN(AwqResult qkv, search(Stack({&q, &k, &v}), hidden, layer_stats.qkv, "qkv"));
  for (auto* w : {&q, &k, &v}) {
    ScaleColumns(w->data(), static_cast<int64_t>(w->size()) / hidden, hidden, qkv.scales.data());
  }
  for (int64_t c = 0; c < hidden; ++c) attn_norm[c] /= qkv.scales[c];
  // Gate and up read the FFN norm's output.
  LOOM_ASSIGN_OR_RETURN(AwqResult gate_up,
                        search(Stack({&gate, &up}), hidden, layer_stats.gate_up, "gate_up"));
  for (auto* w : {&gate, &up}) {
    ScaleColumns(w->data(), static_cast<int64_t>(w->size()) / hidden, hidden,
                 gate_up.scales.data());
  }
  for (int64_t c = 0; c < hidden; ++c) ffn_norm[c] /= gate_up.scales[c];
  // Down reads SiLU(gate) * up: its channel j scales with up's row j.
  LOOM_ASSIGN_OR_RETURN(AwqResult down_result, search(down, ffn, layer_stats.down, "down"));
  ScaleColumns(down.data(), static_cast<int64_t>(down.size()) / ffn, ffn,
               down_result.scales.data());
  DivideRows(up.data(), ffn, hidden, down_result.scales.data());
  if (options.awq_clip && options.format == QuantizeFormat::kInt4) {
    // Clipping sees the weights and inputs as they now are (scaled), per matrix.
    auto clip = [&](std::vector<std::vector<float>*> weights, int64_t cols,
                    const ActivationStats& input, const std::vector<float>& scales,
                    size_t report_index) -> absl::Status {
      std::vector<float> x = input.samples();
      for (size_t i = 0; i < x.size(); ++i) x[i] /= scales[i % cols];
      LOOM_ASSIGN_OR_RETURN(int64_t group, GroupSizeFor(options.format, options.group_size, cols));
      for (std::vector<float>* w : weights) {
        LOOM_ASSIGN_OR_RETURN(ClipResult clipped,
                              ClipWeights(w->data(), static_cast<int64_t>(w->size()) / cols, cols,
                                          x.data(), input.num_samples(), group, options.awq_grid,
                                          options.awq_max_shrink, pool));
        report.awq[report_index].unclipped_error += clipped.unclipped_error;
        report.awq[report_index].clipped_error += clipped.error;
      }
      return absl::OkStatus();
    };
    const size_t first = report.awq.size() - 3;  // this layer's qkv, gate_up, down
    LOOM_RETURN_IF_ERROR(clip({&q, &k, &v}, hidden, layer_stats.qkv, qkv.scales, first));
    LOOM_RETURN_IF_ERROR(
        clip({&gate, &up}, hidden, layer_stats.gate_up, gate_up.scales, first + 1));
    LOOM_RETURN_IF_ERROR(clip({&down}, ffn, layer_stats.down, down_result.scales, first + 2));
  }
  rescaled_norms[attn_norm_name] = std::move(attn_norm);
  rescaled_norms[ffn_norm_name] = std::move(ffn_norm);
  return absl::OkStatus();
}

// The output's tensors in the input's order: quantized matrices where their (possibly
// Loom-encoded) originals stood, rescaled norms, everything else as it was.
absl::Status WriteTensors(
    const common::GgufFile& in, const absl::flat_hash_set<std::string>& linear,
    absl::flat_hash_map<std::string, cpu::QuantizedMatrix>& quantized,
    const absl::flat_hash_map<std::string, std::vector<float>>& rescaled_norms,
    common::GgufWriter& out) {
  // Tensors in the input's order (a Loom-encoded linear weight where its values were).
  for (const common::GgufTensorInfo& tensor : in.tensors()) {
    std::string name = tensor.name;
    if (const auto loom = model::LoomMatrixOf(in, tensor.name);
        loom.has_value() && linear.contains(loom->first)) {
      if (!loom->second) continue;  // .scale / .min
      name = loom->first;
    }
    if (auto it = quantized.find(name); it != quantized.end()) {
      LOOM_RETURN_IF_ERROR(model::AddQuantizedTensor(out, name, it->second));
      quantized.erase(it);  // frees the memory as it goes
      continue;
    }
    if (auto it = rescaled_norms.find(tensor.name); it != rescaled_norms.end()) {
      std::vector<uint8_t> bytes(it->second.size() * 4);
      std::memcpy(bytes.data(), it->second.data(), bytes.size());
      LOOM_RETURN_IF_ERROR(out.AddTensor(tensor.name, {static_cast<uint64_t>(it->second.size())},
                                         GgmlType::kF32, std::move(bytes)));
      continue;
    }
    LOOM_RETURN_IF_ERROR(
        out.AddTensorView(tensor.name, tensor.shape, tensor.type, in.TensorData(tensor)));
  }
  if (!quantized.empty()) {
    return absl::InternalError(absl::StrCat(quantized.size(), " quantized matrices (e.g. ",
                                            quantized.begin()->first,
                                            ") had no place in the file"));
  }
  return absl::OkStatus();
}

std::string ConversionLog(const std::map<std::string, int>& conversions) {
  std::string log;
  for (const auto& [what, count] : conversions)
    absl::StrAppendFormat(&log, "  %4d x %s\n", count, what);
  return log;
}

}  // namespace

absl::StatusOr<QuantizerReport> QuantizeModel(const common::GgufFile& in,
                                              const QuantizerOptions& options,
                                              const std::vector<std::vector<int32_t>>& calibration,
                                              common::GgufWriter& out) {
  LOOM_RETURN_IF_ERROR(model::CheckQuantizationVersion(in));
  LOOM_ASSIGN_OR_RETURN(common::ModelConfig config, common::ModelConfigFromGguf(in));
  if (config.num_experts > 0) {
    return absl::UnimplementedError(absl::StrCat(
        "loom quantize: mixture-of-experts models (", config.num_experts,
        " experts) are not supported; serve the file as it is (its experts load in their "
        "own formats)"));
  }
  const bool integer = IsInteger(options.format);
  const bool awq = options.method == QuantizeMethod::kAwq;
  if (awq && !integer) {
    return absl::InvalidArgumentError("AWQ applies to the int8 and int4 formats only");
  }
  if (options.group_size != 0) {
    LOOM_RETURN_IF_ERROR(
        GroupSizeFor(options.format, options.group_size, 32 * options.group_size).status());
  }
  QuantizerReport report;
  std::map<std::string, int> conversions;

  WriteQuantizationMetadata(in, options, awq, out);
  const absl::flat_hash_set<std::string> linear = LinearWeights(config);
  if (!integer) {
    LOOM_RETURN_IF_ERROR(ConvertToFloat(in, options, conversions, out));
    report.log = ConversionLog(conversions);
    return report;
  }

  std::vector<LayerStats> stats;
  if (awq) {
    LOOM_ASSIGN_OR_RETURN(stats, Calibrate(in, config, calibration, options));
  }
  cpu::ThreadPool pool(std::max(1, options.num_threads));
  const cpu::WeightFormat weight_format = WeightFormatOf(options.format);
  absl::flat_hash_map<std::string, cpu::QuantizedMatrix> quantized;
  absl::flat_hash_map<std::string, std::vector<float>> rescaled_norms;
  for (int64_t l = 0; l < config.num_layers; ++l) {
    const std::string p = absl::StrCat("blk.", l, ".");
    LayerFloats layer;
    for (const char* part :
         {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"}) {
      const std::string name = absl::StrCat(p, part, ".weight");
      int64_t rows = 0, cols = 0;
      LOOM_ASSIGN_OR_RETURN(layer.matrices[name], model::ReadMatrixF32(in, name, rows, cols));
      layer.shapes[name] = {rows, cols};
      const common::GgufTensorInfo* tensor = in.FindTensor(name);
      conversions[absl::StrCat(
          model::IsLoomQuantized(in, name) ? std::string("Loom")
                                    : common::RawGgmlTypeName(static_cast<uint32_t>(tensor->type)),
          " -> ", FormatName(options.format), " (", awq ? "awq" : "rtn", ")")]++;
    }
    if (awq) {
      LOOM_RETURN_IF_ERROR(ApplyAwq(in, l, p, layer, stats[l], options, weight_format, pool, report,
                                    rescaled_norms));
    }
    for (auto& [name, values] : layer.matrices) {
      const auto [rows, cols] = layer.shapes[name];
      LOOM_ASSIGN_OR_RETURN(int64_t group, GroupSizeFor(options.format, options.group_size, cols));
      LOOM_ASSIGN_OR_RETURN(quantized[name],
                            cpu::QuantizeRtn(values.data(), rows, cols, weight_format, group));
      conversions[absl::StrFormat("[%d, %d] -> %s g%d", rows, cols,
                                  options.format == QuantizeFormat::kInt8 ? "INT8" : "INT4",
                                  group)]++;
    }
  }

  LOOM_RETURN_IF_ERROR(WriteTensors(in, linear, quantized, rescaled_norms, out));
  report.log = ConversionLog(conversions);
  return report;
}

absl::StatusOr<std::unique_ptr<common::GgufFile>> QuantizeInMemory(const common::GgufFile& in,
                                                                   QuantizeFormat format) {
  QuantizerOptions options;
  options.format = format;
  common::GgufWriter writer;
  LOOM_RETURN_IF_ERROR(QuantizeModel(in, options, {}, writer).status());
  LOOM_ASSIGN_OR_RETURN(std::string image, writer.Serialize());
  return common::GgufFile::FromBytes(std::move(image));
}

}  // namespace loom::quant
