#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/formats/ggml_type.h"
#include "nlohmann/json_fwd.hpp"

namespace loom::common {

class GgufFile;

/// A Hugging Face checkpoint's `quantization_config` that Loom serves: AWQ (AutoAWQ's GEMM
/// layout, 4-bit, zero points), GPTQ (AutoGPTQ's layout, 4 or 8 bits, symmetric or not, with
/// or without act-order, checkpoint_format gptq or gptq_v2) and FP8 E4M3 weights (the `fp8`
/// method: per-tensor `weight_scale` or block-wise `weight_scale_inv`; `compressed-tensors`
/// float-quantized 8-bit weights with per-tensor, per-channel or block `weight_scale`).
struct HfQuantization {
  // kMxfp4: gpt-oss's experts in MXFP4 (hf_gpt_oss_experts), every other layer unquantized.
  enum class Method { kNone, kAwq, kGptq, kFp8, kMxfp4 };
  Method method = Method::kNone;
  int bits = 0;
  int64_t group_size = 0;       // -1: one group per output channel
  bool desc_act = false;        // GPTQ act-order (groups by g_idx, not by position)
  bool zeros_plus_one = false;  // GPTQ's v1 format stores each zero point minus one
  // FP8 with a scale per block: the block's [rows, columns] (the `fp8` method's
  // weight_block_size, compressed-tensors' block_structure); 0 when the config names none.
  int64_t fp8_block_rows = 0, fp8_block_cols = 0;
};

/// `quantization_config` of config.json (null or absent: Method::kNone). Unimplemented naming
/// the method or field value Loom does not serve (bitsandbytes, AWQ GEMV/Marlin/ExLlama
/// layouts, other bit widths, ...).
absl::StatusOr<HfQuantization> ParseHfQuantization(const nlohmann::json& config);

/// One linear layer's packed tensors, as the checkpoint stores them (row-major, little-endian).
struct QuantizedLinearTensors {
  absl::Span<const uint8_t> qweight, qzeros, scales, g_idx;         // g_idx may be empty
  std::vector<uint64_t> qweight_shape, qzeros_shape, scales_shape;  // safetensors order
};

/// One FP8 linear layer: weight E4M3 [out, in] and its scale (F32, BF16 or F16; one value,
/// one per output row ([out] or [out, 1]), or one per block of a [ceil(out / bn),
/// ceil(in / bk)] grid), as the checkpoint stores them.
struct Fp8LinearTensors {
  absl::Span<const uint8_t> weight, scale;
  std::vector<uint64_t> weight_shape, scale_shape;
  GgmlType scale_type = GgmlType::kF32;  // kF32, kBF16 or kF16
  // The block a grid of scales covers (HfQuantization::fp8_block_rows / _cols). A grid is read
  // only with it: ceil(out / rows) x ceil(in / columns) cannot say it (DeepSeek-V3's 576-row
  // kv_a_proj_with_mqa has 5 rows of 128-row blocks, the last partial, which a block of
  // ceil(576 / 5) = 116 rows would misplace).
  int64_t block_rows = 0, block_cols = 0;
};

/// A tensor the converted checkpoint serves, with its bytes.
struct OwnedTensor {
  std::string name;
  std::vector<uint64_t> shape;  // ggml order
  GgmlType type = GgmlType::kF32;
  std::vector<uint8_t> bytes;
};

/// The GGUF tensors of the linear layer `name` (e.g. "blk.0.attn_q.weight", W [out, in]) of a
/// quantized checkpoint, without loss where Loom's own encoding holds the values
/// (model/quantized_gguf.h: name.q4 / .q8, .scale, .min): 4-bit groups along the input as
/// INT4 (scale s, min -z s, rounded to F16 as Loom's INT4 stores it), symmetric 8-bit GPTQ as
/// INT8 (q - 128, scale s); what that encoding cannot group (act-order, asymmetric 8-bit,
/// groups not a multiple of 32 columns) dequantized to F16 as `name`. InvalidArgument naming
/// the tensor for shapes that do not agree.
absl::StatusOr<std::vector<OwnedTensor>> ConvertQuantizedLinear(
    const HfQuantization& quantization, const std::string& name,
    const QuantizedLinearTensors& tensors);

/// The F16 tensor `name` [out, in] of an FP8 layer: each E4M3 value times its scale, rounded
/// once to F16 (Loom has no FP8 weight format on the CPU). InvalidArgument naming the tensor
/// for a scale whose shape is none of the three, and for a grid without its block size or
/// whose shape is not that block size's.
absl::StatusOr<OwnedTensor> DequantizeFp8Linear(const std::string& name,
                                                const Fp8LinearTensors& tensors);

/// What the companion of an FP8 layer's F16 tensor is named after it: "blk.0.attn_q.weight" +
/// this.
inline constexpr std::string_view kFp8RowScaleSuffix = ".fp8_scale";

/// The companion of DequantizeFp8Linear's tensor for per-tensor and per-channel scales:
/// `name` + kFp8RowScaleSuffix, F32 [out], each row's scale, from which the CUDA device's FP8
/// upload recovers the checkpoint's codes exactly (model::CudaDevice, kernels/cpu/fp8_rows.h).
/// nullopt for a grid of block scales (no one scale per row) or a scale that is not positive
/// and finite (the codes are then derived from the values). Errors as DequantizeFp8Linear's.
absl::StatusOr<std::optional<OwnedTensor>> Fp8RowScales(const std::string& name,
                                                        const Fp8LinearTensors& tensors);

/// Whether `gguf` holds any FP8 row-scale companion (a Hugging Face FP8 checkpoint with scales
/// per tensor or per output channel, as the directory view serves it).
bool HasFp8RowScales(const GgufFile& gguf);

}  // namespace loom::common
