#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/types.h"
#include "kernels/cuda_device.h"

namespace loom::kernels::cuda {

/// One layer's paged KV cache in device memory, laid out as cpu::KvLayerView:
/// [num_blocks, block_size, num_kv_heads, head_dim] for K and for V. Slot s
/// (= block * block_size + offset) holds one token's K/V.
struct KvCacheView {
  void* k = nullptr;                // [num_blocks, block_size, num_kv_heads, head_dim] of dtype
  void* v = nullptr;                // same shape as k
  DataType dtype = DataType::kF16;  // F16 or BF16
  int64_t num_blocks = 0;           // >= 1
  int64_t block_size = 16;          // >= 1
  int64_t num_kv_heads = 0;         // >= 1
  int64_t head_dim = 0;             // >= 1
};

/// InvalidArgument for a KV cache view the CUDA kernels cannot use (dtype, sizes).
absl::Status CheckKvCacheView(const KvCacheView& cache);

/// New tokens' K/V into their slots, as cpu::WriteKv (values rounded to the cache dtype).
/// Slots come from the device and are trusted like block tables (the host validates the
/// step batch): a negative slot marks a padding token and is skipped, and a slot beyond
/// the pool is skipped too, so the kernel never writes outside the pool.
struct WriteKvParams {
  KvCacheView cache;
  const void* k = nullptr;  // [num_tokens] rows of [num_kv_heads, head_dim], k_stride apart
  const void* v = nullptr;  // [num_tokens] rows of [num_kv_heads, head_dim], v_stride apart
  DataType src_dtype = DataType::kF32;  // of k and v: F32, F16 or BF16
  int64_t k_stride = 0;            // elements between tokens' k rows; 0: num_kv_heads * head_dim
  int64_t v_stride = 0;            // elements between tokens' v rows; 0: num_kv_heads * head_dim
  const int32_t* slots = nullptr;  // [num_tokens], device
  int64_t num_tokens = 0;          // >= 0, <= 2^31 - 1
};

/// InvalidArgument (naming the field and value) for a shape the kernel cannot run.
absl::Status CheckWriteKvParams(const WriteKvParams& params);

/// Asynchronous on `stream`, one block per token; thread-safe (no state). FailedPrecondition
/// without CUDA.
absl::Status LaunchWriteKv(const WriteKvParams& params, cudaStream_t stream);

}  // namespace loom::kernels::cuda
