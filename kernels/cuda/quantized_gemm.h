#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/types.h"
#include "kernels/cuda_device.h"

namespace loom::kernels::cuda {

// Quantized linear layers on the GPU: Y[m, n] = X[m, k] · W[n, k]^T (+ bias[n]), X and Y in F16 or
// BF16, F32 accumulation on tensor cores (mma.sync m16n8k16).
//
//  * W4A16: INT4 weights, group-wise: value = q * scale + min, q in [0, 15], one F16
//    (scale, min) per (row, group of 16 / 32 / 64 / 128 columns), the CPU backend's kInt4.
//  * W8A16: INT8 weights, q in [-128, 127], per output channel (value = q * scale[row]) or
//    group-wise: F16 scales per 32 / 64 / 128 columns (GGUF Q8_0), or F32 scales, with or
//    without mins (value = q * scale + min), per 16 or 32 columns (the K-quants).
//  * W8A8 FP8 (E4M3) through cuBLASLt on devices of compute capability >= 8.9, with the
//    activation quantizer (LaunchQuantizeFp8).
//
// INT4 and INT8 weights are repacked once at load (PackInt4ForGpu, PackInt8ForGpu) into the layout
// the kernel reads with coalesced 16-byte loads; see quantized_gemm.cuh.

/// Weight format of LaunchQuantGemm.
enum class QuantWeightFormat { kInt4, kInt8 };

/// How a group-wise weight's scales are held (QuantGemmParams::scales).
enum class QuantScaleType {
  kF16,         // F16 scale and min: PackInt4ForGpu's scale_min, PackInt8GroupScalesForGpu's
  kF32,         // F32 scales, no mins: PackInt8GroupScalesF32ForGpu's without mins (INT8)
  kF32WithMin,  // F32 scales and mins: PackInt8GroupScalesF32ForGpu's with mins (INT8)
};

/// "INT4" or "INT8", for messages.
std::string_view QuantWeightFormatName(QuantWeightFormat format);

/// Largest m (tokens) one LaunchQuantGemm call takes.
inline constexpr int64_t kQuantGemmMaxM = 256;
/// Most K splits (split-K partitions, summed by a second kernel) of one launch.
inline constexpr int kQuantGemmMaxSplits = 16;

/// INT4 weights in the device layout of LaunchQuantGemm (host memory; upload verbatim).
struct Int4GpuWeight {
  // [n / 16][k / 64][32 lanes][16 bytes]: one 16-byte load per lane per 16 rows x 64 columns,
  // nibbles placed as the mma A fragments want them (quantized_gemm.cuh).
  std::vector<uint8_t> q;
  // F16 [n / 16][k / group][8][4]: for lane row g of a 16-row tile, (scale of row g, scale of row g
  // + 8, min of row g, min of row g + 8): one 8-byte load per lane.
  std::vector<uint16_t> scale_min;
};

/// Repacks INT4 weights from the natural layout: `q` [n, k / 2] bytes, element (r, c) in byte r * k
/// / 2 + c / 2, the low nibble for even c; `scales`, `mins` F16 [n, k / group]. InvalidArgument
/// unless n % 16 == 0, k % 64 == 0 and group is 16, 32, 64 or 128 dividing k. Pure host
/// function; thread-safe.
absl::StatusOr<Int4GpuWeight> PackInt4ForGpu(const uint8_t* q, const uint16_t* scales,
                                             const uint16_t* mins, int64_t n, int64_t k,
                                             int64_t group_size);

/// The inverse of PackInt4ForGpu: natural q [n, k / 2] bytes, scales and mins [n, k / group].
struct Int4NaturalWeight {
  std::vector<uint8_t> q;
  std::vector<uint16_t> scales, mins;
};
absl::StatusOr<Int4NaturalWeight> UnpackInt4FromGpu(const Int4GpuWeight& packed, int64_t n,
                                                    int64_t k, int64_t group_size);

/// Repacks INT8 weights [n, k] (row-major int8) into the device layout [n / 16][k / 32][32
/// lanes][16 bytes]. The per-row F16 scales stay as they are ([n]). InvalidArgument unless n % 16
/// == 0 and k % 64 == 0. Pure host function.
absl::StatusOr<std::vector<uint8_t>> PackInt8ForGpu(const int8_t* q, int64_t n, int64_t k);

/// The inverse of PackInt8ForGpu: [n, k] row-major.
absl::StatusOr<std::vector<int8_t>> UnpackInt8FromGpu(const std::vector<uint8_t>& packed, int64_t n,
                                                      int64_t k);

/// Group-wise INT8 (GGUF Q8_0 and IQ4_NL as Loom holds them: F16 scales [n, k / group_size],
/// value = q * scale) in the INT4 scale/min layout with zero mins, for QuantGemmParams::scales
/// of a grouped INT8 weight. InvalidArgument unless n % 16 == 0, k % 64 == 0 and group_size
/// is 32, 64 or 128 dividing k and below it (one group per row is the per-channel form,
/// whose F16 [n] scales the GEMM takes as they are). Pure host function.
absl::StatusOr<std::vector<uint16_t>> PackInt8GroupScalesForGpu(const uint16_t* scales, int64_t n,
                                                                int64_t k, int64_t group_size);

/// Group-wise INT8 with F32 scales and optional F32 mins (GGUF K-quants as Loom holds them:
/// value = q * scale + min), `scales` and `mins` [n, k / group_size], `mins` null for none:
/// F32 [n / 16][k / group][8][2] (scale of row g, scale of row g + 8) per lane group g
/// (QuantScaleType::kF32), or with mins [8][4] (scale g, scale g + 8, min g, min g + 8)
/// (kF32WithMin). InvalidArgument unless n % 16 == 0, k % 64 == 0 and group_size is 16 or
/// 32. Pure host function.
absl::StatusOr<std::vector<float>> PackInt8GroupScalesF32ForGpu(const float* scales,
                                                                const float* mins, int64_t n,
                                                                int64_t k, int64_t group_size);

/// One quantized GEMM. Activations are dequantization-free: INT4 weights are dequantized in
/// registers to the activation type with one rounding (a fused q * scale + min); INT8 values
/// are exact in F16/BF16 and a per-channel row scale multiplies the F32 sum, while group-wise
/// INT8 scales multiply the values before the MMA (one rounding).
struct QuantGemmParams {
  const void* x = nullptr;              // [m, k] of act_dtype, rows contiguous, 16-byte aligned
  void* y = nullptr;                    // [m, n] of act_dtype, or F32 with f32_out
  const void* bias = nullptr;           // [n] of act_dtype (F32 with bias_f32), or null
  DataType act_dtype = DataType::kF16;  // F16 or BF16
  bool bias_f32 = false;                // the bias is F32 (4-byte aligned), added unrounded
  QuantWeightFormat format = QuantWeightFormat::kInt4;
  const void* weight = nullptr;  // Int4GpuWeight::q or PackInt8ForGpu's bytes, 16-byte aligned
  // kInt4: Int4GpuWeight::scale_min (16-byte aligned); kInt8: F16 [n] per-row scales, or with
  // group_size 32/64/128 PackInt8GroupScalesForGpu's, or with F32 scale types
  // PackInt8GroupScalesF32ForGpu's (16-byte aligned).
  const void* scales = nullptr;
  QuantScaleType scale_type = QuantScaleType::kF16;  // F32 types: INT8 in groups of 16 or 32
  int64_t m = 0;              // tokens, in [0, kQuantGemmMaxM]; 0 is a no-op
  int64_t n = 0;              // output features, a positive multiple of 16
  int64_t k = 0;              // input features, a positive multiple of 64 (and of group_size)
  int64_t group_size = 0;     // kInt4: 16, 32, 64 or 128; kInt8: 0 or k (per output
                              // channel), or 32, 64, 128 (F16 scales per group, applied before
                              // the MMA), or 16, 32 with F32 scales
  int num_splits = 0;         // 0: ChooseQuantGemmSplits; else in [1, kQuantGemmMaxSplits]
  void* workspace = nullptr;  // device scratch of >= QuantGemmWorkspaceBytes(*this) bytes
  size_t workspace_bytes = 0;
  /// With split-K: >= QuantGemmCounterCount(*this) device words, zero before the first
  /// launch. Then the last split of each output tile to finish sums the tile's partials in
  /// the kernel (in split order, the reduce kernel's sum bit for bit) and sets its word back
  /// to 0, so the words stay reusable by any later launch on the same stream (and in
  /// graphs). Null: a second kernel sums the partials.
  uint32_t* counters = nullptr;
  size_t counter_words = 0;  // words at `counters` (checked against QuantGemmCounterCount)
  /// y in F32 (the F32 sums plus the bias, never rounded to act_dtype): what a forward pass
  /// that keeps F32 activations reads, without a conversion launch after the GEMM.
  bool f32_out = false;
};

/// The tile configuration LaunchQuantGemm uses for m tokens of a weight format (the dispatch
/// table; INT4 takes the 256-wide gemv at 9-16 tokens).
struct QuantGemmTile {
  std::string_view name;  // "gemv_m8", "gemv_m16", "gemv_m16_n256", "tile_m32", "tile_m64", ...
  int block_m;            // tokens per block
  int block_n;            // output features per block
  int step_k;             // input features per pipeline stage
  int threads;            // per block
};
QuantGemmTile QuantGemmTileFor(int64_t m, QuantWeightFormat format);

/// Split-K partitions for `m` x `n` x `k` on `num_sms` multiprocessors: 1 when the output tiles
/// already fill the GPU, else enough to reach the tile's target block count, each split at least 4
/// pipeline steps long, at most kQuantGemmMaxSplits; for the tile `format` takes at m.
int ChooseQuantGemmSplits(int64_t m, int64_t n, int64_t k, int num_sms, QuantWeightFormat format);

/// Workspace bytes a launch with these params may need (F32 partial sums, [splits, m, n]): for
/// num_splits when set, else for the most splits the heuristic picks on a GPU of up to 256
/// multiprocessors. 0 when no split is possible.
size_t QuantGemmWorkspaceBytes(const QuantGemmParams& params);

/// Whether the weight's scales are group-wise (INT4; INT8 with F32 scales or group_size below
/// k) rather than one per output channel (INT8 with F16 scales and group_size 0 or k).
bool QuantGemmGrouped(const QuantGemmParams& params);

/// Counter words (QuantGemmParams::counters) a split launch with these params uses: one per
/// output tile of the dispatched config; 0 when no split is possible (as the workspace).
size_t QuantGemmCounterCount(const QuantGemmParams& params);

/// InvalidArgument (naming the field and value) for a shape the kernels cannot run: checked before
/// any CUDA call.
absl::Status CheckQuantGemmParams(const QuantGemmParams& params);

/// Asynchronous on `stream`; thread-safe (no state; the workspace is the caller's).
/// FailedPrecondition without CUDA; launch errors are Internal.
absl::Status LaunchQuantGemm(const QuantGemmParams& params, cudaStream_t stream);

// ------------------------------------------------------------------------------ FP8 (E4M3)

/// E4M3 (the "fn" variant: no infinities, max 448) byte -> float (exact; 0x7f/0xff NaN).
float E4m3ToFloat(uint8_t value);
/// float -> E4M3, round to nearest even, saturating to +-448 (NaN stays NaN). Host-side.
uint8_t FloatToE4m3(float value);
/// Largest finite E4M3 value.
inline constexpr float kE4m3Max = 448.0f;

/// Activations -> E4M3 with one per-tensor scale: out = e4m3(x / scale), x ~= out * scale;
/// or, with row_size, one dynamic scale per row of row_size values (per token: a row's codes
/// and scale do not depend on the other rows of the batch), in one launch.
struct QuantizeFp8Params {
  const void* x = nullptr;    // [count] of in_dtype
  void* out = nullptr;        // [count] E4M3 bytes
  float* scale = nullptr;     // [1] (per row: [count / row_size]), device: written when
                              // dynamic_scale (always per row), else read (> 0)
  bool dynamic_scale = true;  // scale = max|x| / 448 (1 / 448 for all-zero x), computed first
  DataType in_dtype = DataType::kF16;  // F16 or BF16
  int64_t count = 0;                   // >= 0
  int64_t row_size = 0;  // 0: one scale for all; else a divisor of count: a scale per row
};

/// InvalidArgument for a shape or type the quantizer cannot run; before any CUDA call.
absl::Status CheckQuantizeFp8Params(const QuantizeFp8Params& params);

/// Asynchronous on `stream` (dynamic: three small kernels, then the quantizer). FailedPrecondition
/// without CUDA.
absl::Status LaunchQuantizeFp8(const QuantizeFp8Params& params, cudaStream_t stream);

/// Y[m, n] = (X_q[m, k] · W_q[n, k]^T) * x_scale * w_scale (+ bias), E4M3 inputs, F32 accumulation
/// through cuBLASLt, then one epilogue kernel applying the scales and bias.
struct Fp8GemmParams {
  const void* x = nullptr;         // [m, k] E4M3, 16-byte aligned (LaunchQuantizeFp8's out)
  const float* x_scale = nullptr;  // [1], device ([m] with x_scale_per_row)
  bool x_scale_per_row = false;    // QuantizeFp8Params::row_size = k's per-row scales
  const void* weight = nullptr;    // [n, k] E4M3 row-major, 16-byte aligned
  const float* w_scale = nullptr;  // device: [1] per tensor, [n] per channel
  bool per_channel = false;
  const void* bias = nullptr;            // [n] of out_dtype, or null
  void* y = nullptr;                     // [m, n] of out_dtype
  // F16, BF16 or F32 (then y, 16-byte aligned, takes cuBLASLt's sums and is scaled in place:
  // the workspace needs no results buffer).
  DataType out_dtype = DataType::kBF16;
  int64_t m = 0;                         // in [0, 65536]; 0 is a no-op
  int64_t n = 0;                         // a positive multiple of 16
  int64_t k = 0;                         // a positive multiple of 16
  void* workspace = nullptr;             // >= Fp8GemmWorkspaceBytes(*this), 256-byte aligned
  size_t workspace_bytes = 0;
};

/// F32 results [m, n] plus cuBLASLt's scratch.
size_t Fp8GemmWorkspaceBytes(const Fp8GemmParams& params);

/// InvalidArgument for a shape the FP8 path cannot run; before any CUDA call.
absl::Status CheckFp8GemmParams(const Fp8GemmParams& params);

/// True when the current device has FP8 tensor cores (compute capability >= 8.9).
bool Fp8GemmSupported();

/// Asynchronous on `stream`. FailedPrecondition without CUDA or on a device below compute
/// capability 8.9; cuBLASLt errors are Internal. Thread-safe (one process-wide cuBLASLt handle,
/// created on first use for the then-current device).
absl::Status LaunchFp8Gemm(const Fp8GemmParams& params, cudaStream_t stream);

}  // namespace loom::kernels::cuda
