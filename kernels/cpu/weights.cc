#include "kernels/cpu/weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/matmul_internal.h"
#include "kernels/cpu/quantize.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/weights_internal.h"

namespace loom::kernels::cpu {

const char* WeightFormatName(WeightFormat format) {
  switch (format) {
    case WeightFormat::kF32:
      return "F32";
    case WeightFormat::kF16:
      return "F16";
    case WeightFormat::kBf16:
      return "BF16";
    case WeightFormat::kInt8:
      return "INT8";
    case WeightFormat::kInt4:
      return "INT4";
    case WeightFormat::kInt5:
      return "INT5";
    case WeightFormat::kNl4:
      return "NL4";
  }
  return "?";
}

namespace internal {

bool IsInteger(WeightFormat format) {
  return format == WeightFormat::kInt8 || format == WeightFormat::kInt4 ||
         format == WeightFormat::kInt5 || format == WeightFormat::kNl4;
}

absl::StatusOr<PackedWeight> Allocate(WeightFormat format, int64_t rows, int64_t cols,
                                      int64_t group_size, bool f32_scales) {
  if (rows <= 0 || cols <= 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("weight shape [%d, %d] must be positive", rows, cols));
  }
  if (IsInteger(format)) {
    const int64_t unit = f32_scales ? kF32ScaledGroupUnit : kActGroup;
    if (group_size <= 0 || group_size % unit != 0 || cols % group_size != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s weight: group size %d must be a positive multiple of %d dividing cols %d",
          WeightFormatName(format), group_size, unit, cols));
    }
    if ((format == WeightFormat::kInt5 || format == WeightFormat::kNl4) && f32_scales) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s weight: F32 scales are not supported", WeightFormatName(format)));
    }
  } else {
    group_size = 0;
    f32_scales = false;
  }
  PackedWeight weight;
  weight.format = format;
  weight.rows = rows;
  weight.cols = cols;
  weight.group_size = group_size;
  const int64_t blocks = NumRowBlocks(rows);
  // INT8 stores q + 128: a zero-filled padding row would read as -128, so pad with 128.
  weight.data.assign(blocks * BlockDataBytes(format, cols),
                     format == WeightFormat::kInt8 ? uint8_t{128} : uint8_t{0});
  if (IsInteger(format)) {
    const size_t groups = static_cast<size_t>(blocks * (cols / group_size) * kRowBlock);
    if (f32_scales) {
      weight.scales_f32.assign(groups, 0.0f);
      weight.mins_f32.assign(groups, -0.0f);  // no min: -0 adds nothing (GroupMin)
    } else {
      weight.scales.assign(groups, 0);
      if (HasMins(format)) weight.mins.assign(groups, 0);
    }
  }
  return weight;
}

int64_t GroupIndex(const PackedWeight& w, int64_t row, int64_t group) {
  return ((row / kRowBlock) * (w.cols / w.group_size) + group) * kRowBlock + row % kRowBlock;
}

uint8_t* BlockData(PackedWeight& w, int64_t row) {
  return w.data.data() + (row / kRowBlock) * BlockDataBytes(w.format, w.cols);
}
const uint8_t* BlockData(const PackedWeight& w, int64_t row) {
  return w.data.data() + (row / kRowBlock) * BlockDataBytes(w.format, w.cols);
}

void SetCode(uint8_t* block, int64_t r, int64_t col, int code) {
  uint8_t* byte = block + IntByteOffset(WeightFormat::kInt4, r, col);
  *byte = col % 8 < 4 ? static_cast<uint8_t>((*byte & 0xf0) | (code & 0x0f))
                      : static_cast<uint8_t>((*byte & 0x0f) | ((code & 0x0f) << 4));
}

void SetQ(PackedWeight& w, int64_t row, int64_t col, int q) {
  if (w.format == WeightFormat::kInt8) {
    BlockData(w, row)[IntByteOffset(w.format, row % kRowBlock, col)] =
        static_cast<uint8_t>(q + 128);
  } else if (w.format == WeightFormat::kNl4) {
    // The first code of that level (MXFP4's -0 and +0 are one value). Every caller copies
    // levels of a weight with the same table.
    const auto code = std::find(w.levels.begin(), w.levels.end(), q) - w.levels.begin();
    SetCode(BlockData(w, row), row % kRowBlock, col, static_cast<int>(code));
  } else {
    SetCode(BlockData(w, row), row % kRowBlock, col, q);
  }
  if (w.format == WeightFormat::kInt5) {
    uint8_t* word = BlockData(w, row) + Int5HighOffset(w.cols, row % kRowBlock, col / 32);
    uint32_t high;
    std::memcpy(&high, word, sizeof(high));
    const uint32_t bit = uint32_t{1} << Int5HighBit(col);
    high = (q & 0x10) != 0 ? (high | bit) : (high & ~bit);
    std::memcpy(word, &high, sizeof(high));
  }
}

int GetQ(const PackedWeight& w, int64_t row, int64_t col) {
  const int q = BlockQ(BlockData(w, row), w.format, w.cols, row % kRowBlock, col);
  return w.format == WeightFormat::kNl4 ? w.levels[static_cast<size_t>(q)] : q;
}

float GroupScale(const PackedWeight& w, int64_t index) {
  return w.f32_scaled() ? w.scales_f32[index] : HalfToFloat(w.scales[index]);
}

float GroupMin(const PackedWeight& w, int64_t index) {
  if (w.f32_scaled()) return w.mins_f32[index];
  return HasMins(w.format) ? HalfToFloat(w.mins[index]) : -0.0f;
}

absl::Status ForEachRowRun(int64_t rows, int64_t cols,
                           const std::function<absl::Status(int64_t, int64_t)>& fn) {
  const int64_t blocks = (rows + kRowBlock - 1) / kRowBlock;
  absl::Mutex mu;
  absl::Status failure;     // of the lowest run that failed, whatever the threads' order
  int64_t failed = blocks;  // that run's first block
  ParallelForOnce(blocks, std::max<int64_t>(1, (int64_t{1} << 20) / (kRowBlock * cols)),
                  [&](int64_t first, int64_t end) {
                    absl::Status status = fn(first * kRowBlock, std::min(rows, end * kRowBlock));
                    if (status.ok()) return;
                    absl::MutexLock lock(&mu);
                    if (first < failed) {
                      failed = first;
                      failure = std::move(status);
                    }
                  });
  return failure;
}

}  // namespace internal
namespace {

using internal::Allocate;
using internal::Bf16Index;
using internal::BlockData;
using internal::BlockDataBytes;
using internal::GetQ;
using internal::GroupIndex;
using internal::GroupMin;
using internal::GroupScale;
using internal::HalfToFloat;
using internal::HasMins;
using internal::IsInteger;
using internal::kRowBlock;
using internal::NumRowBlocks;
using internal::SetCode;
using internal::SetQ;

// Quantizes one group of F32 values with round-to-nearest (QuantizeGroupRtn) into row
// `row`, group `g`.
void QuantizeGroup(const float* values, PackedWeight& w, int64_t row, int64_t g) {
  const int64_t gs = w.group_size;
  const int64_t index = GroupIndex(w, row, g);
  std::vector<int8_t> q(static_cast<size_t>(gs));
  uint16_t min = 0;
  QuantizeGroupRtn(values, gs, w.format, q.data(), &w.scales[index], &min);
  if (HasMins(w.format)) w.mins[index] = min;
  for (int64_t j = 0; j < gs; ++j) SetQ(w, row, g * gs + j, q[static_cast<size_t>(j)]);
}

// Writes one row of F32 values in `w`'s format.
void SetRowFromF32(PackedWeight& w, int64_t row, const float* values) {
  const int64_t r = row % kRowBlock;
  switch (w.format) {
    case WeightFormat::kF32: {
      float* block = reinterpret_cast<float*>(BlockData(w, row));
      for (int64_t c = 0; c < w.cols; ++c) block[c * kRowBlock + r] = values[c];
      return;
    }
    case WeightFormat::kF16: {
      uint16_t* block = reinterpret_cast<uint16_t*>(BlockData(w, row));
      for (int64_t c = 0; c < w.cols; ++c) block[c * kRowBlock + r] = FloatToHalf(values[c]);
      return;
    }
    case WeightFormat::kBf16: {
      uint16_t* block = reinterpret_cast<uint16_t*>(BlockData(w, row));
      for (int64_t c = 0; c < w.cols; ++c) block[Bf16Index(r, c)] = FloatToBf16(values[c]);
      return;
    }
    case WeightFormat::kInt8:
    case WeightFormat::kInt4:
    case WeightFormat::kInt5:
      for (int64_t g = 0; g < w.cols / w.group_size; ++g) {
        QuantizeGroup(values + g * w.group_size, w, row, g);
      }
      return;
    case WeightFormat::kNl4:  // PackFromF32 refuses it
      return;
  }
}

// Copies row `src_row` of `src` into row `dst_row` of `dst` (same format and cols).
void CopyRow(const PackedWeight& src, int64_t src_row, PackedWeight& dst, int64_t dst_row) {
  const int64_t sr = src_row % kRowBlock, dr = dst_row % kRowBlock;
  switch (src.format) {
    case WeightFormat::kF32: {
      const float* from = reinterpret_cast<const float*>(BlockData(src, src_row));
      float* to = reinterpret_cast<float*>(BlockData(dst, dst_row));
      for (int64_t c = 0; c < src.cols; ++c) to[c * kRowBlock + dr] = from[c * kRowBlock + sr];
      return;
    }
    case WeightFormat::kF16: {
      const uint16_t* from = reinterpret_cast<const uint16_t*>(BlockData(src, src_row));
      uint16_t* to = reinterpret_cast<uint16_t*>(BlockData(dst, dst_row));
      for (int64_t c = 0; c < src.cols; ++c) to[c * kRowBlock + dr] = from[c * kRowBlock + sr];
      return;
    }
    case WeightFormat::kBf16: {
      const uint16_t* from = reinterpret_cast<const uint16_t*>(BlockData(src, src_row));
      uint16_t* to = reinterpret_cast<uint16_t*>(BlockData(dst, dst_row));
      for (int64_t c = 0; c < src.cols; ++c) to[Bf16Index(dr, c)] = from[Bf16Index(sr, c)];
      return;
    }
    case WeightFormat::kInt8:
    case WeightFormat::kInt4:
    case WeightFormat::kInt5:
    case WeightFormat::kNl4: {
      for (int64_t c = 0; c < src.cols; ++c) SetQ(dst, dst_row, c, GetQ(src, src_row, c));
      for (int64_t g = 0; g < src.cols / src.group_size; ++g) {
        const int64_t to = GroupIndex(dst, dst_row, g), from = GroupIndex(src, src_row, g);
        if (src.f32_scaled()) {
          dst.scales_f32[to] = src.scales_f32[from];
          dst.mins_f32[to] = src.mins_f32[from];
          continue;
        }
        dst.scales[to] = src.scales[from];
        if (!src.mins.empty()) dst.mins[to] = src.mins[from];
      }
      return;
    }
  }
}

uint16_t LoadU16(const uint8_t* p) {
  uint16_t value;
  std::memcpy(&value, p, 2);
  return value;
}

// GGUF Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 rows into INT4 / INT5 / INT8 g32 without loss.
absl::StatusOr<PackedWeight> PackGgufBlocks(common::GgmlType type, const uint8_t* src, int64_t rows,
                                            int64_t cols, const PackOptions& options) {
  using common::GgmlType;
  const std::string type_name = common::RawGgmlTypeName(static_cast<uint32_t>(type));
  if (cols % 32 != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s tensor: cols %d is not a multiple of 32", type_name, cols));
  }
  const bool five_bit = type == GgmlType::kQ5_0 || type == GgmlType::kQ5_1;
  // Q5_0 as INT8: q - 16 under its scale d, no min.
  const bool signed_q5 = type == GgmlType::kQ5_0 && options.q5_0_as_int8;
  const WeightFormat format = type == GgmlType::kQ8_0 || signed_q5 ? WeightFormat::kInt8
                              : five_bit                           ? WeightFormat::kInt5
                                                                   : WeightFormat::kInt4;
  LOOM_ASSIGN_OR_RETURN(PackedWeight w, Allocate(format, rows, cols, 32));
  LOOM_ASSIGN_OR_RETURN(const common::GgmlTypeTraits traits,
                        common::GetGgmlTypeTraits(static_cast<uint32_t>(type)));
  const int64_t block_bytes = traits.type_size;
  const int64_t groups = cols / 32;
  // One row's groups; an error only for a Q4_0/Q5_0 scale whose min overflows F16.
  auto pack_row = [&](int64_t row) -> absl::Status {
    for (int64_t g = 0; g < groups; ++g) {
      const uint8_t* block = src + (row * groups + g) * block_bytes;
      const uint16_t d = LoadU16(block);
      const int64_t index = GroupIndex(w, row, g);
      w.scales[index] = d;
      const int64_t c0 = g * 32;
      if (type == GgmlType::kQ8_0) {
        for (int j = 0; j < 32; ++j) SetQ(w, row, c0 + j, static_cast<int8_t>(block[2 + j]));
        continue;
      }
      const bool symmetric = type == GgmlType::kQ4_0 || type == GgmlType::kQ5_0;
      if (signed_q5) {
        int q[32];
        common::Unpack5Bit(block + 2, block + 6, q);
        for (int j = 0; j < 32; ++j) SetQ(w, row, c0 + j, q[j] - 16);
        continue;
      }
      if (symmetric) {
        // d * (q - z) == q * d + (-z d) exactly when -z d is a finite half (z = 8, 16).
        const float zero_point = type == GgmlType::kQ4_0 ? 8.0f : 16.0f;
        const float min = -zero_point * HalfToFloat(d);
        const uint16_t min_h = FloatToHalf(min);
        if (HalfToFloat(min_h) != min) {
          return absl::InvalidArgumentError(absl::StrFormat(
              "%s tensor: block scale %g at row %d overflows %s's F16 min (-%g * scale)", type_name,
              HalfToFloat(d), row, WeightFormatName(format), zero_point));
        }
        w.mins[index] = min_h;
      } else {
        w.mins[index] = LoadU16(block + 2);
      }
      const uint8_t* after_scales = block + (symmetric ? 2 : 4);
      if (five_bit) {
        int q[32];
        common::Unpack5Bit(after_scales, after_scales + 4, q);
        for (int j = 0; j < 32; ++j) SetQ(w, row, c0 + j, q[j]);
        continue;
      }
      for (int j = 0; j < 16; ++j) {
        SetQ(w, row, c0 + j, after_scales[j] & 0x0f);
        SetQ(w, row, c0 + 16 + j, after_scales[j] >> 4);
      }
    }
    return absl::OkStatus();
  };
  // A run stops at its first failing row; the lowest run's error is the lowest row's.
  LOOM_RETURN_IF_ERROR(internal::ForEachRowRun(rows, cols, [&](int64_t first, int64_t end) {
    for (int64_t row = first; row < end; ++row) LOOM_RETURN_IF_ERROR(pack_row(row));
    return absl::OkStatus();
  }));
  w.source = absl::StrFormat("%s -> %s g32 (lossless)", type_name, WeightFormatName(format));
  return w;
}

// Stacks parts of one format, group size and scale type.
absl::StatusOr<PackedWeight> ConcatSameFormat(const std::vector<const PackedWeight*>& parts) {
  const PackedWeight& first = *parts[0];
  int64_t rows = 0;
  for (const PackedWeight* part : parts) {
    if (part->cols != first.cols) {
      return absl::InvalidArgumentError(
          absl::StrFormat("ConcatRows: parts differ in columns (%d vs %d)", first.cols, part->cols));
    }
    rows += part->rows;
  }
  LOOM_ASSIGN_OR_RETURN(PackedWeight out, Allocate(first.format, rows, first.cols,
                                                   first.group_size, first.f32_scaled()));
  out.levels = first.levels;
  // Copies a part's per-group array into the output's at row `offset` (a block boundary).
  auto copy_groups = [](const auto& from, auto& to, int64_t offset, int64_t part_rows) {
    if (from.empty()) return;
    const size_t per_block = from.size() / std::max<int64_t>(1, NumRowBlocks(part_rows));
    std::copy(from.begin(), from.end(), to.begin() + (offset / kRowBlock) * per_block);
  };
  int64_t offset = 0;
  for (const PackedWeight* part : parts) {
    if (offset % kRowBlock == 0) {
      // Aligned: whole row blocks copy as bytes (the padding rows are overwritten next).
      std::memcpy(BlockData(out, offset), part->data.data(), part->data.size());
      copy_groups(part->scales, out.scales, offset, part->rows);
      copy_groups(part->mins, out.mins, offset, part->rows);
      copy_groups(part->scales_f32, out.scales_f32, offset, part->rows);
      copy_groups(part->mins_f32, out.mins_f32, offset, part->rows);
    } else {
      for (int64_t row = 0; row < part->rows; ++row) CopyRow(*part, row, out, offset + row);
    }
    offset += part->rows;
  }
  out.source = first.source;
  for (const PackedWeight* part : parts) {
    if (part->source != out.source) absl::StrAppend(&out.source, " + ", part->source);
  }
  return out;
}

// The zero point of a symmetric INT4/INT5 weight with F16 scales (every min is -8 or -16
// times its scale, as Q4_0 and Q5_0 store them), else 0.
int SymmetricZeroPoint(const PackedWeight& w) {
  if (w.f32_scaled() || !HasMins(w.format)) return 0;
  const int zero_point = w.format == WeightFormat::kInt4 ? 8 : 16;
  for (size_t i = 0; i < w.scales.size(); ++i) {
    if (HalfToFloat(w.mins[i]) != -static_cast<float>(zero_point) * HalfToFloat(w.scales[i])) {
      return 0;
    }
  }
  return zero_point;
}

// Integer parts of different formats, group sizes or scale types, each converted without
// loss to the widest: INT8 if any part is INT8, else INT5 if any is INT5 (a narrower q is
// a wider one, its min kept), the smallest group if every group is a multiple of it (a
// group's scale and min repeat over its parts), F32 scales and mins when any part has them
// or an INT4/INT5 min must go into INT8 (F16 -> F32 is exact) - unless that part is
// symmetric, whose q - 8 / q - 16 is an INT8 q under the same F16 scale. InvalidArgument
// for float parts or groups that do not nest.
absl::StatusOr<std::vector<PackedWeight>> WidenToCommonFormat(
    const std::vector<const PackedWeight*>& parts) {
  bool int8 = false, int5 = false, f32_scales = false, narrow_with_mins = false;
  int64_t group = 0;
  for (const PackedWeight* part : parts) {
    if (!IsInteger(part->format)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("ConcatRows: parts differ (%s and %s) and are not all integer formats",
                          WeightFormatName(parts[0]->format), WeightFormatName(part->format)));
    }
    int8 = int8 || part->format == WeightFormat::kInt8 || part->format == WeightFormat::kNl4;
    int5 = int5 || part->format == WeightFormat::kInt5;
    f32_scales = f32_scales || part->f32_scaled();
    narrow_with_mins =
        narrow_with_mins || (HasMins(part->format) && SymmetricZeroPoint(*part) == 0);
    group = group == 0 ? part->group_size : std::min(group, part->group_size);
  }
  // The kernels take INT5 with F16 scales only: with F32 ones it widens to INT8.
  int8 = int8 || (int5 && f32_scales);
  f32_scales = f32_scales || (int8 && narrow_with_mins);
  const WeightFormat format = int8   ? WeightFormat::kInt8
                              : int5 ? WeightFormat::kInt5
                                     : WeightFormat::kInt4;
  std::vector<PackedWeight> out;
  for (const PackedWeight* part : parts) {
    if (part->group_size % group != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "ConcatRows: group sizes %d and %d do not nest", part->group_size, group));
    }
    LOOM_ASSIGN_OR_RETURN(PackedWeight wide,
                          Allocate(format, part->rows, part->cols, group, f32_scales));
    const int64_t ratio = part->group_size / group;
    // Into INT8 with F16 scales: a symmetric part's q loses its zero point.
    const int shift = format == WeightFormat::kInt8 && !f32_scales ? SymmetricZeroPoint(*part) : 0;
    for (int64_t row = 0; row < part->rows; ++row) {
      for (int64_t c = 0; c < part->cols; ++c) SetQ(wide, row, c, GetQ(*part, row, c) - shift);
      for (int64_t g = 0; g < part->cols / group; ++g) {
        const int64_t from = GroupIndex(*part, row, g / ratio), to = GroupIndex(wide, row, g);
        if (f32_scales) {
          wide.scales_f32[to] = GroupScale(*part, from);
          wide.mins_f32[to] = GroupMin(*part, from);
        } else {
          wide.scales[to] = part->scales[from];
          if (format != WeightFormat::kInt8) wide.mins[to] = part->mins[from];
        }
      }
    }
    wide.source = absl::StrFormat("%s, as %s g%d%s", part->source, WeightFormatName(format), group,
                                  f32_scales ? " (F32 scales)" : "");
    out.push_back(std::move(wide));
  }
  return out;
}

}  // namespace

absl::StatusOr<PackedWeight> PackFromF32(const float* values, int64_t rows, int64_t cols,
                                         WeightFormat format, int64_t group_size) {
  if (values == nullptr) return absl::InvalidArgumentError("PackFromF32: null values");
  if (format == WeightFormat::kNl4) {
    return absl::InvalidArgumentError(
        "PackFromF32: NL4 takes a table of levels: no rounding to it");
  }
  LOOM_ASSIGN_OR_RETURN(PackedWeight w, Allocate(format, rows, cols, group_size));
  LOOM_RETURN_IF_ERROR(internal::ForEachRowRun(rows, cols, [&](int64_t first, int64_t end) {
    for (int64_t row = first; row < end; ++row) SetRowFromF32(w, row, values + row * cols);
    return absl::OkStatus();
  }));
  w.source = IsInteger(format) ? absl::StrFormat("F32 -> %s g%d (round to nearest)",
                                                 WeightFormatName(format), w.group_size)
                               : absl::StrFormat("F32 -> %s", WeightFormatName(format));
  return w;
}

// Blocks of 32 whose nibbles index a table of int8 levels times one scale per block
// (IQ4_NL: an F16 scale and kIq4NlValues; MXFP4: an E8M0 exponent and kMxfp4Values) as NL4
// g32 without loss: the nibbles are the codes, the table the levels, the scale the group's
// (or as INT8 g32, the level the int8 value). MXFP4's scales 2^(e - 128) are kept in F16
// where every block's is a normal or subnormal F16 power of two (2^-24 .. 2^15), else in
// F32 (then INT8: NL4 has F16 scales only).
absl::StatusOr<PackedWeight> PackTableBlocks(common::GgmlType type, const uint8_t* src,
                                             int64_t rows, int64_t cols,
                                             const PackOptions& options) {
  const bool mxfp4 = type == common::GgmlType::kMXFP4;
  const char* name = mxfp4 ? "MXFP4" : "IQ4_NL";
  if (cols % 32 != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s tensor: cols %d is not a multiple of 32", name, cols));
  }
  const int64_t groups = cols / 32, block_bytes = mxfp4 ? 17 : 18, header = mxfp4 ? 1 : 2;
  const int8_t* levels = mxfp4 ? common::kMxfp4Values : common::kIq4NlValues;
  bool f32_scales = false;
  for (int64_t b = 0; mxfp4 && b < rows * groups; ++b) {
    const uint8_t e = src[b * block_bytes];
    f32_scales |= e < 128 - 24 || e > 128 + 15;
  }
  const WeightFormat format =
      f32_scales || options.table_4bit_as_int8 ? WeightFormat::kInt8 : WeightFormat::kNl4;
  LOOM_ASSIGN_OR_RETURN(PackedWeight w, Allocate(format, rows, cols, 32, f32_scales));
  std::copy(levels, levels + 16, w.levels.begin());
  for (int64_t row = 0; row < rows; ++row) {
    for (int64_t g = 0; g < groups; ++g) {
      const uint8_t* block = src + (row * groups + g) * block_bytes;
      const int64_t index = GroupIndex(w, row, g);
      if (!mxfp4) {
        w.scales[index] = LoadU16(block);
      } else if (f32_scales) {
        w.scales_f32[index] = common::Mxfp4Scale(block[0]);
      } else {
        w.scales[index] = FloatToHalf(common::Mxfp4Scale(block[0]));
      }
      const int64_t c0 = g * 32;
      uint8_t* data = BlockData(w, row);
      for (int j = 0; j < 16; ++j) {
        const int lo = block[header + j] & 0x0f, hi = block[header + j] >> 4;
        if (format == WeightFormat::kInt8) {
          SetQ(w, row, c0 + j, levels[lo]);
          SetQ(w, row, c0 + 16 + j, levels[hi]);
        } else {  // the codes as they are (MXFP4's -0 stays its own code)
          SetCode(data, row % kRowBlock, c0 + j, lo);
          SetCode(data, row % kRowBlock, c0 + 16 + j, hi);
        }
      }
    }
  }
  if (format == WeightFormat::kInt8) w.levels = {};
  w.source = absl::StrFormat("%s -> %s g32%s (lossless)", name, WeightFormatName(format),
                             f32_scales ? ", F32 scales" : "");
  return w;
}

namespace {

// A [rows, cols] BF16 matrix whose row-major element i is bits(i).
template <typename Bits>
absl::StatusOr<PackedWeight> PackBf16(int64_t rows, int64_t cols, const char* source, Bits bits) {
  LOOM_ASSIGN_OR_RETURN(PackedWeight w, Allocate(WeightFormat::kBf16, rows, cols, 0));
  LOOM_RETURN_IF_ERROR(internal::ForEachRowRun(rows, cols, [&](int64_t first, int64_t end) {
    for (int64_t row = first; row < end; ++row) {
      uint16_t* block = reinterpret_cast<uint16_t*>(BlockData(w, row));
      const int64_t r = row % kRowBlock;
      for (int64_t c = 0; c < cols; ++c) block[Bf16Index(r, c)] = bits(row * cols + c);
    }
    return absl::OkStatus();
  }));
  w.source = source;
  return w;
}

}  // namespace

absl::StatusOr<PackedWeight> PackWeight(common::GgmlType type, const void* data, int64_t rows,
                                        int64_t cols, const PackOptions& options) {
  using common::GgmlType;
  if (data == nullptr) return absl::InvalidArgumentError("PackWeight: null data");
  if (rows <= 0 || cols <= 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("PackWeight: shape [%d, %d] must be positive", rows, cols));
  }
  const std::string type_name = common::RawGgmlTypeName(static_cast<uint32_t>(type));
  switch (type) {
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_1:
    case GgmlType::kQ8_0:
      return PackGgufBlocks(type, static_cast<const uint8_t*>(data), rows, cols, options);
    case GgmlType::kIQ4_NL:
    case GgmlType::kMXFP4:
      return PackTableBlocks(type, static_cast<const uint8_t*>(data), rows, cols, options);
    case GgmlType::kF16: {
      if (options.floats_as_bf16) {
        return PackBf16(rows, cols, "F16 -> BF16 (rounded for --activations bf16)",
                        [src = static_cast<const uint8_t*>(data)](int64_t i) {
                          return FloatToBf16(HalfToFloat(LoadU16(src + 2 * i)));
                        });
      }
      LOOM_ASSIGN_OR_RETURN(PackedWeight w, Allocate(WeightFormat::kF16, rows, cols, 0));
      const uint16_t* src = static_cast<const uint16_t*>(data);
      LOOM_RETURN_IF_ERROR(internal::ForEachRowRun(rows, cols, [&](int64_t first, int64_t end) {
        for (int64_t row = first; row < end; ++row) {
          uint16_t* block = reinterpret_cast<uint16_t*>(BlockData(w, row));
          const int64_t r = row % kRowBlock;
          for (int64_t c = 0; c < cols; ++c) block[c * kRowBlock + r] = src[row * cols + c];
        }
        return absl::OkStatus();
      }));
      w.source = "F16 -> F16";
      return w;
    }
    case GgmlType::kQ2_K:
    case GgmlType::kQ3_K:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K:
      return internal::PackKQuantBlocks(type, static_cast<const uint8_t*>(data), rows, cols);
    case GgmlType::kBF16:  // the bits as they are (subnormals and NaN payloads included)
      return PackBf16(
          rows, cols, "BF16 -> BF16 (lossless)",
          [src = static_cast<const uint8_t*>(data)](int64_t i) { return LoadU16(src + 2 * i); });
    case GgmlType::kF32: {
      std::vector<float> values(static_cast<size_t>(rows * cols));
      LOOM_RETURN_IF_ERROR(internal::ForEachRowRun(rows, cols, [&](int64_t first, int64_t end) {
        return common::DequantizeToF32(type, static_cast<const uint8_t*>(data) + first * cols * 4,
                                       static_cast<uint64_t>((end - first) * cols),
                                       values.data() + first * cols);
      }));
      const WeightFormat format = options.floats_as_bf16 ? WeightFormat::kBf16 : WeightFormat::kF32;
      LOOM_ASSIGN_OR_RETURN(PackedWeight w, PackFromF32(values.data(), rows, cols, format, 0));
      w.source = options.floats_as_bf16 ? "F32 -> BF16 (rounded for --activations bf16)"
                                        : "F32 -> F32 (lossless)";
      return w;
    }
    default:
      return absl::InvalidArgumentError(absl::StrFormat(
          "PackWeight: unsupported tensor type %s (supported: F32, F16, BF16, Q4_0, Q4_1, "
          "Q8_0, Q5_0, Q5_1, IQ4_NL, MXFP4, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K)",
          type_name));
  }
}

absl::StatusOr<NaturalQuantizedWeight> UnpackQuantized(const PackedWeight& w) {
  if (!IsInteger(w.format)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "UnpackQuantized: the weight is %s, not INT8/INT5/INT4/NL4", WeightFormatName(w.format)));
  }
  const int64_t groups = w.cols / w.group_size;
  // INT5 becomes INT8: symmetric (Q5_0: every min -16 times its scale) as q - 16 with the F16
  // scales, else (Q5_1) q with its F16 scales and mins widened to F32, both exact.
  bool int5_symmetric = w.format == WeightFormat::kInt5;
  for (int64_t r = 0; int5_symmetric && r < w.rows; ++r) {
    for (int64_t g = 0; int5_symmetric && g < groups; ++g) {
      const int64_t index = GroupIndex(w, r, g);
      int5_symmetric = GroupMin(w, index) == -16.0f * GroupScale(w, index);
    }
  }
  const bool int8_f32 = (w.format == WeightFormat::kInt8 && w.f32_scaled()) ||
                        (w.format == WeightFormat::kInt5 && !int5_symmetric);
  const bool int8_mins = w.format == WeightFormat::kInt5
                             ? !int5_symmetric
                             : int8_f32 && std::any_of(w.mins_f32.begin(), w.mins_f32.end(),
                                                       [](float m) { return m != 0.0f; });
  const int q_offset = int5_symmetric ? 16 : 0;
  NaturalQuantizedWeight out;
  out.q.resize(static_cast<size_t>(w.rows * w.cols));
  const size_t num_groups = static_cast<size_t>(w.rows * groups);
  if (int8_f32) {
    out.scales_f32.resize(num_groups);
    if (int8_mins) out.mins_f32.resize(num_groups);
  } else {
    out.scales.resize(num_groups);
    if (w.format == WeightFormat::kInt4) out.mins.resize(num_groups);  // NL4: as INT8
  }
  // Rows split across threads (a load-time pass over every weight of the layer).
  ParallelForOnce(w.rows, std::max<int64_t>(1, (int64_t{1} << 18) / w.cols),
                  [&](int64_t first, int64_t end) {
                    for (int64_t r = first; r < end; ++r) {
                      for (int64_t c = 0; c < w.cols; ++c) {
                        out.q[r * w.cols + c] = static_cast<int8_t>(GetQ(w, r, c) - q_offset);
                      }
                      for (int64_t g = 0; g < groups; ++g) {
                        const int64_t index = GroupIndex(w, r, g);
                        if (int8_f32) {
                          out.scales_f32[r * groups + g] = GroupScale(w, index);
                          if (int8_mins) out.mins_f32[r * groups + g] = GroupMin(w, index);
                          continue;
                        }
                        out.scales[r * groups + g] =
                            w.f32_scaled() ? FloatToHalf(w.scales_f32[index]) : w.scales[index];
                        if (!out.mins.empty()) {
                          out.mins[r * groups + g] =
                              w.f32_scaled() ? FloatToHalf(w.mins_f32[index]) : w.mins[index];
                        }
                      }
                    }
                  });
  return out;
}

absl::StatusOr<PackedWeight> SliceColumns(const PackedWeight& w, int64_t col_begin, int64_t count) {
  if (!IsInteger(w.format) || col_begin < 0 || count <= 0 || col_begin + count > w.cols) {
    return absl::InvalidArgumentError(
        absl::StrFormat("SliceColumns: columns [%d, %d) of a %s weight with %d columns", col_begin,
                        col_begin + count, WeightFormatName(w.format), w.cols));
  }
  // The widest groups the cut leaves whole; finer than the weight's: F32 scales (the
  // kernels' smallest F32-scaled group is kF32ScaledGroupUnit), INT5 then as INT8.
  const int64_t group = std::gcd(w.group_size, std::gcd(col_begin, count));
  const bool whole = group == w.group_size;
  if (!whole && group % internal::kF32ScaledGroupUnit != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("columns [%d, %d) cut %s groups of %d into pieces narrower than %d",
                        col_begin, col_begin + count, WeightFormatName(w.format), w.group_size,
                        internal::kF32ScaledGroupUnit));
  }
  const bool f32_scales = w.f32_scaled() || !whole;
  const WeightFormat format =
      (w.format == WeightFormat::kInt5 || w.format == WeightFormat::kNl4) && f32_scales
          ? WeightFormat::kInt8
          : w.format;
  LOOM_ASSIGN_OR_RETURN(PackedWeight out, Allocate(format, w.rows, count, group, f32_scales));
  if (format == WeightFormat::kNl4) out.levels = w.levels;
  const int64_t ratio = w.group_size / group, first_group = col_begin / group;
  LOOM_RETURN_IF_ERROR(internal::ForEachRowRun(w.rows, count, [&](int64_t first, int64_t end) {
    for (int64_t row = first; row < end; ++row) {
      for (int64_t c = 0; c < count; ++c) SetQ(out, row, c, GetQ(w, row, col_begin + c));
      for (int64_t g = 0; g < count / group; ++g) {
        const int64_t from = GroupIndex(w, row, (first_group + g) / ratio);
        const int64_t to = GroupIndex(out, row, g);
        if (f32_scales) {
          out.scales_f32[to] = GroupScale(w, from);
          out.mins_f32[to] = GroupMin(w, from);
        } else {
          out.scales[to] = w.scales[from];
          if (HasMins(format)) out.mins[to] = w.mins[from];
        }
      }
    }
    return absl::OkStatus();
  }));
  out.source = whole ? w.source
                     : absl::StrFormat("%s, cut as %s g%d (F32 scales)", w.source,
                                       WeightFormatName(format), group);
  return out;
}

absl::StatusOr<PackedWeight> ConcatRows(const std::vector<const PackedWeight*>& parts) {
  if (parts.empty()) return absl::InvalidArgumentError("ConcatRows: no parts");
  for (const PackedWeight* part : parts) {
    if (part == nullptr) return absl::InvalidArgumentError("ConcatRows: null part");
  }
  const PackedWeight& first = *parts[0];
  bool same = true;
  for (const PackedWeight* part : parts) {
    same = same && part->format == first.format && part->group_size == first.group_size &&
           part->f32_scaled() == first.f32_scaled() &&
           (part->format != WeightFormat::kNl4 || part->levels == first.levels);
  }
  std::vector<PackedWeight> widened;
  std::vector<const PackedWeight*> same_parts = parts;
  if (!same) {
    LOOM_ASSIGN_OR_RETURN(widened, WidenToCommonFormat(parts));
    for (size_t i = 0; i < parts.size(); ++i) same_parts[i] = &widened[i];
  }
  return ConcatSameFormat(same_parts);
}

void DequantizeRows(const PackedWeight& w, int64_t row_begin, int64_t row_end, float* out) {
  const int64_t cols = w.cols;
  for (int64_t row = row_begin; row < row_end; ++row) {
    float* dst = out + (row - row_begin) * cols;
    const int64_t r = row % kRowBlock;
    switch (w.format) {
      case WeightFormat::kF32: {
        const float* block = reinterpret_cast<const float*>(BlockData(w, row));
        for (int64_t c = 0; c < cols; ++c) dst[c] = block[c * kRowBlock + r];
        break;
      }
      case WeightFormat::kF16: {
        const uint16_t* block = reinterpret_cast<const uint16_t*>(BlockData(w, row));
        for (int64_t c = 0; c < cols; ++c) dst[c] = HalfToFloat(block[c * kRowBlock + r]);
        break;
      }
      case WeightFormat::kBf16: {
        const uint16_t* block = reinterpret_cast<const uint16_t*>(BlockData(w, row));
        for (int64_t c = 0; c < cols; ++c) dst[c] = Bf16ToFloat(block[Bf16Index(r, c)]);
        break;
      }
      case WeightFormat::kInt8:
      case WeightFormat::kInt4:
      case WeightFormat::kInt5:
      case WeightFormat::kNl4: {
        for (int64_t g = 0; g < cols / w.group_size; ++g) {
          const int64_t index = GroupIndex(w, row, g);
          const float scale = GroupScale(w, index);
          const int64_t c0 = g * w.group_size;
          if (w.f32_scaled()) {
            // q * scale is exact (8-bit q by an F16 scale times an 8-bit integer), so this
            // rounds once, as llama.cpp's and gguf's K-quant dequantization does.
            // No min is stored as -0, which adds nothing, not even to a zero's sign.
            const float min = w.mins_f32[index];
            for (int64_t j = 0; j < w.group_size; ++j) {
              dst[c0 + j] = static_cast<float>(GetQ(w, row, c0 + j)) * scale + min;
            }
            continue;
          }
          if (!HasMins(w.format)) {  // INT8's q, NL4's levels
            for (int64_t j = 0; j < w.group_size; ++j) {
              dst[c0 + j] = static_cast<float>(GetQ(w, row, c0 + j)) * scale;
            }
            continue;
          }
          const float min = HalfToFloat(w.mins[index]);
          const int zero_point = w.format == WeightFormat::kInt4 ? 8 : 16;
          if (min == -static_cast<float>(zero_point) * scale) {
            // Q4_0's and Q5_0's symmetric form: d * (q - 8) / d * (q - 16), which also
            // keeps GGUF's sign of zero.
            for (int64_t j = 0; j < w.group_size; ++j) {
              dst[c0 + j] = static_cast<float>(GetQ(w, row, c0 + j) - zero_point) * scale;
            }
            continue;
          }
          // q * scale is exact (5-bit by 11-bit mantissas), so this rounds once, as
          // GGUF's Q4_1 and Q5_1 d * q + m do.
          for (int64_t j = 0; j < w.group_size; ++j) {
            dst[c0 + j] = static_cast<float>(GetQ(w, row, c0 + j)) * scale + min;
          }
        }
        break;
      }
    }
  }
}

}  // namespace loom::kernels::cpu
