#include "kernels/cpu/weights.h"

#include "kernels/cpu/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/matmul_internal.h"
#include "kernels/cpu/quantize.h"

namespace loom::kernels::cpu {
namespace {

using internal::BlockDataBytes;
using internal::HalfToFloat;
using internal::IntByteOffset;
using internal::kRowBlock;
using internal::NumRowBlocks;

const char* FormatName(WeightFormat format) {
  switch (format) {
    case WeightFormat::kF32:
      return "F32";
    case WeightFormat::kF16:
      return "F16";
    case WeightFormat::kInt8:
      return "INT8";
    case WeightFormat::kInt4:
      return "INT4";
  }
  return "?";
}

bool IsInteger(WeightFormat format) {
  return format == WeightFormat::kInt8 || format == WeightFormat::kInt4;
}

// An empty (zero-filled) weight of the given shape in the packed layout.
absl::StatusOr<PackedWeight> Allocate(WeightFormat format, int64_t rows, int64_t cols,
                                      int64_t group_size) {
  if (rows <= 0 || cols <= 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("weight shape [%d, %d] must be positive", rows, cols));
  }
  if (IsInteger(format)) {
    if (group_size <= 0 || group_size % internal::kActGroup != 0 || cols % group_size != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s weight: group size %d must be a positive multiple of %d dividing cols %d",
          FormatName(format), group_size, internal::kActGroup, cols));
    }
  } else {
    group_size = 0;
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
    weight.scales.assign(blocks * (cols / group_size) * kRowBlock, 0);
    if (format == WeightFormat::kInt4) weight.mins.assign(weight.scales.size(), 0);
  }
  return weight;
}

// Index of (row, group) in scales / mins.
int64_t GroupIndex(const PackedWeight& w, int64_t row, int64_t group) {
  return ((row / kRowBlock) * (w.cols / w.group_size) + group) * kRowBlock + row % kRowBlock;
}

uint8_t* BlockData(PackedWeight& w, int64_t row) {
  return w.data.data() + (row / kRowBlock) * BlockDataBytes(w.format, w.cols);
}
const uint8_t* BlockData(const PackedWeight& w, int64_t row) {
  return w.data.data() + (row / kRowBlock) * BlockDataBytes(w.format, w.cols);
}

// Raw per-element accessors for the integer formats: q as stored (INT8: signed q,
// INT4: 0..15).
void SetQ(PackedWeight& w, int64_t row, int64_t col, int q) {
  uint8_t* byte = BlockData(w, row) + IntByteOffset(w.format, row % kRowBlock, col);
  if (w.format == WeightFormat::kInt8) {
    *byte = static_cast<uint8_t>(q + 128);
  } else if (col % 8 < 4) {
    *byte = static_cast<uint8_t>((*byte & 0xf0) | (q & 0x0f));
  } else {
    *byte = static_cast<uint8_t>((*byte & 0x0f) | ((q & 0x0f) << 4));
  }
}

int GetQ(const PackedWeight& w, int64_t row, int64_t col) {
  const uint8_t byte = BlockData(w, row)[IntByteOffset(w.format, row % kRowBlock, col)];
  if (w.format == WeightFormat::kInt8) return static_cast<int>(byte) - 128;
  return col % 8 < 4 ? (byte & 0x0f) : (byte >> 4);
}

// Quantizes one group of F32 values with round-to-nearest (QuantizeGroupRtn) into row
// `row`, group `g`.
void QuantizeGroup(const float* values, PackedWeight& w, int64_t row, int64_t g) {
  const int64_t gs = w.group_size;
  const int64_t index = GroupIndex(w, row, g);
  std::vector<int8_t> q(static_cast<size_t>(gs));
  uint16_t min = 0;
  QuantizeGroupRtn(values, gs, w.format, q.data(), &w.scales[index], &min);
  if (w.format == WeightFormat::kInt4) w.mins[index] = min;
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
    case WeightFormat::kInt8:
    case WeightFormat::kInt4:
      for (int64_t g = 0; g < w.cols / w.group_size; ++g) {
        QuantizeGroup(values + g * w.group_size, w, row, g);
      }
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
    case WeightFormat::kInt8:
    case WeightFormat::kInt4: {
      for (int64_t c = 0; c < src.cols; ++c) SetQ(dst, dst_row, c, GetQ(src, src_row, c));
      for (int64_t g = 0; g < src.cols / src.group_size; ++g) {
        dst.scales[GroupIndex(dst, dst_row, g)] = src.scales[GroupIndex(src, src_row, g)];
        if (src.format == WeightFormat::kInt4) {
          dst.mins[GroupIndex(dst, dst_row, g)] = src.mins[GroupIndex(src, src_row, g)];
        }
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

// GGUF Q4_0 / Q4_1 / Q8_0 rows into INT4 / INT8 g32 without loss.
absl::StatusOr<PackedWeight> PackGgufBlocks(common::GgmlType type, const uint8_t* src,
                                            int64_t rows, int64_t cols) {
  using common::GgmlType;
  if (cols % 32 != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s tensor: cols %d is not a multiple of 32",
                        common::RawGgmlTypeName(static_cast<uint32_t>(type)), cols));
  }
  const WeightFormat format = type == GgmlType::kQ8_0 ? WeightFormat::kInt8 : WeightFormat::kInt4;
  LOOM_ASSIGN_OR_RETURN(PackedWeight w, Allocate(format, rows, cols, 32));
  const int64_t block_bytes = type == GgmlType::kQ8_0 ? 34 : type == GgmlType::kQ4_0 ? 18 : 20;
  const int64_t groups = cols / 32;
  for (int64_t row = 0; row < rows; ++row) {
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
      if (type == GgmlType::kQ4_0) {
        // d * (q - 8) == q * d + (-8 d) exactly when -8 d is a finite half.
        const float min = -8.0f * HalfToFloat(d);
        const uint16_t min_h = FloatToHalf(min);
        if (HalfToFloat(min_h) != min) {
          return absl::InvalidArgumentError(absl::StrFormat(
              "Q4_0 tensor: block scale %g at row %d overflows INT4's F16 min (-8 * scale)",
              HalfToFloat(d), row));
        }
        w.mins[index] = min_h;
      } else {
        w.mins[index] = LoadU16(block + 2);
      }
      const uint8_t* qs = block + (type == GgmlType::kQ4_0 ? 2 : 4);
      for (int j = 0; j < 16; ++j) {
        SetQ(w, row, c0 + j, qs[j] & 0x0f);
        SetQ(w, row, c0 + 16 + j, qs[j] >> 4);
      }
    }
  }
  w.source = absl::StrFormat("%s -> %s g32 (lossless)",
                             common::RawGgmlTypeName(static_cast<uint32_t>(type)),
                             FormatName(format));
  return w;
}

}  // namespace

absl::StatusOr<PackedWeight> PackFromF32(const float* values, int64_t rows, int64_t cols,
                                         WeightFormat format, int64_t group_size) {
  if (values == nullptr) return absl::InvalidArgumentError("PackFromF32: null values");
  LOOM_ASSIGN_OR_RETURN(PackedWeight w, Allocate(format, rows, cols, group_size));
  for (int64_t row = 0; row < rows; ++row) SetRowFromF32(w, row, values + row * cols);
  w.source = IsInteger(format)
                 ? absl::StrFormat("F32 -> %s g%d (round to nearest)", FormatName(format),
                                   w.group_size)
                 : absl::StrFormat("F32 -> %s", FormatName(format));
  return w;
}

// Q5_0 (d * (q - 16), q 5 bits) and IQ4_NL (d * kIq4NlValues[q]) blocks of 32 as INT8 g32
// without loss: the int8 value times the block's F16 scale d, which INT8 keeps as is.
absl::StatusOr<PackedWeight> PackInt8Blocks(common::GgmlType type, const uint8_t* src, int64_t rows,
                                            int64_t cols) {
  using common::GgmlType;
  const std::string type_name = common::RawGgmlTypeName(static_cast<uint32_t>(type));
  if (cols % 32 != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s tensor: cols %d is not a multiple of 32", type_name, cols));
  }
  LOOM_ASSIGN_OR_RETURN(PackedWeight w, Allocate(WeightFormat::kInt8, rows, cols, 32));
  const int64_t block_bytes = type == GgmlType::kQ5_0 ? 22 : 18;
  const int64_t groups = cols / 32;
  for (int64_t row = 0; row < rows; ++row) {
    for (int64_t g = 0; g < groups; ++g) {
      const uint8_t* block = src + (row * groups + g) * block_bytes;
      w.scales[GroupIndex(w, row, g)] = LoadU16(block);
      const int64_t c0 = g * 32;
      if (type == GgmlType::kQ5_0) {
        int q[32];
        common::Unpack5Bit(block + 2, block + 6, q);
        for (int j = 0; j < 32; ++j) SetQ(w, row, c0 + j, static_cast<int8_t>(q[j] - 16));
      } else {
        for (int j = 0; j < 16; ++j) {
          SetQ(w, row, c0 + j, common::kIq4NlValues[block[2 + j] & 0x0f]);
          SetQ(w, row, c0 + 16 + j, common::kIq4NlValues[block[2 + j] >> 4]);
        }
      }
    }
  }
  w.source = absl::StrFormat("%s -> INT8 g32 (lossless)", type_name);
  return w;
}

absl::StatusOr<PackedWeight> PackWeight(common::GgmlType type, const void* data, int64_t rows,
                                        int64_t cols) {
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
    case GgmlType::kQ8_0:
      return PackGgufBlocks(type, static_cast<const uint8_t*>(data), rows, cols);
    case GgmlType::kQ5_0:
    case GgmlType::kIQ4_NL:
      return PackInt8Blocks(type, static_cast<const uint8_t*>(data), rows, cols);
    case GgmlType::kF16: {
      LOOM_ASSIGN_OR_RETURN(PackedWeight w, Allocate(WeightFormat::kF16, rows, cols, 0));
      const uint16_t* src = static_cast<const uint16_t*>(data);
      for (int64_t row = 0; row < rows; ++row) {
        uint16_t* block = reinterpret_cast<uint16_t*>(BlockData(w, row));
        const int64_t r = row % kRowBlock;
        for (int64_t c = 0; c < cols; ++c) block[c * kRowBlock + r] = src[row * cols + c];
      }
      w.source = "F16 -> F16";
      return w;
    }
    case GgmlType::kF32:
    case GgmlType::kBF16:
    case GgmlType::kQ5_1:  // d * q + m with 5-bit q: no Loom integer format holds it
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K: {
      std::vector<float> values(static_cast<size_t>(rows * cols));
      LOOM_RETURN_IF_ERROR(common::DequantizeToF32(type, data,
                                                   static_cast<uint64_t>(rows * cols),
                                                   values.data()));
      WeightFormat format = WeightFormat::kF32;
      int64_t group = 0;
      std::string how = "(lossless)";
      if (type == GgmlType::kQ4_K || type == GgmlType::kQ5_K) {
        format = WeightFormat::kInt4;
        group = 32;
        how = "(re-quantized, lossy)";
      } else if (type == GgmlType::kQ6_K) {
        format = WeightFormat::kInt8;
        group = 32;
        how = "(re-quantized, lossy)";
      }
      LOOM_ASSIGN_OR_RETURN(PackedWeight w,
                            PackFromF32(values.data(), rows, cols, format, group));
      w.source = absl::StrFormat("%s -> %s%s %s", type_name, FormatName(format),
                                 group ? absl::StrFormat(" g%d", group) : "", how);
      return w;
    }
    default:
      return absl::InvalidArgumentError(absl::StrFormat(
          "PackWeight: unsupported tensor type %s (supported: F32, F16, BF16, Q4_0, Q4_1, "
          "Q8_0, Q5_0, Q5_1, IQ4_NL, Q4_K, Q5_K, Q6_K)",
          type_name));
  }
}

absl::StatusOr<NaturalQuantizedWeight> UnpackQuantized(const PackedWeight& w) {
  if (!IsInteger(w.format)) {
    return absl::InvalidArgumentError("UnpackQuantized: the weight is not INT8/INT4");
  }
  const int64_t groups = w.cols / w.group_size;
  NaturalQuantizedWeight out;
  out.q.resize(static_cast<size_t>(w.rows * w.cols));
  out.scales.resize(static_cast<size_t>(w.rows * groups));
  if (w.format == WeightFormat::kInt4) out.mins.resize(out.scales.size());
  for (int64_t r = 0; r < w.rows; ++r) {
    for (int64_t c = 0; c < w.cols; ++c) out.q[r * w.cols + c] = static_cast<int8_t>(GetQ(w, r, c));
    for (int64_t g = 0; g < groups; ++g) {
      out.scales[r * groups + g] = w.scales[GroupIndex(w, r, g)];
      if (!out.mins.empty()) out.mins[r * groups + g] = w.mins[GroupIndex(w, r, g)];
    }
  }
  return out;
}

absl::StatusOr<PackedWeight> ConcatRows(const std::vector<const PackedWeight*>& parts) {
  if (parts.empty()) return absl::InvalidArgumentError("ConcatRows: no parts");
  const PackedWeight& first = *parts[0];
  int64_t rows = 0;
  for (const PackedWeight* part : parts) {
    if (part == nullptr) return absl::InvalidArgumentError("ConcatRows: null part");
    if (part->format != first.format || part->cols != first.cols ||
        part->group_size != first.group_size) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "ConcatRows: parts differ (%s [%d, %d] g%d vs %s [%d, %d] g%d)",
          FormatName(first.format), first.rows, first.cols, first.group_size,
          FormatName(part->format), part->rows, part->cols, part->group_size));
    }
    rows += part->rows;
  }
  LOOM_ASSIGN_OR_RETURN(PackedWeight out,
                        Allocate(first.format, rows, first.cols, first.group_size));
  int64_t offset = 0;
  for (const PackedWeight* part : parts) {
    if (offset % kRowBlock == 0) {
      // Aligned: whole row blocks copy as bytes (the padding rows are overwritten next).
      std::memcpy(BlockData(out, offset), part->data.data(), part->data.size());
      const size_t per_block = part->scales.size() / std::max<int64_t>(1, NumRowBlocks(part->rows));
      if (!part->scales.empty()) {
        std::memcpy(out.scales.data() + (offset / kRowBlock) * per_block, part->scales.data(),
                    part->scales.size() * 2);
      }
      if (!part->mins.empty()) {
        std::memcpy(out.mins.data() + (offset / kRowBlock) * per_block, part->mins.data(),
                    part->mins.size() * 2);
      }
    } else {
      for (int64_t row = 0; row < part->rows; ++row) CopyRow(*part, row, out, offset + row);
    }
    offset += part->rows;
  }
  out.source = first.source;
  return out;
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
      case WeightFormat::kInt8:
      case WeightFormat::kInt4: {
        for (int64_t g = 0; g < cols / w.group_size; ++g) {
          const int64_t index = GroupIndex(w, row, g);
          const float scale = HalfToFloat(w.scales[index]);
          const int64_t c0 = g * w.group_size;
          if (w.format == WeightFormat::kInt8) {
            for (int64_t j = 0; j < w.group_size; ++j) {
              dst[c0 + j] = static_cast<float>(GetQ(w, row, c0 + j)) * scale;
            }
            continue;
          }
          const float min = HalfToFloat(w.mins[index]);
          if (min == -8.0f * scale) {
            // Q4_0's symmetric form: d * (q - 8), which also keeps GGUF's sign of zero.
            for (int64_t j = 0; j < w.group_size; ++j) {
              dst[c0 + j] = static_cast<float>(GetQ(w, row, c0 + j) - 8) * scale;
            }
            continue;
          }
          // q * scale is exact (4-bit by 11-bit mantissas), so this rounds once, as
          // GGUF's Q4_1 d * q + m does.
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
