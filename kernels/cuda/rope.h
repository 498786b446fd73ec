#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/types.h"
#include "kernels/cuda_device.h"

namespace loom::kernels::cuda {

/// Rotary position embedding in place on device Q and K, with cpu::Rope's semantics: the
/// angle is the float product position * inv_freq[i]; its cosine and sine are computed in
/// float (full-precision sincosf), then
/// multiplied by attention_factor. Rows may be strided so RoPE runs on a fused QKV buffer.
struct RopeParams {
  void* q = nullptr;                   // [num_tokens] rows of [num_heads, head_dim], q_stride apart
  void* k = nullptr;                   // [num_tokens] rows of [num_kv_heads, head_dim], or nullptr
  const int32_t* positions = nullptr;  // [num_tokens], device
  const float* inv_freq = nullptr;     // [rope_dim / 2], device, scaling already applied
  DataType dtype = DataType::kF32;     // of q and k
  int64_t num_tokens = 0;              // >= 0
  int64_t num_heads = 0;               // >= 1
  int64_t num_kv_heads = 0;            // >= 1 when k is set
  int64_t head_dim = 0;                // even, in [2, 1024]
  int64_t rope_dim = 0;                // even, in [2, head_dim]; the rest pass through
  int64_t q_stride = 0;                // elements between tokens' q rows; 0: num_heads * head_dim
  int64_t k_stride = 0;  // elements between tokens' k rows; 0: num_kv_heads * head_dim
  bool neox = false;     // false: pairs (2i, 2i+1); true: (i, i + rope_dim / 2)
  float attention_factor = 1.0f;  // multiplies cos and sin (YaRN's attention scaling); > 0
};

/// InvalidArgument (naming the field and value) for a shape the kernel cannot run.
absl::Status CheckRopeParams(const RopeParams& params);

/// Asynchronous on `stream`, one block per token; thread-safe (no state). FailedPrecondition
/// without CUDA.
absl::Status LaunchRope(const RopeParams& params, cudaStream_t stream);

}  // namespace loom::kernels::cuda
