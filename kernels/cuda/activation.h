#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/types.h"
#include "kernels/cuda_device.h"

namespace loom::kernels::cuda {

/// The gate's activation of a gated feed-forward layer.
enum class GateActivation {
  kSilu,       // SwiGLU (Llama, Qwen, Mistral): as cpu::SiluMul
  kGeluTanh,   // GeGLU with the tanh approximation (Gemma): as cpu::GeluTanhMul
  kSwigluOai,  // OpenAI's clamped SwiGLU (gpt-oss's experts): as cpu::SwigluOaiMul
};

/// A gated activation on the device: out[t, i] = act(gate_up[t, i]) * gate_up[t, ffn + i]
/// (kSwigluOai: g * sigmoid(1.702 g) * (u + 1) with g = min(gate, limit) and
/// u = clamp(up, -limit, limit)), computed in float (expf/tanhf, no fast-math, the CPU's
/// order of operations) and rounded once to dtype.
struct SiluMulParams {
  const void* gate_up = nullptr;  // [num_tokens, 2 * ffn] of dtype (gate, then up)
  void* out = nullptr;            // [num_tokens, ffn] of dtype
  DataType dtype = DataType::kF32;
  int64_t num_tokens = 0;  // >= 0
  int64_t ffn = 0;         // >= 1
  GateActivation activation = GateActivation::kSilu;
  float limit = 0.0f;  // kSwigluOai only: the clamp, finite and > 0
  /// Also `out` rounded to low_dtype (F16 or BF16) here, or nullptr: the down projection's
  /// input without a conversion launch of its own.
  void* out_low = nullptr;  // [num_tokens, ffn] of low_dtype
  DataType low_dtype = DataType::kF16;
};

/// InvalidArgument (naming the field and value) for a shape the kernel cannot run.
absl::Status CheckSiluMulParams(const SiluMulParams& params);

/// Asynchronous on `stream`; thread-safe (no state). FailedPrecondition without CUDA.
absl::Status LaunchSiluMul(const SiluMulParams& params, cudaStream_t stream);

/// An element-wise map in place, computed in float.
enum class InPlaceOp {
  kSoftCap,  // x[i] = value * tanh(x[i] / value), as cpu::SoftCap (Gemma 2's final logits)
  kScale,    // x[i] = value * x[i], as cpu::Scale (Granite's multipliers)
};

struct InPlaceParams {
  void* x = nullptr;  // [num_elements] of dtype
  DataType dtype = DataType::kF32;
  int64_t num_elements = 0;  // >= 0
  InPlaceOp op = InPlaceOp::kScale;
  float value = 1.0f;  // finite; > 0 for kSoftCap (the cap)
};

/// InvalidArgument (naming the field and value) for a shape the kernel cannot run.
absl::Status CheckInPlaceParams(const InPlaceParams& params);

/// Asynchronous on `stream`; thread-safe (no state). FailedPrecondition without CUDA.
absl::Status LaunchInPlace(const InPlaceParams& params, cudaStream_t stream);

/// out[t, i] += s_t * x[t, i] with s_t = 1 / (1 + expf(-gate_logits[t])), or s_t = 1
/// without gate logits: as cpu::AddSigmoidGatedRows (a gated shared expert joining the
/// routed experts' sum), in float, F32 tensors.
struct AddGatedRowsParams {
  const float* x = nullptr;            // [rows, cols]
  const float* gate_logits = nullptr;  // [rows], or nullptr: no gate
  float* out = nullptr;                // [rows, cols], added to
  int64_t rows = 0;                    // >= 0
  int64_t cols = 0;                    // >= 1
};

/// InvalidArgument (naming the field and value) for a shape the kernel cannot run.
absl::Status CheckAddGatedRowsParams(const AddGatedRowsParams& params);

/// Asynchronous on `stream`; thread-safe (no state). FailedPrecondition without CUDA.
absl::Status LaunchAddGatedRows(const AddGatedRowsParams& params, cudaStream_t stream);

}  // namespace loom::kernels::cuda
