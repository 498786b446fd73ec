#include "kernels/cpu/quantize.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/matmul_internal.h"

namespace loom::kernels::cpu {
namespace {

using internal::BlockDataBytes;
using internal::HalfToFloat;
using internal::IntByteOffset;
using internal::kActGroup;
using internal::kRowBlock;
using internal::NumRowBlocks;

bool IsInteger(WeightFormat format) {
  return format == WeightFormat::kInt8 || format == WeightFormat::kInt4;
}

absl::Status CheckGroup(WeightFormat format, int64_t rows, int64_t cols, int64_t group_size) {
  if (!IsInteger(format)) {
    return absl::InvalidArgumentError("quantized matrix: format must be INT8 or INT4");
  }
  if (rows <= 0 || cols <= 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("quantized matrix: shape [%d, %d] must be positive", rows, cols));
  }
  if (group_size <= 0 || group_size % kActGroup != 0 || cols % group_size != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "quantized matrix: group size %d must be a positive multiple of %d dividing cols %d",
        group_size, kActGroup, cols));
  }
  return absl::OkStatus();
}

}  // namespace

void QuantizeGroupRtn(const float* w, int64_t count, WeightFormat format, int8_t* q,
                      uint16_t* scale_out, uint16_t* min_out) {
  if (format == WeightFormat::kInt8) {
    float amax = 0.0f;
    for (int64_t j = 0; j < count; ++j) amax = std::max(amax, std::fabs(w[j]));
    const uint16_t scale_h = FloatToHalf(amax / 127.0f);
    const float scale = HalfToFloat(scale_h);
    *scale_out = scale_h;
    for (int64_t j = 0; j < count; ++j) {
      const float v = scale > 0.0f ? std::nearbyint(w[j] / scale) : 0.0f;
      q[j] = static_cast<int8_t>(std::clamp(v, -127.0f, 127.0f));
    }
    return;
  }
  float lo = w[0], hi = w[0];
  for (int64_t j = 1; j < count; ++j) {
    lo = std::min(lo, w[j]);
    hi = std::max(hi, w[j]);
  }
  const uint16_t min_h = FloatToHalf(lo);
  const float min = HalfToFloat(min_h);
  const float top = format == WeightFormat::kInt5 ? 31.0f : 15.0f;
  const uint16_t scale_h = FloatToHalf((hi - min) / top);
  const float scale = HalfToFloat(scale_h);
  *scale_out = scale_h;
  *min_out = min_h;
  for (int64_t j = 0; j < count; ++j) {
    const float v = scale > 0.0f ? std::nearbyint((w[j] - min) / scale) : 0.0f;
    q[j] = static_cast<int8_t>(std::clamp(v, 0.0f, top));
  }
}

absl::StatusOr<QuantizedMatrix> QuantizeRtn(const float* values, int64_t rows, int64_t cols,
                                            WeightFormat format, int64_t group_size) {
  if (values == nullptr) return absl::InvalidArgumentError("QuantizeRtn: null values");
  LOOM_RETURN_IF_ERROR(CheckGroup(format, rows, cols, group_size));
  QuantizedMatrix m;
  m.format = format;
  m.rows = rows;
  m.cols = cols;
  m.group_size = group_size;
  const int64_t groups = cols / group_size;
  m.q.resize(rows * cols);
  m.scales.resize(rows * groups);
  if (format == WeightFormat::kInt4) m.mins.resize(rows * groups);
  for (int64_t row = 0; row < rows; ++row) {
    for (int64_t g = 0; g < groups; ++g) {
      const float* w = values + row * cols + g * group_size;
      int8_t* q = m.q.data() + row * cols + g * group_size;
      const int64_t index = row * groups + g;
      QuantizeGroupRtn(w, group_size, format, q, &m.scales[index],
                       format == WeightFormat::kInt4 ? &m.mins[index] : nullptr);
    }
  }
  return m;
}

absl::Status ValidateQuantizedMatrix(const QuantizedMatrix& m) {
  LOOM_RETURN_IF_ERROR(CheckGroup(m.format, m.rows, m.cols, m.group_size));
  const size_t groups = static_cast<size_t>(m.rows * m.groups_per_row());
  const size_t want_mins = m.format == WeightFormat::kInt4 ? groups : 0;
  if (m.q.size() != static_cast<size_t>(m.rows * m.cols) || m.scales.size() != groups ||
      m.mins.size() != want_mins) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "quantized matrix [%d, %d] g%d: %d values, %d scales, %d mins (want %d, %d, %d)", m.rows,
        m.cols, m.group_size, m.q.size(), m.scales.size(), m.mins.size(), m.rows * m.cols, groups,
        want_mins));
  }
  // INT8 takes the whole int8 range (the packed form stores q + 128 in a byte); the
  // quantizer itself never writes -128.
  const int lo = m.format == WeightFormat::kInt8 ? -128 : 0;
  const int hi = m.format == WeightFormat::kInt8 ? 127 : 15;
  for (size_t i = 0; i < m.q.size(); ++i) {
    if (m.q[i] < lo || m.q[i] > hi) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "quantized matrix: value %d at row %d col %d is outside [%d, %d]", m.q[i],
          static_cast<int64_t>(i) / m.cols, static_cast<int64_t>(i) % m.cols, lo, hi));
    }
  }
  return absl::OkStatus();
}

void DequantizeMatrix(const QuantizedMatrix& m, float* out) {
  const int64_t groups = m.groups_per_row();
  for (int64_t row = 0; row < m.rows; ++row) {
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t index = row * groups + g;
      const float scale = HalfToFloat(m.scales[index]);
      const float min = m.format == WeightFormat::kInt4 ? HalfToFloat(m.mins[index]) : 0.0f;
      const int64_t c0 = row * m.cols + g * m.group_size;
      for (int64_t j = 0; j < m.group_size; ++j) {
        const float q = static_cast<float>(m.q[c0 + j]);
        out[c0 + j] = m.format == WeightFormat::kInt4 ? q * scale + min : q * scale;
      }
    }
  }
}

absl::StatusOr<PackedWeight> PackQuantized(const QuantizedMatrix& m) {
  LOOM_RETURN_IF_ERROR(ValidateQuantizedMatrix(m));
  PackedWeight w;
  w.format = m.format;
  w.rows = m.rows;
  w.cols = m.cols;
  w.group_size = m.group_size;
  const int64_t blocks = NumRowBlocks(m.rows);
  const int64_t block_bytes = BlockDataBytes(m.format, m.cols);
  const int64_t groups = m.groups_per_row();
  // INT8 stores q + 128, so padding rows hold 128 (zero); INT4 padding nibbles are 0.
  w.data.assign(blocks * block_bytes, m.format == WeightFormat::kInt8 ? uint8_t{128} : uint8_t{0});
  w.scales.assign(blocks * groups * kRowBlock, 0);
  if (m.format == WeightFormat::kInt4) w.mins.assign(w.scales.size(), 0);
  for (int64_t row = 0; row < m.rows; ++row) {
    uint8_t* block = w.data.data() + (row / kRowBlock) * block_bytes;
    const int64_t r = row % kRowBlock;
    const int8_t* q = m.q.data() + row * m.cols;
    for (int64_t c = 0; c < m.cols; ++c) {
      uint8_t& byte = block[IntByteOffset(m.format, r, c)];
      if (m.format == WeightFormat::kInt8) {
        byte = static_cast<uint8_t>(q[c] + 128);
      } else if (c % 8 < 4) {
        byte = static_cast<uint8_t>((byte & 0xf0) | (q[c] & 0x0f));
      } else {
        byte = static_cast<uint8_t>((byte & 0x0f) | ((q[c] & 0x0f) << 4));
      }
    }
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t index = ((row / kRowBlock) * groups + g) * kRowBlock + r;
      w.scales[index] = m.scales[row * groups + g];
      if (m.format == WeightFormat::kInt4) w.mins[index] = m.mins[row * groups + g];
    }
  }
  w.source = absl::StrFormat("Loom %s g%d -> %s g%d (lossless)",
                             m.format == WeightFormat::kInt8 ? "INT8" : "INT4", m.group_size,
                             m.format == WeightFormat::kInt8 ? "INT8" : "INT4", m.group_size);
  return w;
}

absl::StatusOr<QuantizedMatrix> SliceColumns(const QuantizedMatrix& m, int64_t col_begin,
                                             int64_t num_cols) {
  LOOM_RETURN_IF_ERROR(CheckGroup(m.format, m.rows, m.cols, m.group_size));
  if (col_begin < 0 || num_cols <= 0 || col_begin + num_cols > m.cols) {
    return absl::InvalidArgumentError(absl::StrFormat("column slice [%d, %d) is outside [0, %d)",
                                                      col_begin, col_begin + num_cols, m.cols));
  }
  const int64_t groups = m.groups_per_row();
  int64_t group = m.group_size;
  int64_t first_group = col_begin / m.group_size;
  int64_t num_groups = num_cols / m.group_size;
  if (col_begin % m.group_size != 0 || num_cols % m.group_size != 0) {
    if (groups != 1 || num_cols % kActGroup != 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("columns [%d, %d) do not fall on the %d-column quantization groups",
                          col_begin, col_begin + num_cols, m.group_size));
    }
    // One scale per row: every column slice of the row shares it.
    group = num_cols;
    first_group = 0;
    num_groups = 1;
  }
  QuantizedMatrix out;
  out.format = m.format;
  out.rows = m.rows;
  out.cols = num_cols;
  out.group_size = group;
  out.q.resize(m.rows * num_cols);
  out.scales.resize(m.rows * num_groups);
  if (m.format == WeightFormat::kInt4) out.mins.resize(out.scales.size());
  for (int64_t row = 0; row < m.rows; ++row) {
    std::copy_n(m.q.data() + row * m.cols + col_begin, num_cols, out.q.data() + row * num_cols);
    std::copy_n(m.scales.data() + row * groups + first_group, num_groups,
                out.scales.data() + row * num_groups);
    if (m.format == WeightFormat::kInt4) {
      std::copy_n(m.mins.data() + row * groups + first_group, num_groups,
                  out.mins.data() + row * num_groups);
    }
  }
  return out;
}

}  // namespace loom::kernels::cpu
