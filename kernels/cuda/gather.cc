#include "kernels/cuda/gather.h"

#include <cmath>

#include "absl/strings/str_format.h"

namespace loom::kernels::cuda {

absl::Status CheckGatherRowsParams(const GatherRowsParams& p) {
  if (p.num_rows < 1 || p.row_size < 1 || p.num_indices < 0 || p.num_indices > 0x7fffffff) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "GatherRows: num_rows %d and row_size %d must be positive, num_indices %d in [0, 2^31)",
        p.num_rows, p.row_size, p.num_indices));
  }
  if (p.row_size > int64_t{65535} * 2048) {  // the grid's column chunks
    return absl::InvalidArgumentError(
        absl::StrFormat("GatherRows: row_size %d over 65535 * 2048", p.row_size));
  }
  if (p.num_indices > 0 && (p.table == nullptr || p.indices == nullptr || p.out == nullptr)) {
    return absl::InvalidArgumentError("GatherRows: null table, indices or out");
  }
  if (!std::isfinite(p.scale)) {
    return absl::InvalidArgumentError(absl::StrFormat("GatherRows: scale %g not finite", p.scale));
  }
  return absl::OkStatus();
}

absl::Status CheckScatterAddRowsParams(const ScatterAddRowsParams& p) {
  if (p.num_out_rows < 1 || p.row_size < 1 || p.num_indices < 0 || p.num_indices > 0x7fffffff) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "ScatterAddRows: num_out_rows %d and row_size %d must be positive, num_indices %d in "
        "[0, 2^31)",
        p.num_out_rows, p.row_size, p.num_indices));
  }
  if (p.num_indices > 0 &&
      (p.rows == nullptr || p.indices == nullptr || p.weights == nullptr || p.out == nullptr)) {
    return absl::InvalidArgumentError("ScatterAddRows: null rows, indices, weights or out");
  }
  return absl::OkStatus();
}

absl::Status CheckSplitColumnsParams(const SplitColumnsParams& p) {
  if (p.num_parts < 1 || p.num_parts > kSplitColumnsMaxParts || p.rows < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("SplitColumns: num_parts %d must be in [1, %d] and rows %d >= 0",
                        p.num_parts, kSplitColumnsMaxParts, p.rows));
  }
  int64_t width = 0;
  for (int j = 0; j < p.num_parts; ++j) {
    if (p.cols[j] < 1) {
      return absl::InvalidArgumentError(
          absl::StrFormat("SplitColumns: part %d has %d columns (>= 1)", j, p.cols[j]));
    }
    if (p.rows > 0 && p.parts[j] == nullptr) {
      return absl::InvalidArgumentError(absl::StrFormat("SplitColumns: null part %d", j));
    }
    width += p.cols[j];
  }
  if (p.rows > 0 && p.x == nullptr) return absl::InvalidArgumentError("SplitColumns: null x");
  if (p.x_stride != 0 && p.x_stride < width) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "SplitColumns: x_stride %d shorter than the parts' %d columns", p.x_stride, width));
  }
  if (p.rows * width > (int64_t{1} << 40)) {
    return absl::InvalidArgumentError("SplitColumns: more than 2^40 elements");
  }
  return absl::OkStatus();
}

#if !LOOM_HAVE_CUDA
absl::Status LaunchSplitColumns(const SplitColumnsParams& params, cudaStream_t) {
  if (absl::Status status = CheckSplitColumnsParams(params); !status.ok()) return status;
  return absl::FailedPreconditionError("SplitColumns: Loom was built without CUDA");
}

absl::Status LaunchGatherRows(const GatherRowsParams& params, cudaStream_t) {
  if (absl::Status status = CheckGatherRowsParams(params); !status.ok()) return status;
  return absl::FailedPreconditionError("GatherRows: Loom was built without CUDA");
}

absl::Status LaunchScatterAddRows(const ScatterAddRowsParams& params, cudaStream_t) {
  if (absl::Status status = CheckScatterAddRowsParams(params); !status.ok()) return status;
  return absl::FailedPreconditionError("ScatterAddRows: Loom was built without CUDA");
}
#endif

}  // namespace loom::kernels::cuda
