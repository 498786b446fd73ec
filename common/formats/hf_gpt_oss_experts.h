#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/formats/ggml_type.h"
#include "common/formats/hf_quantization.h"

namespace loom::common {

/// One tensor of a checkpoint as stored: bytes, shape (safetensors order) and element type.
struct StoredTensor {
  absl::Span<const uint8_t> bytes;
  std::vector<uint64_t> shape;
  GgmlType type = GgmlType::kF32;  // kI8 for U8 bytes (MXFP4 blocks and exponents)
};

/// One layer's experts of a gpt-oss checkpoint as transformers stores them, by suffix of
/// `model.layers.L.mlp.experts.`: gate_up_proj_blocks [E, 2 * ffn, in / 32, 16] and
/// gate_up_proj_scales [E, 2 * ffn, in / 32] (MXFP4: element 2i of a block in byte i's low
/// nibble, 2i + 1 in its high one, E8M0 exponents), gate_up_proj_bias [E, 2 * ffn] (gate and
/// up channels interleaved: even rows gate, odd rows up), down_proj_blocks / _scales
/// [E, hidden, ffn / 32 (, 16)] and down_proj_bias [E, hidden].
using GptOssExpertParts = std::map<std::string, StoredTensor>;

/// The suffixes GptOssExpertParts holds: MXFP4, or dequantized (fine-tunes saved in BF16:
/// gate_up_proj [E, hidden, 2 * ffn] and down_proj [E, ffn, hidden], input-major, gate and
/// up interleaved by columns).
inline constexpr const char* kGptOssExpertSuffixes[] = {
    "gate_up_proj_blocks", "gate_up_proj_scales", "gate_up_proj_bias",
    "down_proj_blocks",    "down_proj_scales",    "down_proj_bias"};
inline constexpr const char* kGptOssDenseExpertSuffixes[] = {"gate_up_proj", "gate_up_proj_bias",
                                                             "down_proj", "down_proj_bias"};

/// llama.cpp's tensors of layer `layer`'s experts: blk.L.ffn_{gate,up,down}_exps.weight as
/// GGUF MXFP4 (blocks of 32, the exponent byte first, element j < 16 in byte j's low nibble
/// and j + 16 in its high one), or for the dequantized layout transposed stacks of the stored
/// type (F32, BF16 or F16), and their .bias as F32 [E, width]; gate and up de-interleaved,
/// nibbles repacked, exponents kept: every value as stored. InvalidArgument naming the
/// tensor for a missing or unknown part or shapes that disagree.
absl::StatusOr<std::vector<OwnedTensor>> ConvertGptOssExperts(int64_t layer,
                                                              const GptOssExpertParts& parts);

/// The same for Qwen3-VL-MoE's experts (transformers' Qwen3VLMoeTextExperts): gate_up_proj
/// [E, hidden, 2 * ffn] with the gate's columns first, then up's, and down_proj [E, ffn,
/// hidden], no biases, as transposed stacks of the stored type (F32, BF16 or F16).
absl::StatusOr<std::vector<OwnedTensor>> ConvertConcatenatedExperts(int64_t layer,
                                                                    const GptOssExpertParts& parts);

/// GraniteMoe's fused tensors of one layer, by their suffix of `model.layers.L.`:
/// block_sparse_moe.input_linear.weight [E, 2 * ffn, hidden] (each expert's gate rows, then
/// its up rows), block_sparse_moe.output_linear.weight [E, hidden, ffn] and, in
/// GraniteMoeShared, shared_mlp.input_linear.weight [2 * shared, hidden] (gate rows, then up).
inline constexpr const char* kGraniteMoeExpertSuffixes[] = {"block_sparse_moe.input_linear.weight",
                                                            "block_sparse_moe.output_linear.weight",
                                                            "shared_mlp.input_linear.weight"};

/// llama.cpp's tensors of them: blk.L.ffn_{gate,up,down}_exps.weight and
/// blk.L.ffn_{gate,up}_shexp.weight, row slices of the stored type (F32, BF16 or F16), every
/// value as stored. InvalidArgument naming the tensor for a missing part, another type or
/// shapes that disagree.
absl::StatusOr<std::vector<OwnedTensor>> ConvertGraniteMoeExperts(int64_t layer,
                                                                  const GptOssExpertParts& parts);

}  // namespace loom::common
