#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/formats/ggml_type.h"

namespace loom::kernels::cpu {

/// Formats a weight matrix takes in the CPU backend.
enum class WeightFormat {
  kF32,   // float [rows, cols]
  kF16,   // IEEE half [rows, cols]
  kBf16,  // bfloat16 [rows, cols]: a BF16 checkpoint's values as they are, or F16/F32 ones
          //   rounded for --activations bf16 (PackOptions::floats_as_bf16). Laid out as
          //   AMX-BF16's B tiles, which the AMX kernel loads as they are; the AVX2/AVX-512
          //   kernels widen a column with one shift or mask.
  kInt8,  // int8 q, value = q * scale; one scale per `group_size` columns of a row
          //   (group_size == cols: per output channel; 32: GGUF Q8_0 exactly)
  kInt4,  // 4-bit q in [0, 15], value = q * scale + min; one (scale, min) per group
          //   (group 32: GGUF Q4_0 (min = -8 * scale) and Q4_1 exactly)
  kInt5,  // 5-bit q in [0, 31], value = q * scale + min, as kInt4 with a fifth bit
          //   (group 32: GGUF Q5_0 (min = -16 * scale) and Q5_1 exactly)
  kNl4,   // 4-bit code in [0, 15] naming one of 16 int8 `levels`, value = levels[code] *
          //   scale; one F16 scale per group (group 32: GGUF IQ4_NL and MXFP4 exactly, at
          //   half of INT8's bytes). The kernels widen each row block to INT8 as they read it.
};
// INT8/INT4 weights come with F16 scales (`scales`, `mins`: the formats above) or, for the
// K-quants, with F32 ones (`scales_f32`, `mins_f32`): a K-quant sub-block's scale is an F16
// super-block scale times a 6- or 8-bit integer, exact in F32 but not in F16. F32-scaled
// weights allow groups of 16 (Q6_K, Q3_K, Q2_K) and carry a min for INT8 too (Q5_K:
// value = q * scale + min, q in [0, 31]); the value is one rounding of q * scale + min,
// which is exactly what llama.cpp and `gguf` dequantize.

/// "F32", "F16", "BF16", "INT8", "INT4", "INT5", "NL4".
const char* WeightFormatName(WeightFormat format);

/// A weight matrix W [rows = out_features, cols = in_features] in a backend format.
/// Owns its storage; the layout inside `data` is private to kernels/cpu (it may be
/// interleaved for the matmul kernels). Immutable after packing; thread-safe to read.
struct PackedWeight {
  WeightFormat format = WeightFormat::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t group_size = 0;          // kInt8 / kInt4: columns per scale; 0 otherwise
  // Packed values, interleaved in blocks of 16 rows (rows padded to a multiple of 16);
  // see kernels/cpu/matmul_internal.h. Read rows through DequantizeRows.
  std::vector<uint8_t> data;
  std::vector<uint16_t> scales;    // kInt8 / kInt4: F16, one per (row, group), same blocking
  std::vector<uint16_t> mins;      // kInt4 / kInt5: F16, one per (row, group), same blocking
  // F32-scaled INT8/INT4 (K-quants) instead of `scales` / `mins`: both always present,
  // same blocking; an INT8 group without a min holds -0.0f.
  std::vector<float> scales_f32;
  std::vector<float> mins_f32;
  std::array<int8_t, 16> levels{};  // kNl4: the value of each code; none is -128
  // An FP8 checkpoint's scale of each row (per tensor or per output channel), where the values
  // are its E4M3 codes times these rounded to this format: the CUDA device's FP8 upload
  // recovers the codes exactly with them (kernels/cpu/fp8_rows.h). Empty otherwise.
  std::vector<float> fp8_row_scales;
  std::string source;              // e.g. "Q4_1 -> INT4 g32 (lossless)"

  /// True for an INT8/INT4 weight with F32 scales and mins.
  bool f32_scaled() const { return !scales_f32.empty(); }
  /// Bytes a matmul reads from this weight (for bandwidth accounting).
  int64_t bytes() const {
    return static_cast<int64_t>(data.size() + 2 * scales.size() + 2 * mins.size() +
                                4 * scales_f32.size() + 4 * mins_f32.size());
  }
};

/// Choices between packings that hold the same values.
struct PackOptions {
  // Q5_0 (d * (q - 16)) as INT8 q - 16 instead of INT5. Both are exact; which runs faster
  // depends on the kernels: with float activations on AVX2 every weight is converted to
  // float per use and INT5's fifth bits cost more instructions than they save in bytes
  // (single-stream decode of a Q4_K_M file ~15% slower), and AVX-512's VNNI takes INT8
  // bytes as they are; elsewhere INT5 ran faster. The CPU forward pass chooses
  // (worker/cpu_forward_pass.cc, with the measurements).
  bool q5_0_as_int8 = false;
  // IQ4_NL and MXFP4 as INT8 (one byte per weight) instead of NL4 (half a byte, widened to
  // INT8 by the kernels per row block as they read it; MXFP4 blocks whose scales F16 cannot
  // hold are INT8 with F32 scales either way).
  bool table_4bit_as_int8 = false;
  // F16 and F32 matrices as BF16, rounded to nearest even: what --activations bf16 multiplies
  // them as anyway (the AMX kernel rounds every weight it reads to BF16), so a matmul gives the
  // same bits, and the AMX kernel loads its tiles straight from the weight instead of
  // converting every weight on every call. The CPU forward pass sets it for --activations
  // bf16: an F16/F32 checkpoint is then held as a BF16 one, the embedding table included (its
  // lookups read the rounded values, as a BF16 model's do; it is the LM head of tied models).
  bool floats_as_bf16 = false;
};

/// Converts a GGUF tensor with ggml shape [cols, rows] (ne0 = cols, contiguous) into a
/// backend format, every one without loss: F32 -> F32, F16 -> F16, BF16 -> BF16 (F32 and F16
/// rounded to BF16 where `options` say),
/// Q4_0/Q4_1 -> INT4 g32, Q5_0/Q5_1 -> INT5 g32 (Q5_0 as INT8 g32 if `options` say),
/// Q8_0 -> INT8 g32, IQ4_NL and MXFP4 -> NL4 g32 (INT8 g32 if `options` say, or for MXFP4
/// scales outside F16's powers of two), and the K-quants into F32-scaled INT4/INT8
/// (kernels/cpu/kquant_weights.cc): Q4_K -> INT4 g32, Q5_K -> INT8 g32 with mins, Q6_K ->
/// INT8 g16, Q3_K and Q2_K -> INT4 g16. `source` says which. InvalidArgument for
/// unsupported types or sizes.
absl::StatusOr<PackedWeight> PackWeight(common::GgmlType type, const void* data, int64_t rows,
                                        int64_t cols, const PackOptions& options = {});

/// Packs F32 values [rows, cols] into `format` (quantizing with round-to-nearest for
/// kInt8 / kInt4 / kInt5 with the given group size, rounding to nearest even for kF16 /
/// kBf16; kNl4 is InvalidArgument). Used by tests
/// and re-quantization.
absl::StatusOr<PackedWeight> PackFromF32(const float* values, int64_t rows, int64_t cols,
                                         WeightFormat format, int64_t group_size);

/// Stacks weights with equal cols into one [sum rows, cols] matrix (fused QKV and gate/up
/// projections: one matmul instead of several). Integer parts that differ in format,
/// group size or scale type are first converted, without loss, to the widest of them
/// (INT4 -> INT5 -> INT8, NL4 -> INT8 (its levels), a group into halves, F16 -> F32 scales;
/// NL4 parts stay NL4 when they share their levels), as a Q4_K_M file's Q6_K V
/// beside its Q4_K Q and K needs; symmetric INT4/INT5 parts (Q4_0, Q5_0: min = -8 or -16
/// times the scale) become INT8 q - 8 / q - 16 with their F16 scales, so a Q8_0 V beside
/// Q5_0 Q and K stays one byte per weight. Other mixes are InvalidArgument.
absl::StatusOr<PackedWeight> ConcatRows(const std::vector<const PackedWeight*>& parts);

/// Columns [col_begin, col_begin + count) of every row of an INT8/INT5/INT4 weight, the same
/// values (a tensor-parallel rank's slice of a row-parallel matrix). A cut through a group
/// (gpt-oss's 2,880 MXFP4 columns over 4 ranks: 720, not a multiple of 32) splits it into
/// groups of gcd(group, col_begin, count) with F32 scales (INT5 and NL4 then as INT8);
/// InvalidArgument for float formats and for pieces narrower than 16 columns.
absl::StatusOr<PackedWeight> SliceColumns(const PackedWeight& weight, int64_t col_begin,
                                          int64_t count);

/// An INT8/INT5/INT4 weight's values in plain row-major order, for repacking into another
/// backend's layout (the CUDA forward pass's quantized GEMM): value = q * scale + min (no
/// min for INT8 with F16 scales). An INT4 weight's F32 scales and mins (K-quants) are rounded
/// to F16 here (the CUDA INT4 kernels keep F16 ones); an INT8 weight's stay F32, exact. INT5
/// comes out as INT8, exactly: Q5_0's symmetric form as q - 16 with its F16 scales (Q8_0's
/// form), Q5_1's as q in 0..31 with F32 scales and mins; NL4 as INT8 too, its levels with
/// its F16 scales.
struct NaturalQuantizedWeight {
  std::vector<int8_t> q;          // [rows, cols]: INT4 0..15, INT8 -128..127
  std::vector<uint16_t> scales;   // F16 [rows, cols / group_size]; empty with scales_f32
  std::vector<uint16_t> mins;     // INT4: F16 [rows, cols / group_size]; INT8: empty
  // INT8 with F32 scales (K-quants): [rows, cols / group_size]; mins_f32 empty when every
  // group's min is zero (Q6_K), else the mins (Q5_K, a Q4_K part fused with a Q6_K one).
  std::vector<float> scales_f32;
  std::vector<float> mins_f32;
};
/// InvalidArgument for F32/F16 weights.
absl::StatusOr<NaturalQuantizedWeight> UnpackQuantized(const PackedWeight& weight);

/// Dequantizes rows [row_begin, row_end) to F32, [row_end - row_begin, cols] into `out`
/// (the embedding lookup and the scalar references use it).
void DequantizeRows(const PackedWeight& weight, int64_t row_begin, int64_t row_end, float* out);

}  // namespace loom::kernels::cpu
