#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/types.h"
#include "kernels/cuda_device.h"

namespace loom::kernels::cuda {

/// Copies rows of a device table picked by index, converting src_dtype -> dst_dtype:
/// out[i] = table[indices[i] - index_offset]. A row index outside [0, num_rows) yields a
/// row of zeros (a tensor-parallel rank holding a vocabulary slice adds zeros for tokens
/// outside it; the kernel never reads outside the table). Serves as the embedding lookup
/// (indices = token ids) and the gather of the rows whose logits are sampled.
struct GatherRowsParams {
  const void* table = nullptr;       // [num_rows, row_size] of src_dtype
  const int32_t* indices = nullptr;  // [num_indices], device
  void* out = nullptr;               // [num_indices, row_size] of dst_dtype
  DataType src_dtype = DataType::kF16;
  DataType dst_dtype = DataType::kF32;
  int64_t num_rows = 0;      // >= 1
  int64_t row_size = 0;      // >= 1
  int64_t num_indices = 0;   // >= 0, <= 2^31 - 1
  int64_t index_offset = 0;  // subtracted from every index (vocab0 of a rank's slice)
  float scale = 1.0f;        // every gathered value is multiplied by it (Gemma's embedding)
};

/// InvalidArgument (naming the field and value) for a shape the kernel cannot run.
absl::Status CheckGatherRowsParams(const GatherRowsParams& params);

/// Asynchronous on `stream`, one block per output row; thread-safe (no state).
/// FailedPrecondition without CUDA.
absl::Status LaunchGatherRows(const GatherRowsParams& params, cudaStream_t stream);

/// The inverse of a gather, weighted (a mixture-of-experts layer adding one expert's
/// outputs into its tokens' rows): out[indices[i]] += weights[i] * rows[i], in F32. The
/// indices must be distinct within a launch (each output row is updated once, no atomics).
struct ScatterAddRowsParams {
  const float* rows = nullptr;       // [num_indices, row_size]
  const int32_t* indices = nullptr;  // [num_indices], device, each in [0, num_out_rows)
  const float* weights = nullptr;    // [num_indices], device
  float* out = nullptr;              // [num_out_rows, row_size]
  int64_t num_out_rows = 0;          // >= 1
  int64_t row_size = 0;              // >= 1
  int64_t num_indices = 0;           // >= 0, <= 2^31 - 1
};

/// InvalidArgument (naming the field and value) for a shape the kernel cannot run.
absl::Status CheckScatterAddRowsParams(const ScatterAddRowsParams& params);

/// Asynchronous on `stream`, one block per input row; an index outside [0, num_out_rows)
/// is skipped. Thread-safe (no state). FailedPrecondition without CUDA.
absl::Status LaunchScatterAddRows(const ScatterAddRowsParams& params, cudaStream_t stream);

/// Most parts SplitColumns writes in one launch (fused QKV: 3; gate/up: 2).
inline constexpr int kSplitColumnsMaxParts = 4;

/// x's columns, left to right, into the parts (F32): part j gets columns [offset_j,
/// offset_j + cols[j]) of every row, where offset_j sums the cols before it. One launch
/// where a copy per part would be one each (the fused QKV row split every layer).
struct SplitColumnsParams {
  const float* x = nullptr;  // [rows, x_stride]
  int64_t x_stride = 0;      // elements between x's rows; 0: the sum of cols (>= that sum)
  float* parts[kSplitColumnsMaxParts] = {};  // part j: [rows, cols[j]]
  int64_t cols[kSplitColumnsMaxParts] = {};
  int num_parts = 0;  // in [1, kSplitColumnsMaxParts]
  int64_t rows = 0;   // >= 0
};

/// InvalidArgument (naming the field and value) for a shape the kernel cannot run.
absl::Status CheckSplitColumnsParams(const SplitColumnsParams& params);

/// Asynchronous on `stream`; thread-safe (no state). FailedPrecondition without CUDA.
absl::Status LaunchSplitColumns(const SplitColumnsParams& params, cudaStream_t stream);

}  // namespace loom::kernels::cuda
