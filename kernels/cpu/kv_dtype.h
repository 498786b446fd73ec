#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "kernels/cpu/half.h"

namespace loom::kernels::cpu {

/// Element type of the KV cache. F16 is the default (vLLM's `auto` for F16 models); BF16
/// (--kv-dtype bf16, vLLM's `--kv-cache-dtype bfloat16`) keeps F32's exponent range in the
/// same two bytes (a BF16 model's keys are not bounded by F16's 65504) and is what the AMX
/// attention of --activations bf16 reads without converting (paged_attention_amx.cc); rows are
/// rounded to nearest even (FloatToBf16). The 8-bit types (--kv-cache-dtype int8|fp8_e4m3) store
/// each token's K (and V) row of one KV head as head_dim 8-bit codes and one scale, value
/// = code x scale: int8 is symmetric (scale = max|x| / 127), fp8_e4m3 is OCP E4M3FN (scale
/// = max|x| / 448). The scale is BF16 (2 bytes: a 64-wide head stores 66 bytes where F16
/// stores 128), rounded up from max|x| / qmax so that no code saturates; the codes are
/// computed against the stored scale, so its short mantissa costs nothing.
///
/// A scale per token and head rather than per block: a token's stored K/V is a function of
/// that token alone, so it is the same bits whatever chunk, batch or step wrote it, and the
/// kernels' invariance (a token's attention never depends on how its prompt was split)
/// holds for 8-bit KV too. A block-wide scale would change earlier tokens' codes when a
/// later token raised the block's maximum.
enum class KvDtype { kF16, kF32, kInt8, kFp8E4m3, kBf16 };

constexpr bool IsQuantizedKv(KvDtype dtype) {
  return dtype == KvDtype::kInt8 || dtype == KvDtype::kFp8E4m3;
}

/// Bytes of one K or V element (the code for the 8-bit types).
constexpr int64_t KvElementBytes(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kF16:
    case KvDtype::kBf16:
      return 2;
    case KvDtype::kF32:
      return 4;
    default:
      return 1;
  }
}

/// Bytes of the scale each token's row of one KV head carries (0 for F16/BF16/F32).
inline int64_t KvScaleBytes(KvDtype dtype) { return IsQuantizedKv(dtype) ? 2 : 0; }

/// "f16", "bf16", "f32", "int8", "fp8_e4m3" (the flag values).
const char* KvDtypeName(KvDtype dtype);
/// The type KvDtypeName calls `name`; nullopt for any other name.
std::optional<KvDtype> KvDtypeFromName(std::string_view name);

/// Largest finite FP8 E4M3FN magnitude.
inline constexpr float kFp8E4m3Max = 448.0f;

/// OCP FP8 E4M3FN (bias 7, no infinities, 0x7F/0xFF NaN, max 448) to float, exactly.
float Fp8E4m3ToFloat(uint8_t code);
/// float to E4M3FN, round to nearest even, saturating at +-448; NaN gives NaN.
uint8_t FloatToFp8E4m3(float value);

/// Whether an 8-bit cache of this head dim stores K and V rotated: for power-of-two head
/// dims, each row is multiplied by the normalized Walsh-Hadamard matrix H (orthogonal and
/// its own inverse) before it is quantized, and attention rotates the query by H and its
/// output back (q . k = Hq . Hk; the weighted sum of rotated V rows is H out). Rotation
/// spreads a row's few large channels (keys have them) over all of them, so the rounding
/// errors of a dot product no longer concentrate where its terms are largest (QuaRot's
/// observation). On SmolLM2-135M (tests/cli/kv_cache_dtype_accuracy_test.cc's text) the
/// mean KL divergence from F16 KV fell from 0.0067 to 0.0045 for FP8 and from 0.0010 to
/// 0.00023 for INT8; perplexity from +0.9% (+1.3% on AVX2) to +0.05% for FP8 (another
/// tutorial page: +0.6% before, +0.8-0.9% after; at this size it moves both ways).
inline bool RotatesKv(KvDtype dtype, int64_t head_dim) {
  return IsQuantizedKv(dtype) && head_dim >= 2 && (head_dim & (head_dim - 1)) == 0;
}

/// x = H x for a power-of-two n (the normalized fast Walsh-Hadamard transform, in place).
void RotateKvRow(float* x, int64_t n);

/// The BF16 scale of a row whose largest magnitude is `amax`: amax / qmax rounded up (so
/// that |x| / scale <= qmax for every x), 0 for amax 0; the largest finite BF16 past it.
uint16_t KvRowScale(KvDtype dtype, float amax);

/// Quantizes `n` values to `dtype`'s codes (n bytes at `codes`) and their BF16 scale. All
/// zeros (or max|x| = 0) give scale 0 and zero codes. Only for the 8-bit types.
void QuantizeKvRow(KvDtype dtype, const float* x, int64_t n, void* codes, uint16_t* scale);

/// The value of code `index` of a row whose scale is `scale` (scalar paths, references).
float DequantizeKv(KvDtype dtype, const void* codes, int64_t index, float scale);

/// The SIMD kernels decode E4M3 through F16 bits (sign, then the 7 exponent and mantissa
/// bits shifted into the F16 layout): exact, but 2^-8 of the code's value, a factor folded
/// into the row's scale. 1 for int8.
inline float KvDecodeFactor(KvDtype dtype) { return dtype == KvDtype::kFp8E4m3 ? 256.0f : 1.0f; }

}  // namespace loom::kernels::cpu
