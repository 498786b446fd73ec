#pragma once

// Internal to kernels/cpu: element access to packed weights, shared by weights.cc (the
// plain formats, concatenation, dequantization) and kquant_weights.cc (the K-quants).

#include <cstdint>
#include <functional>

#include "absl/status/statusor.h"
#include "common/formats/ggml_type.h"
#include "kernels/cpu/weights.h"

namespace loom::kernels::cpu::internal {

/// Group sizes of F32-scaled weights are multiples of this (the K-quants' sub-blocks of 16
/// and 32); F16-scaled ones of kActGroup (32).
inline constexpr int64_t kF32ScaledGroupUnit = 16;

bool IsInteger(WeightFormat format);
/// INT4 and INT5 store a min per group; INT8 and NL4 (signed values) do not.
inline bool HasMins(WeightFormat format) {
  return format == WeightFormat::kInt4 || format == WeightFormat::kInt5;
}

/// An empty (zero-filled) weight of the given shape in the packed layout; integer formats
/// get F16 or (`f32_scales`) F32 scales and mins. InvalidArgument for bad shapes or groups.
absl::StatusOr<PackedWeight> Allocate(WeightFormat format, int64_t rows, int64_t cols,
                                      int64_t group_size, bool f32_scales = false);

/// Index of (row, group) in the scale and min arrays.
int64_t GroupIndex(const PackedWeight& w, int64_t row, int64_t group);
/// The row block holding `row`.
uint8_t* BlockData(PackedWeight& w, int64_t row);
/// fn(first_row, end_row) over [0, rows) in runs of whole row blocks (rows that share a
/// block's bytes stay in one call), split across the host's threads when the weight is
/// large (packing a layer at load). fn may run on several threads at once. The error of
/// the lowest run that failed, whatever the threads' order; OK when none did.
absl::Status ForEachRowRun(int64_t rows, int64_t cols,
                           const std::function<absl::Status(int64_t, int64_t)>& fn);
const uint8_t* BlockData(const PackedWeight& w, int64_t row);

/// Per-element access for the integer formats: q as stored (INT8: signed q, INT4:
/// 0..15), for NL4 the code's level (SetQ takes a level of `w.levels`).
void SetQ(PackedWeight& w, int64_t row, int64_t col, int q);
/// The low four bits of q (INT4, INT5) or an NL4 code into row r < 16, column `col` of a
/// row block's `block` bytes.
void SetCode(uint8_t* block, int64_t r, int64_t col, int code);
int GetQ(const PackedWeight& w, int64_t row, int64_t col);

/// Scale and min of group `index` (GroupIndex) as floats, whichever precision is stored.
/// "No min" (INT8 without one) is -0.0f: q * scale + -0 is q * scale exactly, zero's sign
/// included, so F32-scaled kernels add the min unconditionally.
float GroupScale(const PackedWeight& w, int64_t index);
float GroupMin(const PackedWeight& w, int64_t index);

/// The K-quants (Q4_K, Q5_K, Q6_K, Q3_K, Q2_K) packed into F32-scaled INT4/INT8 without
/// loss (kquant_weights.cc). InvalidArgument for other types or widths that are not a
/// multiple of 256.
absl::StatusOr<PackedWeight> PackKQuantBlocks(common::GgmlType type, const uint8_t* src,
                                              int64_t rows, int64_t cols);

}  // namespace loom::kernels::cpu::internal
