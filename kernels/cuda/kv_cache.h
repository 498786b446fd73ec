#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/types.h"
#include "kernels/cuda_device.h"

namespace loom::kernels::cuda {

/// 8-bit KV cache types (--kv-cache-dtype), as cpu::KvDtype's: each token's row of one KV
/// head is rotated by the normalized Walsh-Hadamard matrix (cpu::RotatesKv: head dims are
/// powers of two here) and stored as head_dim codes and one BF16 scale, value = code x
/// scale; int8 symmetric (scale = max|x| / 127 rounded up to BF16), fp8 OCP E4M3FN
/// (max|x| / 448). The attention kernels dequantize inside; the caller rotates the query
/// before them and their output after (LaunchRotateHeads), as cpu::PagedAttention does.
enum class KvQuant { kNone, kInt8, kFp8E4m3 };

/// One layer's paged KV cache in device memory, laid out as cpu::KvLayerView:
/// [num_blocks, block_size, num_kv_heads, head_dim] for K and for V. Slot s
/// (= block * block_size + offset) holds one token's K/V.
struct KvCacheView {
  void* k = nullptr;  // [num_blocks, block_size, num_kv_heads, head_dim] of dtype (or codes)
  void* v = nullptr;  // same shape as k
  // F16 or BF16: the element type, or with `quant` the type the kernels compute in.
  DataType dtype = DataType::kF16;
  int64_t num_blocks = 0;          // >= 1
  int64_t block_size = 16;         // >= 1
  int64_t num_kv_heads = 0;        // >= 1
  int64_t head_dim = 0;            // >= 1; with quant a power of two in [32, 256]
  KvQuant quant = KvQuant::kNone;  // kInt8/kFp8E4m3: k and v hold 1-byte codes
  // With quant: [num_blocks, block_size, num_kv_heads] BF16 bits, one per row of k (v).
  uint16_t* k_scale = nullptr;
  uint16_t* v_scale = nullptr;
};

/// Bytes of one stored K or V element: 1 for the 8-bit types, else dtype's.
int64_t KvCodeBytes(const KvCacheView& cache);

/// InvalidArgument for a KV cache view the CUDA kernels cannot use (dtype, sizes; 2^32 cache rows,
/// slots x KV heads, or more).
absl::Status CheckKvCacheView(const KvCacheView& cache);

namespace internal {
/// The attention kernels address a pool's rows (slot x num_kv_heads + kv_head) in 32 bits
/// (CheckKvCacheView keeps them below this value); this one marks "no row" (a tile row past the
/// span, or one the block table cannot resolve: zero-filled).
inline constexpr uint32_t kNoCacheRow = 0xffffffffu;
}  // namespace internal

/// New tokens' K/V into their slots, as cpu::WriteKv (values rounded to the cache dtype;
/// the 8-bit types rotate, scale and round each row as cpu::QuantizeKvRow does, so F32
/// input gives cpu::WriteKv's codes and scales bit for bit).
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

/// Rotates each head_dim-long row by the normalized Walsh-Hadamard matrix (cpu::RotateKvRow,
/// the same additions in the same order: F32 output equals it bit for bit): the query
/// before attention over an 8-bit cache, and its output after. src: F32 rows; dst: F32,
/// F16 or BF16 rows (may be src itself when F32).
struct RotateHeadsParams {
  const float* src = nullptr;  // [rows, head_dim]
  void* dst = nullptr;         // [rows, head_dim] of dst_dtype
  DataType dst_dtype = DataType::kF32;
  int64_t rows = 0;      // >= 0, < 2^31
  int64_t head_dim = 0;  // a power of two in [32, 256]
};

absl::Status CheckRotateHeadsParams(const RotateHeadsParams& params);

/// Asynchronous on `stream`, one warp per row. FailedPrecondition without CUDA.
absl::Status LaunchRotateHeads(const RotateHeadsParams& params, cudaStream_t stream);

}  // namespace loom::kernels::cuda
