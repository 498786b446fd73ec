#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cpu/weights.h"

namespace loom::kernels::cpu {

/// A weight matrix in one of Loom's integer formats, in plain row-major order (the form
/// `loom quantize` writes to GGUF; PackedWeight is the interleaved form the matmul
/// kernels read). Invariant (ValidateQuantizedMatrix): sizes match the shape and
/// cols % group_size == 0.
struct QuantizedMatrix {
  WeightFormat format = WeightFormat::kInt8;  // kInt8 or kInt4
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t group_size = 0;        // columns per (scale, min); == cols: per output channel
  std::vector<int8_t> q;         // [rows, cols]: INT8 q in [-128, 127]; INT4 q in [0, 15]
  std::vector<uint16_t> scales;  // [rows, cols / group_size], F16
  std::vector<uint16_t> mins;    // kInt4: [rows, cols / group_size], F16; empty for kInt8

  int64_t groups_per_row() const { return group_size > 0 ? cols / group_size : 0; }
};

/// Round-to-nearest of one group of `count` values, the rule every Loom quantizer uses:
/// INT8 symmetric (scale = F16(max|w| / 127), q = round(w / scale) in [-127, 127]); INT4
/// asymmetric (min = F16(min w), scale = F16((max w - min) / 15), q = round((w - min) /
/// scale) in [0, 15]); INT5 as INT4 over [0, 31]. Writes q[count], *scale and (INT4,
/// INT5) *min. Thread-safe.
void QuantizeGroupRtn(const float* values, int64_t count, WeightFormat format, int8_t* q,
                      uint16_t* scale, uint16_t* min);

/// Round-to-nearest quantization of F32 values [rows, cols], group by group of
/// `group_size` columns, with exactly PackFromF32's arithmetic: INT8 symmetric
/// (scale = F16(max|w| / 127), q = round(w / scale)); INT4 asymmetric (min = F16(min w),
/// scale = F16((max w - min) / 15), q = round((w - min) / scale) clamped to [0, 15]).
/// InvalidArgument for another format or a group size that is not a positive multiple of
/// 32 dividing cols. Thread-safe.
absl::StatusOr<QuantizedMatrix> QuantizeRtn(const float* values, int64_t rows, int64_t cols,
                                            WeightFormat format, int64_t group_size);

/// Checks a matrix read from a file: format, shape, group size, array sizes and q ranges.
/// InvalidArgument naming what is wrong.
absl::Status ValidateQuantizedMatrix(const QuantizedMatrix& matrix);

/// Scalar reference dequantization into out [rows, cols]: q * scale (+ min for INT4).
/// Equals DequantizeRows of PackQuantized(matrix) bit for bit (up to the sign of zero).
void DequantizeMatrix(const QuantizedMatrix& matrix, float* out);

/// Packs `matrix` into the backend layout without loss (the same q, scales and mins).
/// InvalidArgument when ValidateQuantizedMatrix fails.
absl::StatusOr<PackedWeight> PackQuantized(const QuantizedMatrix& matrix);

/// Columns [col_begin, col_begin + num_cols) of every row, for tensor-parallel
/// row-parallel layers. The slice must fall on group boundaries, or the matrix must have
/// one group per row (per-channel INT8: the slice keeps the row's scale, its group becomes
/// num_cols, which must be a multiple of 32). InvalidArgument otherwise.
absl::StatusOr<QuantizedMatrix> SliceColumns(const QuantizedMatrix& matrix, int64_t col_begin,
                                             int64_t num_cols);

}  // namespace loom::kernels::cpu
