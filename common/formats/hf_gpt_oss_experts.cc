#include "common/formats/hf_gpt_oss_experts.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace loom::common {
namespace {

constexpr uint64_t kBlock = 32;
constexpr uint64_t kBlockBytes = 17;  // GGUF MXFP4: exponent, 16 bytes of nibbles

std::string Shape(const std::vector<uint64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::StatusOr<const StoredTensor*> Part(const GptOssExpertParts& parts, int64_t layer,
                                         const std::string& suffix) {
  auto it = parts.find(suffix);
  if (it == parts.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the experts of layer ", layer, " have no model.layers.", layer, ".mlp.experts.", suffix));
  }
  return &it->second;
}

absl::Status CheckShape(int64_t layer, const std::string& suffix, const StoredTensor& tensor,
                        const std::vector<uint64_t>& expected) {
  if (tensor.shape == expected) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("model.layers.", layer, ".mlp.experts.", suffix,
                                                 " has shape ", Shape(tensor.shape), ", expected ",
                                                 Shape(expected)));
}

// One MXFP4 projection (gate_up or down) of the checkpoint: its blocks and exponents.
struct Projection {
  const StoredTensor* blocks;
  const StoredTensor* scales;
};

// Bias rows as F32 (the checkpoint's BF16, F16 or F32).
absl::StatusOr<std::vector<float>> BiasValues(int64_t layer, const std::string& suffix,
                                              const StoredTensor& bias) {
  if (bias.type != GgmlType::kF32 && bias.type != GgmlType::kBF16 && bias.type != GgmlType::kF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.layers.", layer, ".mlp.experts.", suffix, " is not F32, BF16 or F16"));
  }
  uint64_t count = 1;
  for (uint64_t d : bias.shape) count *= d;
  std::vector<float> values(count);
  LOOM_RETURN_IF_ERROR(DequantizeToF32(bias.type, bias.bytes.data(), count, values.data()));
  return values;
}

// Appends the experts' biases as F32 [E, width] tensors: gate_up_proj_bias's even entries as
// ffn_gate_exps.bias, its odd ones as ffn_up_exps.bias, down_proj_bias as ffn_down_exps.bias.
absl::Status AppendBiases(int64_t layer, const GptOssExpertParts& parts, uint64_t experts,
                          uint64_t hidden, uint64_t ffn, std::vector<OwnedTensor>& out) {
  LOOM_ASSIGN_OR_RETURN(const StoredTensor* gate_up, Part(parts, layer, "gate_up_proj_bias"));
  LOOM_ASSIGN_OR_RETURN(const StoredTensor* down, Part(parts, layer, "down_proj_bias"));
  LOOM_RETURN_IF_ERROR(CheckShape(layer, "gate_up_proj_bias", *gate_up, {experts, 2 * ffn}));
  LOOM_RETURN_IF_ERROR(CheckShape(layer, "down_proj_bias", *down, {experts, hidden}));
  LOOM_ASSIGN_OR_RETURN(std::vector<float> gate_up_values,
                        BiasValues(layer, "gate_up_proj_bias", *gate_up));
  LOOM_ASSIGN_OR_RETURN(std::vector<float> down_values, BiasValues(layer, "down_proj_bias", *down));
  auto bias = [&](const std::string& name, const std::vector<float>& values, uint64_t stored,
                  uint64_t first, uint64_t stride) {
    const uint64_t width = stored / stride;
    OwnedTensor tensor{absl::StrCat("blk.", layer, ".", name, ".bias"),
                       {width, experts},
                       GgmlType::kF32,
                       std::vector<uint8_t>(experts * width * sizeof(float))};
    auto* dst = reinterpret_cast<float*>(tensor.bytes.data());
    for (uint64_t e = 0; e < experts; ++e) {
      for (uint64_t i = 0; i < width; ++i) {
        dst[e * width + i] = values[e * stored + first + i * stride];
      }
    }
    return tensor;
  };
  out.push_back(bias("ffn_gate_exps", gate_up_values, 2 * ffn, 0, 2));
  out.push_back(bias("ffn_up_exps", gate_up_values, 2 * ffn, 1, 2));
  out.push_back(bias("ffn_down_exps", down_values, hidden, 0, 1));
  return absl::OkStatus();
}

// The dequantized layout (gpt-oss fine-tunes saved in BF16, Qwen3-VL-MoE): gate_up_proj
// [E, hidden, 2 * ffn] and down_proj [E, ffn, hidden], input-major (transformers multiplies x
// by them), gate and up interleaved by columns (gpt-oss, with biases) or gate columns then up
// columns (Qwen3-VL-MoE, without); as [E, rows, cols] stacks of the stored type, transposed.
absl::StatusOr<std::vector<OwnedTensor>> ConvertDenseExperts(int64_t layer,
                                                             const GptOssExpertParts& parts,
                                                             bool interleaved = true) {
  LOOM_ASSIGN_OR_RETURN(const StoredTensor* gate_up, Part(parts, layer, "gate_up_proj"));
  LOOM_ASSIGN_OR_RETURN(const StoredTensor* down, Part(parts, layer, "down_proj"));
  const std::vector<uint64_t>& gu = gate_up->shape;
  if (gu.size() != 3 || gu[2] % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("model.layers.", layer,
                                                   ".mlp.experts.gate_up_proj has shape ",
                                                   Shape(gu), ", expected [E, hidden, 2 * ffn]"));
  }
  const uint64_t experts = gu[0], hidden = gu[1], ffn = gu[2] / 2;
  LOOM_RETURN_IF_ERROR(CheckShape(layer, "down_proj", *down, {experts, ffn, hidden}));
  const GgmlType type = gate_up->type;
  if ((type != GgmlType::kF32 && type != GgmlType::kBF16 && type != GgmlType::kF16) ||
      down->type != type) {
    return absl::InvalidArgumentError(
        absl::StrCat("the experts of layer ", layer,
                     ": gate_up_proj and down_proj must be one of F32, "
                     "BF16 or F16"));
  }
  const uint64_t size = type == GgmlType::kF32 ? 4 : 2;
  // out[e][r][c] = stored[e][c][first + r * stride] (r < rows) of a [E, cols, stored_rows]
  // tensor.
  auto transposed = [&](const std::string& name, const StoredTensor& stored, uint64_t stored_rows,
                        uint64_t cols, uint64_t first, uint64_t stride, uint64_t rows) {
    OwnedTensor tensor{absl::StrCat("blk.", layer, ".", name, ".weight"),
                       {cols, rows, experts},
                       type,
                       std::vector<uint8_t>(experts * rows * cols * size)};
    for (uint64_t e = 0; e < experts; ++e) {
      for (uint64_t r = 0; r < rows; ++r) {
        for (uint64_t c = 0; c < cols; ++c) {
          std::memcpy(
              tensor.bytes.data() + ((e * rows + r) * cols + c) * size,
              stored.bytes.data() + ((e * cols + c) * stored_rows + first + r * stride) * size,
              size);
        }
      }
    }
    return tensor;
  };
  std::vector<OwnedTensor> out;
  out.push_back(
      transposed("ffn_gate_exps", *gate_up, 2 * ffn, hidden, 0, interleaved ? 2 : 1, ffn));
  out.push_back(transposed("ffn_up_exps", *gate_up, 2 * ffn, hidden, interleaved ? 1 : ffn,
                           interleaved ? 2 : 1, ffn));
  out.push_back(transposed("ffn_down_exps", *down, hidden, ffn, 0, 1, hidden));
  if (interleaved) LOOM_RETURN_IF_ERROR(AppendBiases(layer, parts, experts, hidden, ffn, out));
  return out;
}

}  // namespace

absl::StatusOr<std::vector<OwnedTensor>> ConvertConcatenatedExperts(
    int64_t layer, const GptOssExpertParts& parts) {
  for (const auto& [suffix, tensor] : parts) {
    if (suffix != "gate_up_proj" && suffix != "down_proj") {
      return absl::InvalidArgumentError(absl::StrCat("model.layers.", layer, ".mlp.experts.",
                                                     suffix, " has no place in the graph"));
    }
  }
  return ConvertDenseExperts(layer, parts, /*interleaved=*/false);
}

absl::StatusOr<std::vector<OwnedTensor>> ConvertGptOssExperts(int64_t layer,
                                                              const GptOssExpertParts& parts) {
  const bool dense = parts.count("gate_up_proj") != 0;
  for (const auto& [suffix, tensor] : parts) {
    bool known = false;
    const absl::Span<const char* const> names =
        dense ? absl::MakeConstSpan(kGptOssDenseExpertSuffixes)
              : absl::MakeConstSpan(kGptOssExpertSuffixes);
    for (const char* name : names) {
      known |= suffix == name;
    }
    if (!known) {
      return absl::InvalidArgumentError(absl::StrCat("model.layers.", layer, ".mlp.experts.",
                                                     suffix, " has no place in the gpt-oss graph"));
    }
  }
  if (dense) return ConvertDenseExperts(layer, parts);
  Projection gate_up{}, down{};
  LOOM_ASSIGN_OR_RETURN(gate_up.blocks, Part(parts, layer, "gate_up_proj_blocks"));
  LOOM_ASSIGN_OR_RETURN(gate_up.scales, Part(parts, layer, "gate_up_proj_scales"));
  LOOM_ASSIGN_OR_RETURN(down.blocks, Part(parts, layer, "down_proj_blocks"));
  LOOM_ASSIGN_OR_RETURN(down.scales, Part(parts, layer, "down_proj_scales"));
  const std::vector<uint64_t>& gu = gate_up.blocks->shape;
  const std::vector<uint64_t>& dn = down.blocks->shape;
  if (gu.size() != 4 || dn.size() != 4 || gu[3] != 16 || dn[3] != 16 || gu[1] % 2 != 0 ||
      dn[0] != gu[0]) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gpt-oss experts of layer ", layer, ": gate_up_proj_blocks ", Shape(gu),
        " and down_proj_blocks ", Shape(dn), " are not [E, rows, blocks, 16] of one E"));
  }
  const uint64_t experts = gu[0], hidden = gu[2] * kBlock, ffn = gu[1] / 2;
  LOOM_RETURN_IF_ERROR(
      CheckShape(layer, "down_proj_blocks", *down.blocks, {experts, hidden, ffn / kBlock, 16}));
  if (ffn % kBlock != 0) {
    return absl::InvalidArgumentError(absl::StrCat("gpt-oss experts of layer ", layer, ": width ",
                                                   ffn, " is not a multiple of 32"));
  }
  LOOM_RETURN_IF_ERROR(CheckShape(layer, "gate_up_proj_scales", *gate_up.scales,
                                  {experts, 2 * ffn, hidden / kBlock}));
  LOOM_RETURN_IF_ERROR(
      CheckShape(layer, "down_proj_scales", *down.scales, {experts, hidden, ffn / kBlock}));
  for (const StoredTensor* packed : {gate_up.blocks, gate_up.scales, down.blocks, down.scales}) {
    if (packed->type != GgmlType::kI8) {
      return absl::InvalidArgumentError(
          absl::StrCat("gpt-oss experts of layer ", layer, ": MXFP4 blocks and scales must be U8"));
    }
  }

  // Row r of expert e of a [E, rows, cols] MXFP4 matrix, repacked into GGUF blocks at `dst`.
  auto repack_row = [](const StoredTensor& blocks, const StoredTensor& scales, uint64_t rows,
                       uint64_t cols, uint64_t e, uint64_t r, uint8_t* dst) {
    const uint64_t groups = cols / kBlock;
    const uint8_t* src = blocks.bytes.data() + ((e * rows + r) * groups) * 16;
    const uint8_t* exponents = scales.bytes.data() + (e * rows + r) * groups;
    for (uint64_t g = 0; g < groups; ++g, src += 16, dst += kBlockBytes) {
      dst[0] = exponents[g];
      // Element k: byte k / 2's low nibble when k is even, its high one when odd.
      auto nibble = [&](uint64_t k) {
        return static_cast<uint8_t>(k % 2 == 0 ? src[k / 2] & 0x0f : src[k / 2] >> 4);
      };
      for (uint64_t j = 0; j < 16; ++j) {
        dst[1 + j] = static_cast<uint8_t>(nibble(j) | (nibble(j + 16) << 4));
      }
    }
  };
  auto matrix = [&](const std::string& name, const Projection& p, uint64_t stored_rows,
                    uint64_t cols, uint64_t first, uint64_t stride) {
    const uint64_t rows = stored_rows / stride;
    const uint64_t row_bytes = cols / kBlock * kBlockBytes;
    OwnedTensor out{absl::StrCat("blk.", layer, ".", name, ".weight"),
                    {cols, rows, experts},
                    GgmlType::kMXFP4,
                    std::vector<uint8_t>(experts * rows * row_bytes)};
    for (uint64_t e = 0; e < experts; ++e) {
      for (uint64_t r = 0; r < rows; ++r) {
        repack_row(*p.blocks, *p.scales, stored_rows, cols, e, first + r * stride,
                   out.bytes.data() + (e * rows + r) * row_bytes);
      }
    }
    return out;
  };
  std::vector<OwnedTensor> out;
  out.push_back(matrix("ffn_gate_exps", gate_up, 2 * ffn, hidden, 0, 2));
  out.push_back(matrix("ffn_up_exps", gate_up, 2 * ffn, hidden, 1, 2));
  out.push_back(matrix("ffn_down_exps", down, hidden, ffn, 0, 1));
  LOOM_RETURN_IF_ERROR(AppendBiases(layer, parts, experts, hidden, ffn, out));
  return out;
}

absl::StatusOr<std::vector<OwnedTensor>> ConvertGraniteMoeExperts(int64_t layer,
                                                                  const GptOssExpertParts& parts) {
  const std::string prefix = absl::StrCat("model.layers.", layer, ".");
  // A part, of a float type and `dims` dimensions, its rows two halves where `fused`.
  auto stored = [&](const std::string& suffix, size_t dims,
                    bool fused) -> absl::StatusOr<const StoredTensor*> {
    auto it = parts.find(suffix);
    if (it == parts.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("GraniteMoe layer ", layer, " has no ", prefix, suffix));
    }
    const StoredTensor& tensor = it->second;
    if (tensor.type != GgmlType::kF32 && tensor.type != GgmlType::kBF16 &&
        tensor.type != GgmlType::kF16) {
      return absl::InvalidArgumentError(absl::StrCat(prefix, suffix, " must be F32, BF16 or F16"));
    }
    if (tensor.shape.size() != dims || (fused && tensor.shape[dims - 2] % 2 != 0)) {
      return absl::InvalidArgumentError(absl::StrCat(prefix, suffix, " has shape ",
                                                     Shape(tensor.shape), ", expected ",
                                                     !fused      ? "[E, hidden, ffn]"
                                                     : dims == 3 ? "[E, 2 * ffn, hidden]"
                                                                 : "[2 * shared, hidden]"));
    }
    return &tensor;
  };
  // Rows [first, first + rows) of each of the `stacks` [total_rows, cols] matrices of `from`.
  auto rows_of = [&](const std::string& name, const StoredTensor& from, uint64_t stacks,
                     uint64_t total_rows, uint64_t first, uint64_t rows, uint64_t cols) {
    const uint64_t size = from.type == GgmlType::kF32 ? 4 : 2;
    std::vector<uint64_t> shape = {cols, rows};
    if (from.shape.size() == 3) shape.push_back(stacks);
    OwnedTensor tensor{absl::StrCat("blk.", layer, ".", name, ".weight"), shape, from.type,
                       std::vector<uint8_t>(stacks * rows * cols * size)};
    for (uint64_t s = 0; s < stacks; ++s) {
      std::memcpy(tensor.bytes.data() + s * rows * cols * size,
                  from.bytes.data() + (s * total_rows + first) * cols * size, rows * cols * size);
    }
    return tensor;
  };
  std::vector<OwnedTensor> out;
  for (const auto& [suffix, tensor] : parts) {
    bool known = false;
    for (const char* granite : kGraniteMoeExpertSuffixes) known = known || suffix == granite;
    if (!known) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, "mlp.experts.", suffix, " has no place in a GraniteMoe graph"));
    }
  }
  if (parts.count("block_sparse_moe.input_linear.weight") != 0 ||
      parts.count("block_sparse_moe.output_linear.weight") != 0) {
    LOOM_ASSIGN_OR_RETURN(const StoredTensor* input,
                          stored("block_sparse_moe.input_linear.weight", 3, true));
    LOOM_ASSIGN_OR_RETURN(const StoredTensor* output,
                          stored("block_sparse_moe.output_linear.weight", 3, false));
    const uint64_t experts = input->shape[0], ffn = input->shape[1] / 2, hidden = input->shape[2];
    if (output->shape != std::vector<uint64_t>{experts, hidden, ffn} ||
        output->type != input->type) {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix, "block_sparse_moe.output_linear.weight has shape ", Shape(output->shape),
          ", expected ", Shape({experts, hidden, ffn}), " of input_linear's type"));
    }
    out.push_back(rows_of("ffn_gate_exps", *input, experts, 2 * ffn, 0, ffn, hidden));
    out.push_back(rows_of("ffn_up_exps", *input, experts, 2 * ffn, ffn, ffn, hidden));
    out.push_back(rows_of("ffn_down_exps", *output, experts, hidden, 0, hidden, ffn));
  }
  if (parts.count("shared_mlp.input_linear.weight") != 0) {
    LOOM_ASSIGN_OR_RETURN(const StoredTensor* shared,
                          stored("shared_mlp.input_linear.weight", 2, true));
    const uint64_t width = shared->shape[0] / 2, hidden = shared->shape[1];
    out.push_back(rows_of("ffn_gate_shexp", *shared, 1, 2 * width, 0, width, hidden));
    out.push_back(rows_of("ffn_up_shexp", *shared, 1, 2 * width, width, width, hidden));
  }
  return out;
}

}  // namespace loom::common
