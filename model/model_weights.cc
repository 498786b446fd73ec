#include "model/model_weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/formats/architecture.h"
#include "common/formats/hf_quantization.h"
#include "common/status_macros.h"
#include "kernels/cpu/quantize.h"
#include "model/quantized_gguf.h"

namespace loom::model {
namespace {

using kernels::cpu::PackedWeight;

// Shapes in GGUF are ggml order: {cols (contiguous), rows}.
absl::Status CheckShape(const common::GgufTensorInfo& tensor, std::vector<uint64_t> want) {
  if (tensor.shape != want) {
    std::string got, expected;
    for (uint64_t d : tensor.shape) absl::StrAppend(&got, got.empty() ? "" : "x", d);
    for (uint64_t d : want) absl::StrAppend(&expected, expected.empty() ? "" : "x", d);
    return absl::InvalidArgumentError(absl::StrFormat(
        "tensor %s has shape [%s], the model config needs [%s]", tensor.name, got, expected));
  }
  return absl::OkStatus();
}

class Loader {
 public:
  Loader(const common::GgufFile& gguf, const kernels::cpu::PackOptions& pack)
      : gguf_(gguf), pack_(pack) {}

  // Whether matrix `name` is in the file, as a tensor or in Loom's own encoding.
  bool HasMatrix(const std::string& name) const {
    return gguf_.FindTensor(name) != nullptr || IsLoomQuantized(gguf_, name);
  }

  const common::GgufTensorInfo* Find(const std::string& name) const {
    return gguf_.FindTensor(name);
  }

  absl::StatusOr<const common::GgufTensorInfo*> Require(const std::string& name) const {
    const common::GgufTensorInfo* tensor = gguf_.FindTensor(name);
    if (tensor == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("model has no tensor ", name));
    }
    return tensor;
  }

  absl::StatusOr<std::vector<float>> Vector(const std::string& name, int64_t size) {
    LOOM_ASSIGN_OR_RETURN(const common::GgufTensorInfo* tensor, Require(name));
    LOOM_RETURN_IF_ERROR(CheckShape(*tensor, {static_cast<uint64_t>(size)}));
    return gguf_.DequantizeTensor(*tensor);
  }

  // A [count, rows, cols] F32 (or dequantized) stack of matrices (ggml shape {cols, rows,
  // count}), row-major.
  absl::StatusOr<std::vector<float>> Stack(const std::string& name, int64_t count, int64_t rows,
                                           int64_t cols) {
    LOOM_ASSIGN_OR_RETURN(const common::GgufTensorInfo* tensor, Require(name));
    LOOM_RETURN_IF_ERROR(CheckShape(
        *tensor,
        {static_cast<uint64_t>(cols), static_cast<uint64_t>(rows), static_cast<uint64_t>(count)}));
    return gguf_.DequantizeTensor(*tensor);
  }

  // A [rows, cols] F32 (or dequantized) tensor, row-major (ggml shape {cols, rows}).
  absl::StatusOr<std::vector<float>> Table(const std::string& name, int64_t rows, int64_t cols) {
    LOOM_ASSIGN_OR_RETURN(const common::GgufTensorInfo* tensor, Require(name));
    LOOM_RETURN_IF_ERROR(
        CheckShape(*tensor, {static_cast<uint64_t>(cols), static_cast<uint64_t>(rows)}));
    return gguf_.DequantizeTensor(*tensor);
  }

  // An RMSNorm weight, plus the config's offset (1 for Gemma read from Hugging Face).
  absl::StatusOr<std::vector<float>> Norm(const std::string& name, int64_t size, float offset) {
    LOOM_ASSIGN_OR_RETURN(std::vector<float> weight, Vector(name, size));
    if (offset != 0.0f) {
      for (float& w : weight) w += offset;
    }
    return weight;
  }

  absl::StatusOr<PackedWeight> Matrix(const std::string& name, int64_t rows, int64_t cols,
                                      int64_t matrix = -1) {
    return MatrixRows(name, rows, cols, {0, rows}, matrix);
  }

  // The bytes of a [rows, cols] matrix: tensor `name` itself, or with matrix >= 0 the
  // matrix-th of the stacked ones a 3-D tensor {cols, rows, count} holds (the experts of
  // a mixture of experts). Checks the shape.
  absl::StatusOr<std::pair<const common::GgufTensorInfo*, const uint8_t*>> MatrixData(
      const std::string& name, int64_t rows, int64_t cols, int64_t matrix) {
    LOOM_ASSIGN_OR_RETURN(const common::GgufTensorInfo* tensor, Require(name));
    const uint8_t* data = gguf_.TensorData(*tensor).data();
    if (matrix < 0) {
      LOOM_RETURN_IF_ERROR(
          CheckShape(*tensor, {static_cast<uint64_t>(cols), static_cast<uint64_t>(rows)}));
      return std::make_pair(tensor, data);
    }
    if (tensor->shape.size() != 3 || tensor->shape[2] <= static_cast<uint64_t>(matrix)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("tensor %s has no matrix %d (a stack of [%d, %d] matrices expected)",
                          name, matrix, rows, cols));
    }
    LOOM_RETURN_IF_ERROR(CheckShape(
        *tensor, {static_cast<uint64_t>(cols), static_cast<uint64_t>(rows), tensor->shape[2]}));
    LOOM_ASSIGN_OR_RETURN(uint64_t row_bytes, common::GgmlRowBytes(tensor->type, cols));
    return std::make_pair(tensor, data + matrix * rows * row_bytes);
  }

  // Rows [range.first, range.first + range.second) of a [rows, cols] matrix (see
  // MatrixData for `matrix`): a contiguous byte range of the file, so a tensor-parallel
  // rank reads only its part.
  absl::StatusOr<PackedWeight> MatrixRows(const std::string& name, int64_t rows, int64_t cols,
                                          std::pair<int64_t, int64_t> range, int64_t matrix = -1) {
    if (matrix < 0 && IsLoomQuantized(gguf_, name)) {
      LOOM_ASSIGN_OR_RETURN(kernels::cpu::QuantizedMatrix matrix,
                            ReadQuantizedRows(gguf_, name, rows, cols, range.first, range.second));
      return PackLoom(name, matrix);
    }
    LOOM_ASSIGN_OR_RETURN(auto tensor_data, MatrixData(name, rows, cols, matrix));
    const common::GgmlType type = tensor_data.first->type;
    LOOM_ASSIGN_OR_RETURN(uint64_t row_bytes, common::GgmlRowBytes(type, cols));
    LOOM_ASSIGN_OR_RETURN(
        PackedWeight packed,
        Pack(name, type, tensor_data.second + range.first * row_bytes, range.second, cols));
    if (matrix < 0) LOOM_RETURN_IF_ERROR(AttachFp8RowScales(name, rows, range, packed));
    return packed;
  }

  // Rows [range.first, range.first + range.second) of an FP8 checkpoint's row scales of matrix
  // `name` (its companion tensor, common/formats/hf_quantization.h) into `weight`; nothing where
  // the model has none.
  absl::Status AttachFp8RowScales(const std::string& name, int64_t rows,
                                  std::pair<int64_t, int64_t> range, PackedWeight& weight) {
    const std::string scales_name = name + std::string(common::kFp8RowScaleSuffix);
    const common::GgufTensorInfo* tensor = gguf_.FindTensor(scales_name);
    if (tensor == nullptr) return absl::OkStatus();
    if (tensor->type != common::GgmlType::kF32) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", scales_name, " must be F32"));
    }
    LOOM_RETURN_IF_ERROR(CheckShape(*tensor, {static_cast<uint64_t>(rows)}));
    weight.fp8_row_scales.resize(static_cast<size_t>(range.second));
    std::memcpy(weight.fp8_row_scales.data(),
                gguf_.TensorData(*tensor).data() + range.first * sizeof(float),
                weight.fp8_row_scales.size() * sizeof(float));
    return absl::OkStatus();
  }

  // Columns [range.first, range.first + range.second) of every row of a [rows, cols]
  // matrix (row-parallel layers). The range must fall on the type's quantization blocks.
  absl::StatusOr<PackedWeight> MatrixColumns(const std::string& name, int64_t rows, int64_t cols,
                                             std::pair<int64_t, int64_t> range,
                                             int64_t matrix = -1) {
    if (range.first == 0 && range.second == cols) return Matrix(name, rows, cols, matrix);
    if (matrix < 0 && IsLoomQuantized(gguf_, name)) {
      LOOM_ASSIGN_OR_RETURN(kernels::cpu::QuantizedMatrix matrix,
                            ReadQuantizedRows(gguf_, name, rows, cols, 0, rows));
      absl::StatusOr<kernels::cpu::QuantizedMatrix> slice =
          kernels::cpu::SliceColumns(matrix, range.first, range.second);
      if (!slice.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("tensor ", name,
                                                       " cannot be split for tensor parallelism: ",
                                                       slice.status().message()));
      }
      return PackLoom(name, *slice);
    }
    LOOM_ASSIGN_OR_RETURN(auto tensor_data, MatrixData(name, rows, cols, matrix));
    const common::GgufTensorInfo* tensor = tensor_data.first;
    LOOM_ASSIGN_OR_RETURN(common::GgmlTypeTraits traits,
                          common::GetGgmlTypeTraits(static_cast<uint32_t>(tensor->type)));
    if (range.first % traits.block_size != 0 || range.second % traits.block_size != 0) {
      // A cut through the file's blocks: the whole matrix packed (logged as the slice it
      // becomes, not as itself), then its columns cut (groups split with F32 scales, the
      // same values).
      absl::StatusOr<PackedWeight> slice =
          kernels::cpu::PackWeight(tensor->type, tensor_data.second, rows, cols, pack_);
      if (slice.ok()) slice = kernels::cpu::SliceColumns(*slice, range.first, range.second);
      if (!slice.ok()) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "tensor %s (%s, blocks of %d) cannot be split at columns [%d, %d) for tensor "
            "parallelism: %s",
            name, traits.name, traits.block_size, range.first, range.first + range.second,
            slice.status().message()));
      }
      conversions_[slice->source]++;
      if (matrix < 0) LOOM_RETURN_IF_ERROR(AttachFp8RowScales(name, rows, {0, rows}, *slice));
      return slice;
    }
    LOOM_ASSIGN_OR_RETURN(uint64_t row_bytes, common::GgmlRowBytes(tensor->type, cols));
    const uint64_t begin = range.first / traits.block_size * traits.type_size;
    const uint64_t bytes = range.second / traits.block_size * traits.type_size;
    std::vector<uint8_t> slice(bytes * rows);
    const uint8_t* data = tensor_data.second;
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(slice.data() + r * bytes, data + r * row_bytes + begin, bytes);
    }
    LOOM_ASSIGN_OR_RETURN(PackedWeight packed,
                          Pack(name, tensor->type, slice.data(), rows, range.second));
    if (matrix < 0) LOOM_RETURN_IF_ERROR(AttachFp8RowScales(name, rows, {0, rows}, packed));
    return packed;
  }

  // Several GGUF matrices (row ranges of them) stacked by rows into one backend matrix:
  // (name, rows of the whole matrix, (first row, row count)); `matrix` as in MatrixData,
  // for every part.
  absl::StatusOr<PackedWeight> Fused(
      const std::vector<std::tuple<std::string, int64_t, std::pair<int64_t, int64_t>>>& parts,
      int64_t cols, int64_t matrix = -1) {
    std::vector<PackedWeight> packed;
    for (const auto& [name, rows, range] : parts) {
      LOOM_ASSIGN_OR_RETURN(PackedWeight weight, MatrixRows(name, rows, cols, range, matrix));
      packed.push_back(std::move(weight));
    }
    std::vector<const PackedWeight*> pointers;
    for (const PackedWeight& weight : packed) pointers.push_back(&weight);
    absl::StatusOr<PackedWeight> fused = kernels::cpu::ConcatRows(pointers);
    if (fused.ok()) {
      // An FP8 checkpoint's row scales, where every part has them.
      fused->fp8_row_scales.clear();
      bool every = true;
      for (const PackedWeight& weight : packed) every = every && !weight.fp8_row_scales.empty();
      for (const PackedWeight& weight : packed) {
        if (!every) break;
        fused->fp8_row_scales.insert(fused->fp8_row_scales.end(), weight.fp8_row_scales.begin(),
                                     weight.fp8_row_scales.end());
      }
    }
    if (fused.ok() && packed.size() > 1) {
      // Integer parts of different formats (a Q6_K V beside Q4_K Q/K) were widened.
      for (const PackedWeight& weight : packed) {
        if (weight.format != fused->format || weight.group_size != fused->group_size) {
          conversions_[absl::StrFormat("mixed formats fused -> %s g%d%s (lossless)",
                                       kernels::cpu::WeightFormatName(fused->format),
                                       fused->group_size,
                                       fused->f32_scaled() ? ", F32 scales" : "")]++;
          break;
        }
      }
    }
    if (!fused.ok() && packed.size() > 1) {
      // Float parts beside others (an F16 V beside Q8_0 Q/K): F32 for the group.
      std::vector<float> values;
      for (const PackedWeight& weight : packed) {
        const size_t offset = values.size();
        values.resize(offset + weight.rows * cols);
        kernels::cpu::DequantizeRows(weight, 0, weight.rows, values.data() + offset);
      }
      conversions_[absl::StrCat("mixed formats fused -> F32 (", std::get<0>(parts[0]), ")")]++;
      return kernels::cpu::PackFromF32(values.data(), values.size() / cols, cols,
                                       kernels::cpu::WeightFormat::kF32, 0);
    }
    return fused;
  }

  absl::StatusOr<PackedWeight> Pack(const std::string& name, common::GgmlType type,
                                    const uint8_t* data, int64_t rows, int64_t cols) {
    absl::StatusOr<PackedWeight> packed = kernels::cpu::PackWeight(type, data, rows, cols, pack_);
    if (!packed.ok()) {
      return absl::Status(packed.status().code(),
                          absl::StrCat("tensor ", name, ": ", packed.status().message()));
    }
    conversions_[packed->source]++;
    return packed;
  }

  // A matrix in Loom's own INT8/INT4 encoding: packed without loss.
  absl::StatusOr<PackedWeight> PackLoom(const std::string& name,
                                        const kernels::cpu::QuantizedMatrix& matrix) {
    absl::StatusOr<PackedWeight> packed = kernels::cpu::PackQuantized(matrix);
    if (!packed.ok()) {
      return absl::Status(packed.status().code(),
                          absl::StrCat("tensor ", name, ": ", packed.status().message()));
    }
    conversions_[packed->source]++;
    return packed;
  }

  std::string Log() const {
    std::string log;
    for (const auto& [what, count] : conversions_) {
      absl::StrAppendFormat(&log, "  %4d x %s\n", count, what);
    }
    return log;
  }

 private:
  const common::GgufFile& gguf_;
  const kernels::cpu::PackOptions pack_;
  std::map<std::string, int> conversions_;
};

// A mixture-of-experts layer `p` ("blk.L."): the router (whole, on every rank) and each
// expert's gate/up and down, this rank's `ffn_range` of them like a dense layer's. Experts
// come stacked (llama.cpp's ffn_{gate,up,down}_exps, one 3-D tensor each) or one matrix
// per expert (ffn_gate.E.weight: older Mixtral files, and Hugging Face checkpoints).
absl::Status LoadExperts(Loader& loader, const common::ModelConfig& config, const std::string& p,
                         std::pair<int64_t, int64_t> ffn_range, bool rank0, LayerWeights& layer) {
  const int64_t hidden = config.hidden_size, ffn = config.intermediate_size;
  const int64_t experts = config.num_experts;
  LOOM_ASSIGN_OR_RETURN(layer.router, loader.Matrix(p + "ffn_gate_inp.weight", experts, hidden));
  if (config.expert_selection_bias) {
    LOOM_ASSIGN_OR_RETURN(layer.expert_selection_bias,
                          loader.Vector(p + "exp_probs_b.bias", experts));
  }
  if (config.expert_bias) {
    // gpt-oss: stacked biases, one row per expert ({width, experts} in ggml order).
    LOOM_ASSIGN_OR_RETURN(layer.router_bias, loader.Vector(p + "ffn_gate_inp.bias", experts));
    LOOM_ASSIGN_OR_RETURN(std::vector<float> gate,
                          loader.Table(p + "ffn_gate_exps.bias", experts, ffn));
    LOOM_ASSIGN_OR_RETURN(std::vector<float> up,
                          loader.Table(p + "ffn_up_exps.bias", experts, ffn));
    LOOM_ASSIGN_OR_RETURN(std::vector<float> down,
                          loader.Table(p + "ffn_down_exps.bias", experts, hidden));
    for (int64_t e = 0; e < experts; ++e) {
      std::vector<float>& gate_up = layer.expert_gate_up_bias.emplace_back();
      for (const std::vector<float>* part : {&gate, &up}) {
        const auto first = part->begin() + e * ffn + ffn_range.first;
        gate_up.insert(gate_up.end(), first, first + ffn_range.second);
      }
      layer.expert_down_bias.emplace_back(
          rank0 ? std::vector<float>(down.begin() + e * hidden, down.begin() + (e + 1) * hidden)
                : std::vector<float>());
    }
  }
  const bool stacked = loader.Find(p + "ffn_gate_exps.weight") != nullptr;
  for (int64_t e = 0; e < experts; ++e) {
    // (tensor name, matrix index within it) of matrix `what` of expert e.
    auto expert = [&](const char* what) {
      return stacked ? std::make_pair(absl::StrCat(p, what, "_exps.weight"), e)
                     : std::make_pair(absl::StrCat(p, what, ".", e, ".weight"), int64_t{-1});
    };
    const auto [gate, matrix] = expert("ffn_gate");
    LOOM_ASSIGN_OR_RETURN(
        PackedWeight gate_up,
        loader.Fused({{gate, ffn, ffn_range}, {expert("ffn_up").first, ffn, ffn_range}}, hidden,
                     matrix));
    LOOM_ASSIGN_OR_RETURN(PackedWeight down, loader.MatrixColumns(expert("ffn_down").first, hidden,
                                                                  ffn, ffn_range, matrix));
    layer.expert_gate_up.push_back(std::move(gate_up));
    layer.expert_down.push_back(std::move(down));
  }
  return absl::OkStatus();
}

// A mixture-of-experts layer's shared expert (Qwen2-MoE): a dense gated FFN into
// layer.gate_up / layer.down (this rank's `range` of its channels), and its sigmoid gate,
// whole on every rank: llama.cpp's [hidden] or a converter's [1, hidden], kept in F32.
absl::Status LoadSharedExpert(Loader& loader, const common::ModelConfig& config,
                              const std::string& p, std::pair<int64_t, int64_t> range,
                              LayerWeights& layer) {
  const int64_t hidden = config.hidden_size, width = config.shared_expert_intermediate_size;
  LOOM_ASSIGN_OR_RETURN(layer.gate_up, loader.Fused({{p + "ffn_gate_shexp.weight", width, range},
                                                     {p + "ffn_up_shexp.weight", width, range}},
                                                    hidden));
  LOOM_ASSIGN_OR_RETURN(layer.down,
                        loader.MatrixColumns(p + "ffn_down_shexp.weight", hidden, width, range));
  if (!config.shared_expert_gated) return absl::OkStatus();
  const std::string name = p + "ffn_gate_inp_shexp.weight";
  LOOM_ASSIGN_OR_RETURN(const common::GgufTensorInfo* tensor, loader.Require(name));
  LOOM_ASSIGN_OR_RETURN(std::vector<float> gate, tensor->shape.size() == 1
                                                     ? loader.Vector(name, hidden)
                                                     : loader.Table(name, 1, hidden));
  LOOM_ASSIGN_OR_RETURN(
      layer.shared_expert_gate,
      kernels::cpu::PackFromF32(gate.data(), 1, hidden, kernels::cpu::WeightFormat::kF32, 0));
  return absl::OkStatus();
}

}  // namespace

// Multi-head latent attention's weights of layer `p` ("blk.L.") for this rank's heads, in
// LayerWeights' absorbed layout: the rotary rows of each query head moved first, and each
// head's key and value decompressions (attn_kv_b, or attn_k_b and attn_v_b) as F32 matrices
// into and out of the latent space.
absl::Status LoadMlaAttention(Loader& loader, const common::ModelConfig& config,
                              const std::string& p, const ShardPlan& plan, float norm_offset,
                              LayerWeights& layer) {
  const int64_t hidden = config.hidden_size, rope = config.rope_dim;
  const int64_t nope = config.mla_nope_dim, qk = nope + rope, value_dim = config.mla_value_dim;
  const int64_t heads = config.num_heads, local = plan.num_heads;
  const int64_t latent = config.mla_kv_lora_rank, q_lora = config.mla_q_lora_rank;
  std::string q_name = p + "attn_q.weight";
  if (q_lora > 0) {
    LOOM_ASSIGN_OR_RETURN(layer.mla_q_a, loader.Matrix(p + "attn_q_a.weight", q_lora, hidden));
    LOOM_ASSIGN_OR_RETURN(layer.mla_q_a_norm,
                          loader.Norm(p + "attn_q_a_norm.weight", q_lora, norm_offset));
    q_name = p + "attn_q_b.weight";
  }
  std::vector<std::tuple<std::string, int64_t, std::pair<int64_t, int64_t>>> q_parts;
  for (int64_t h = plan.head0; h < plan.head0 + local; ++h) {
    q_parts.push_back({q_name, heads * qk, {h * qk + nope, rope}});
    q_parts.push_back({q_name, heads * qk, {h * qk, nope}});
  }
  LOOM_ASSIGN_OR_RETURN(layer.qkv, loader.Fused(q_parts, q_lora > 0 ? q_lora : hidden));
  LOOM_ASSIGN_OR_RETURN(layer.mla_kv_a,
                        loader.Matrix(p + "attn_kv_a_mqa.weight", latent + rope, hidden));
  LOOM_ASSIGN_OR_RETURN(layer.mla_kv_a_norm,
                        loader.Norm(p + "attn_kv_a_norm.weight", latent, norm_offset));

  // k_up[h] [latent, nope] = head h's key decompression transposed; v_up[h] [value, latent].
  std::vector<float> k_up(static_cast<size_t>(heads * latent * nope));
  std::vector<float> v_up(static_cast<size_t>(heads * value_dim * latent));
  if (loader.HasMatrix(p + "attn_kv_b.weight")) {
    // [heads * (nope + value_dim), latent]: each head's key rows, then its value rows.
    LOOM_ASSIGN_OR_RETURN(std::vector<float> kv_b,
                          loader.Table(p + "attn_kv_b.weight", heads * (nope + value_dim), latent));
    for (int64_t h = 0; h < heads; ++h) {
      const float* block = kv_b.data() + h * (nope + value_dim) * latent;
      for (int64_t j = 0; j < nope; ++j) {
        for (int64_t c = 0; c < latent; ++c)
          k_up[(h * latent + c) * nope + j] = block[j * latent + c];
      }
      std::copy_n(block + nope * latent, value_dim * latent, v_up.data() + h * value_dim * latent);
    }
  } else {
    // llama.cpp's split for its absorbed MLA: attn_k_b [heads, latent, nope] (k_up itself)
    // and attn_v_b [heads, value_dim, latent].
    LOOM_ASSIGN_OR_RETURN(k_up, loader.Stack(p + "attn_k_b.weight", heads, latent, nope));
    LOOM_ASSIGN_OR_RETURN(v_up, loader.Stack(p + "attn_v_b.weight", heads, value_dim, latent));
  }
  for (int64_t h = plan.head0; h < plan.head0 + local; ++h) {
    LOOM_ASSIGN_OR_RETURN(PackedWeight k,
                          kernels::cpu::PackFromF32(k_up.data() + h * latent * nope, latent, nope,
                                                    kernels::cpu::WeightFormat::kF32, 0));
    LOOM_ASSIGN_OR_RETURN(PackedWeight v,
                          kernels::cpu::PackFromF32(v_up.data() + h * value_dim * latent, value_dim,
                                                    latent, kernels::cpu::WeightFormat::kF32, 0));
    layer.mla_k_up.push_back(std::move(k));
    layer.mla_v_up.push_back(std::move(v));
  }
  LOOM_ASSIGN_OR_RETURN(layer.attn_output,
                        loader.MatrixColumns(p + "attn_output.weight", hidden, heads * value_dim,
                                             {plan.head0 * value_dim, local * value_dim}));
  return absl::OkStatus();
}

// Layer `p`'s ("blk.L.") attention weights for this rank's heads: Q/K/V fused (Phi-3's
// attn_qkv sliced), their biases, QK-norms, the output projection and its bias, the sinks;
// LoadMlaAttention's under latent attention.
absl::Status LoadAttention(Loader& loader, const common::ModelConfig& config, const std::string& p,
                           const ShardPlan& plan, LayerWeights& layer) {
  const int64_t hidden = config.hidden_size, hd = config.head_dim;
  const int64_t q_rows = config.num_heads * hd, kv_rows = config.num_kv_heads * hd;
  const std::pair<int64_t, int64_t> q_range{plan.head0 * hd, plan.num_heads * hd};
  const std::pair<int64_t, int64_t> kv_range{plan.kv_head0 * hd, plan.num_kv_heads * hd};
  const float norm_offset = config.norm_weight_offset;
  if (config.mla()) return LoadMlaAttention(loader, config, p, plan, norm_offset, layer);
  if (loader.HasMatrix(p + "attn_qkv.weight")) {
    // Phi-3: one [q + 2 kv, hidden] tensor; this rank's rows of each part.
    const std::string qkv = p + "attn_qkv.weight";
    const int64_t rows = q_rows + 2 * kv_rows;
    LOOM_ASSIGN_OR_RETURN(
        layer.qkv, loader.Fused({{qkv, rows, q_range},
                                 {qkv, rows, {q_rows + kv_range.first, kv_range.second}},
                                 {qkv, rows, {q_rows + kv_rows + kv_range.first, kv_range.second}}},
                                hidden));
  } else {
    LOOM_ASSIGN_OR_RETURN(layer.qkv, loader.Fused({{p + "attn_q.weight", q_rows, q_range},
                                                   {p + "attn_k.weight", kv_rows, kv_range},
                                                   {p + "attn_v.weight", kv_rows, kv_range}},
                                                  hidden));
  }
  if (loader.Find(p + "attn_q.bias") != nullptr) {
    for (const auto& [name, rows, range] :
         std::vector<std::tuple<std::string, int64_t, std::pair<int64_t, int64_t>>>{
             {p + "attn_q.bias", q_rows, q_range},
             {p + "attn_k.bias", kv_rows, kv_range},
             {p + "attn_v.bias", kv_rows, kv_range}}) {
      LOOM_ASSIGN_OR_RETURN(std::vector<float> bias, loader.Vector(name, rows));
      layer.qkv_bias.insert(layer.qkv_bias.end(), bias.begin() + range.first,
                            bias.begin() + range.first + range.second);
    }
  }
  if (config.qk_norm) {
    // Per head, or (OLMo) over all heads at once: whole on every rank (NormAllHeads).
    const int64_t q_norm = config.qk_norm_full ? q_rows : hd;
    const int64_t k_norm = config.qk_norm_full ? kv_rows : hd;
    LOOM_ASSIGN_OR_RETURN(layer.q_norm, loader.Norm(p + "attn_q_norm.weight", q_norm, norm_offset));
    LOOM_ASSIGN_OR_RETURN(layer.k_norm, loader.Norm(p + "attn_k_norm.weight", k_norm, norm_offset));
  }
  LOOM_ASSIGN_OR_RETURN(layer.attn_output,
                        loader.MatrixColumns(p + "attn_output.weight", hidden, q_rows, q_range));
  if (config.attention_output_bias && plan.rank == 0) {
    LOOM_ASSIGN_OR_RETURN(layer.attn_output_bias, loader.Vector(p + "attn_output.bias", hidden));
  }
  if (config.attention_sinks) {
    LOOM_ASSIGN_OR_RETURN(std::vector<float> sinks,
                          loader.Vector(p + "attn_sinks.weight", config.num_heads));
    layer.attn_sinks.assign(sinks.begin() + plan.head0,
                            sinks.begin() + plan.head0 + plan.num_heads);
  }
  return absl::OkStatus();
}

int64_t ModelWeights::BytesPerDecodeStep() const {
  int64_t bytes = lm_head().bytes();
  if (token_embedding.rows > 0) bytes += token_embedding.bytes() / token_embedding.rows;
  for (const LayerWeights& layer : layers) {
    bytes += layer.qkv.bytes() + layer.attn_output.bytes() + layer.gate_up.bytes() +
             layer.down.bytes() + layer.router.bytes() + layer.shared_expert_gate.bytes() +
             layer.mla_q_a.bytes() + layer.mla_kv_a.bytes();
    for (size_t h = 0; h < layer.mla_k_up.size(); ++h) {
      bytes += layer.mla_k_up[h].bytes() + layer.mla_v_up[h].bytes();
    }
    // A token reads its chosen experts only.
    int64_t experts = 0;
    for (size_t e = 0; e < layer.expert_gate_up.size(); ++e) {
      experts += layer.expert_gate_up[e].bytes() + layer.expert_down[e].bytes();
    }
    if (!layer.expert_gate_up.empty()) {
      bytes +=
          experts * config.num_experts_used / static_cast<int64_t>(layer.expert_gate_up.size());
    }
  }
  return bytes;
}

absl::StatusOr<std::unique_ptr<ModelWeights>> LoadModelWeights(
    const common::GgufFile& gguf, const Parallelism& parallel,
    const kernels::cpu::PackOptions& pack, const LayerSink& sink) {
  LOOM_ASSIGN_OR_RETURN(common::ModelConfig config, common::ModelConfigFromGguf(gguf));
  if (config.rope_dim <= 0 || config.rope_dim > config.head_dim || config.rope_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "rope dimension %d must be even and at most the head dim %d", config.rope_dim,
        config.head_dim));
  }
  LOOM_RETURN_IF_ERROR(CheckQuantizationVersion(gguf));
  LOOM_ASSIGN_OR_RETURN(ShardPlan plan, PlanPartition(config, parallel));
  auto weights = std::make_unique<ModelWeights>();
  Loader loader(gguf, pack);
  const int64_t hidden = config.hidden_size;
  // The dense FFN's width (the layers without experts) and this rank's rows of it, of each
  // expert's gate and up, and of the vocabulary.
  const int64_t ffn = config.DenseFfnWidth();
  const std::pair<int64_t, int64_t> ffn_range = config.num_experts > 0
                                                    ? std::pair{plan.dense_ffn0, plan.dense_ffn}
                                                    : std::pair{plan.ffn0, plan.ffn};
  const std::pair<int64_t, int64_t> expert_range{plan.ffn0, plan.ffn};
  const std::pair<int64_t, int64_t> vocab_range{plan.vocab0, plan.vocab};
  const float norm_offset = config.norm_weight_offset;

  // The embedding looks tokens up on the first stage and is the LM head of a tied model.
  if (plan.first_stage() || (plan.last_stage() && config.tied_embeddings)) {
    LOOM_ASSIGN_OR_RETURN(
        weights->token_embedding,
        loader.MatrixRows("token_embd.weight", config.vocab_size, hidden, vocab_range));
  }
  if (plan.last_stage()) {
    LOOM_ASSIGN_OR_RETURN(weights->output_norm,
                          loader.Norm("output_norm.weight", hidden, norm_offset));
  }
  if (!config.tied_embeddings && plan.last_stage()) {
    LOOM_ASSIGN_OR_RETURN(PackedWeight output, loader.MatrixRows("output.weight", config.vocab_size,
                                                                 hidden, vocab_range));
    weights->output = std::make_unique<PackedWeight>(std::move(output));
  }
  std::vector<float> freq_factors;
  if (!config.rope_factors_tensor.empty()) {
    LOOM_ASSIGN_OR_RETURN(freq_factors,
                          loader.Vector(config.rope_factors_tensor, config.rope_dim / 2));
  }
  weights->rope_inv_freq = RopeInverseFrequencies(config, freq_factors);
  weights->local_rope_inv_freq = common::LocalRopeInverseFrequencies(config);

  for (int64_t l = plan.layer0; l < plan.layer0 + plan.num_layers; ++l) {
    const std::string p = absl::StrCat("blk.", l, ".");
    LayerWeights layer;
    if (config.pre_norms) {
      LOOM_ASSIGN_OR_RETURN(layer.attn_norm,
                            loader.Norm(p + "attn_norm.weight", hidden, norm_offset));
    }
    LOOM_RETURN_IF_ERROR(LoadAttention(loader, config, p, plan, layer));
    if (config.pre_norms) {
      const std::string ffn_norm(common::FindArchitecture(config.architecture)->gguf_ffn_norm);
      LOOM_ASSIGN_OR_RETURN(layer.ffn_norm,
                            loader.Norm(p + ffn_norm + ".weight", hidden, norm_offset));
    }
    if (config.post_norms) {
      LOOM_ASSIGN_OR_RETURN(layer.post_attention_norm,
                            loader.Norm(p + "post_attention_norm.weight", hidden, norm_offset));
      LOOM_ASSIGN_OR_RETURN(layer.post_ffw_norm,
                            loader.Norm(p + "post_ffw_norm.weight", hidden, norm_offset));
    }
    const bool experts = config.LayerHasExperts(l);
    if (experts) {
      LOOM_RETURN_IF_ERROR(LoadExperts(loader, config, p, expert_range, plan.rank == 0, layer));
      if (config.shared_expert_intermediate_size > 0) {
        LOOM_RETURN_IF_ERROR(
            LoadSharedExpert(loader, config, p, {plan.shared_ffn0, plan.shared_ffn}, layer));
      }
    } else if (!loader.HasMatrix(p + "ffn_gate.weight")) {
      // Phi-3: ffn_up holds the gate rows, then the up rows.
      const std::string gate_up = p + "ffn_up.weight";
      LOOM_ASSIGN_OR_RETURN(
          layer.gate_up,
          loader.Fused({{gate_up, 2 * ffn, ffn_range},
                        {gate_up, 2 * ffn, {ffn + ffn_range.first, ffn_range.second}}},
                       hidden));
    } else {
      LOOM_ASSIGN_OR_RETURN(layer.gate_up, loader.Fused({{p + "ffn_gate.weight", ffn, ffn_range},
                                                         {p + "ffn_up.weight", ffn, ffn_range}},
                                                        hidden));
    }
    if (!experts) {
      LOOM_ASSIGN_OR_RETURN(layer.down,
                            loader.MatrixColumns(p + "ffn_down.weight", hidden, ffn, ffn_range));
    }
    if (sink) {
      LOOM_RETURN_IF_ERROR(sink(std::move(layer)));
    } else {
      weights->layers.push_back(std::move(layer));
    }
  }
  weights->load_log = loader.Log();
  weights->config = std::move(config);
  weights->shard = plan;
  return weights;
}

}  // namespace loom::model
