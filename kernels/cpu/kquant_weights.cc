// The K-quants packed into F32-scaled INT4/INT8 weights without changing any value
// (weights.h): each 256-weight super-block's sub-blocks become groups whose F32 scale is
// the F16 super-block scale times the sub-block's integer scale, and whose min is the
// negated sub-block min (common/formats/kquant_block.h). Q4_K -> INT4 g32, Q5_K -> INT8 g32
// with mins (q 0..31), Q6_K -> INT8 g16, Q2_K -> INT4 g16 (q 0..3), Q3_K -> INT4 g16 as
// q + 4 with min -4 * scale (q * scale + min is then the exact value d * (q - 4)).

#include <cstdint>

#include "absl/strings/str_format.h"
#include "common/formats/kquant_block.h"
#include "common/status_macros.h"
#include "kernels/cpu/weights_internal.h"

namespace loom::kernels::cpu::internal {

absl::StatusOr<PackedWeight> PackKQuantBlocks(common::GgmlType type, const uint8_t* src,
                                              int64_t rows, int64_t cols) {
  using common::GgmlType;
  const std::string type_name = common::RawGgmlTypeName(static_cast<uint32_t>(type));
  if (!common::IsKQuant(type)) {
    return absl::InvalidArgumentError(absl::StrFormat("%s is not a K-quant", type_name));
  }
  if (cols % common::kKQuantBlockSize != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s tensor: cols %d is not a multiple of %d", type_name, cols, common::kKQuantBlockSize));
  }
  const bool int8 = type == GgmlType::kQ5_K || type == GgmlType::kQ6_K;
  const WeightFormat format = int8 ? WeightFormat::kInt8 : WeightFormat::kInt4;
  const int64_t group =
      type == GgmlType::kQ4_K || type == GgmlType::kQ5_K ? 32 : 16;
  LOOM_ASSIGN_OR_RETURN(PackedWeight w, Allocate(format, rows, cols, group, true));
  LOOM_ASSIGN_OR_RETURN(common::GgmlTypeTraits traits,
                        common::GetGgmlTypeTraits(static_cast<uint32_t>(type)));
  const int64_t blocks_per_row = cols / common::kKQuantBlockSize;
  const int64_t sub_blocks = common::kKQuantBlockSize / group;
  LOOM_RETURN_IF_ERROR(ForEachRowRun(rows, cols, [&](int64_t first, int64_t end) {
    common::KQuantBlock block;
    for (int64_t row = first; row < end; ++row) {
      for (int64_t b = 0; b < blocks_per_row; ++b) {
        common::DecodeKQuantBlock(type, src + (row * blocks_per_row + b) * traits.type_size, block);
        const int64_t c0 = b * common::kKQuantBlockSize;
        const int offset = type == GgmlType::kQ3_K ? 4 : 0;
        for (int64_t s = 0; s < sub_blocks; ++s) {
          const int64_t index = GroupIndex(w, row, b * sub_blocks + s);
          w.scales_f32[index] = block.scale[s];
          w.mins_f32[index] = type == GgmlType::kQ3_K ? -4.0f * block.scale[s] : block.min[s];
        }
        for (int i = 0; i < common::kKQuantBlockSize; ++i) {
          SetQ(w, row, c0 + i, block.q[i] + offset);
        }
      }
    }
    return absl::OkStatus();
  }));
  w.source = absl::StrFormat("%s -> %s g%d, F32 scales (lossless)", type_name,
                             WeightFormatName(format), group);
  return w;
}

}  // namespace loom::kernels::cpu::internal
