#include "model/quantized_gguf.h"

#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace loom::model {
namespace {

using common::GgmlType;
using kernels::cpu::QuantizedMatrix;
using kernels::cpu::WeightFormat;

std::string ShapeText(const std::vector<uint64_t>& shape) {
  std::string text;
  for (uint64_t d : shape) absl::StrAppend(&text, text.empty() ? "" : "x", d);
  return text;
}

std::vector<uint8_t> U16Bytes(const std::vector<uint16_t>& values) {
  std::vector<uint8_t> bytes(values.size() * 2);
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

}  // namespace

bool IsLoomQuantized(const common::GgufFile& gguf, std::string_view name) {
  const absl::string_view base(name.data(), name.size());
  return gguf.FindTensor(absl::StrCat(base, kQ8Suffix)) != nullptr ||
         gguf.FindTensor(absl::StrCat(base, kQ4Suffix)) != nullptr;
}

std::optional<std::pair<std::string, bool>> LoomMatrixOf(const common::GgufFile& gguf,
                                                         std::string_view tensor_name) {
  const absl::string_view name(tensor_name.data(), tensor_name.size());
  for (const char* suffix : {kQ8Suffix, kQ4Suffix, kScaleSuffix, kMinSuffix}) {
    if (!absl::EndsWith(name, suffix)) continue;
    const std::string base(name.substr(0, name.size() - std::strlen(suffix)));
    if (IsLoomQuantized(gguf, base)) {
      const bool values = suffix == kQ8Suffix || suffix == kQ4Suffix;
      return std::make_pair(base, values);
    }
  }
  return std::nullopt;
}

absl::Status CheckQuantizationVersion(const common::GgufFile& gguf) {
  if (gguf.Find(kQuantizationVersionKey) == nullptr) return absl::OkStatus();
  LOOM_ASSIGN_OR_RETURN(int64_t version, gguf.GetInt(kQuantizationVersionKey));
  if (version < 1 || version > kQuantizationVersion) {
    return absl::FailedPreconditionError(
        absl::StrFormat("%s is %d; this build reads Loom quantized weights of version 1 to %d",
                        kQuantizationVersionKey, version, kQuantizationVersion));
  }
  return absl::OkStatus();
}

absl::Status AddQuantizedTensor(common::GgufWriter& writer, const std::string& name,
                                const QuantizedMatrix& m) {
  LOOM_RETURN_IF_ERROR(kernels::cpu::ValidateQuantizedMatrix(m));
  const uint64_t rows = static_cast<uint64_t>(m.rows);
  const uint64_t groups = static_cast<uint64_t>(m.groups_per_row());
  std::vector<uint8_t> values;
  std::vector<uint64_t> shape;
  if (m.format == WeightFormat::kInt8) {
    values.resize(m.q.size());
    std::memcpy(values.data(), m.q.data(), values.size());
    shape = {static_cast<uint64_t>(m.cols), rows};
  } else {
    // cols is a multiple of 32, so every row packs into whole bytes.
    values.resize(m.q.size() / 2);
    for (size_t i = 0; i < values.size(); ++i) {
      values[i] = static_cast<uint8_t>((m.q[2 * i] & 0x0f) | ((m.q[2 * i + 1] & 0x0f) << 4));
    }
    shape = {static_cast<uint64_t>(m.cols / 2), rows};
  }
  LOOM_RETURN_IF_ERROR(
      writer.AddTensor(absl::StrCat(name, m.format == WeightFormat::kInt8 ? kQ8Suffix : kQ4Suffix),
                       shape, GgmlType::kI8, std::move(values)));
  LOOM_RETURN_IF_ERROR(writer.AddTensor(absl::StrCat(name, kScaleSuffix), {groups, rows},
                                        GgmlType::kF16, U16Bytes(m.scales)));
  if (m.format == WeightFormat::kInt4) {
    LOOM_RETURN_IF_ERROR(writer.AddTensor(absl::StrCat(name, kMinSuffix), {groups, rows},
                                          GgmlType::kF16, U16Bytes(m.mins)));
  }
  return absl::OkStatus();
}

absl::StatusOr<QuantizedMatrix> ReadQuantizedRows(const common::GgufFile& gguf,
                                                  const std::string& name, int64_t rows,
                                                  int64_t cols, int64_t row_begin,
                                                  int64_t num_rows) {
  auto error = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("Loom-quantized tensor ", name, ": ", what));
  };
  const common::GgufTensorInfo* q8 = gguf.FindTensor(absl::StrCat(name, kQ8Suffix));
  const common::GgufTensorInfo* q4 = gguf.FindTensor(absl::StrCat(name, kQ4Suffix));
  const common::GgufTensorInfo* values = q8 != nullptr ? q8 : q4;
  const common::GgufTensorInfo* scales = gguf.FindTensor(absl::StrCat(name, kScaleSuffix));
  const common::GgufTensorInfo* mins = gguf.FindTensor(absl::StrCat(name, kMinSuffix));
  if (values == nullptr || scales == nullptr)
    return error("the .q8/.q4 values or .scale are missing");
  if (q8 != nullptr && q4 != nullptr) return error("has both .q8 and .q4 values");
  if (row_begin < 0 || num_rows <= 0 || row_begin + num_rows > rows) {
    return error(absl::StrFormat("rows [%d, %d) are outside [0, %d)", row_begin,
                                 row_begin + num_rows, rows));
  }
  const WeightFormat format = q4 != nullptr ? WeightFormat::kInt4 : WeightFormat::kInt8;
  if ((format == WeightFormat::kInt4) != (mins != nullptr)) {
    return error(format == WeightFormat::kInt4 ? "INT4 values need a .min"
                                               : "INT8 values take no .min");
  }
  const uint64_t stored_cols = format == WeightFormat::kInt4 ? cols / 2 : cols;
  if (values->type != GgmlType::kI8) {
    return error(absl::StrCat("values must be I8, got ",
                              common::RawGgmlTypeName(static_cast<uint32_t>(values->type))));
  }
  if (values->shape != std::vector<uint64_t>{stored_cols, static_cast<uint64_t>(rows)} ||
      cols % 2 != 0) {
    return error(absl::StrFormat(
        "values have shape [%s], %s [%d, %d] needs [%d x %d]", ShapeText(values->shape),
        format == WeightFormat::kInt4 ? "INT4" : "INT8", rows, cols, stored_cols, rows));
  }
  if (scales->type != GgmlType::kF16 || scales->shape.size() != 2 ||
      scales->shape[1] != static_cast<uint64_t>(rows) || scales->shape[0] == 0 ||
      static_cast<uint64_t>(cols) % scales->shape[0] != 0) {
    return error(absl::StrFormat(
        ".scale must be F16 [groups, %d] with groups dividing %d, got %s [%s]", rows, cols,
        common::RawGgmlTypeName(static_cast<uint32_t>(scales->type)), ShapeText(scales->shape)));
  }
  if (mins != nullptr && (mins->type != GgmlType::kF16 || mins->shape != scales->shape)) {
    return error(absl::StrFormat(
        ".min must be F16 [%s] like .scale, got %s [%s]", ShapeText(scales->shape),
        common::RawGgmlTypeName(static_cast<uint32_t>(mins->type)), ShapeText(mins->shape)));
  }
  const int64_t groups = static_cast<int64_t>(scales->shape[0]);
  QuantizedMatrix m;
  m.format = format;
  m.rows = num_rows;
  m.cols = cols;
  m.group_size = cols / groups;
  const absl::Span<const uint8_t> value_bytes = gguf.TensorData(*values);
  const absl::Span<const uint8_t> scale_bytes = gguf.TensorData(*scales);
  if (value_bytes.size() != values->num_bytes || scale_bytes.size() != scales->num_bytes) {
    return error("data lies outside the file");
  }
  m.q.resize(num_rows * cols);
  const uint8_t* src = value_bytes.data() + row_begin * stored_cols;
  if (format == WeightFormat::kInt8) {
    std::memcpy(m.q.data(), src, m.q.size());
  } else {
    for (int64_t i = 0; i < num_rows * cols / 2; ++i) {
      m.q[2 * i] = static_cast<int8_t>(src[i] & 0x0f);
      m.q[2 * i + 1] = static_cast<int8_t>(src[i] >> 4);
    }
  }
  m.scales.resize(num_rows * groups);
  std::memcpy(m.scales.data(), scale_bytes.data() + row_begin * groups * 2, m.scales.size() * 2);
  if (mins != nullptr) {
    const absl::Span<const uint8_t> min_bytes = gguf.TensorData(*mins);
    if (min_bytes.size() != mins->num_bytes) return error("data lies outside the file");
    m.mins.resize(m.scales.size());
    std::memcpy(m.mins.data(), min_bytes.data() + row_begin * groups * 2, m.mins.size() * 2);
  }
  absl::Status valid = kernels::cpu::ValidateQuantizedMatrix(m);
  if (!valid.ok()) return error(std::string(valid.message()));
  return m;
}

absl::StatusOr<QuantizedMatrix> ReadQuantized(const common::GgufFile& gguf,
                                              const std::string& name) {
  const common::GgufTensorInfo* q8 = gguf.FindTensor(absl::StrCat(name, kQ8Suffix));
  const common::GgufTensorInfo* q4 = gguf.FindTensor(absl::StrCat(name, kQ4Suffix));
  const common::GgufTensorInfo* values = q8 != nullptr ? q8 : q4;
  if (values == nullptr || values->shape.size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("Loom-quantized tensor ", name, " is missing or not 2-D"));
  }
  const int64_t rows = static_cast<int64_t>(values->shape[1]);
  const int64_t cols = static_cast<int64_t>(values->shape[0]) * (q8 != nullptr ? 1 : 2);
  return ReadQuantizedRows(gguf, name, rows, cols, 0, rows);
}

absl::StatusOr<std::vector<float>> ReadMatrixF32(const common::GgufFile& gguf,
                                                 const std::string& name, int64_t& rows,
                                                 int64_t& cols) {
  if (IsLoomQuantized(gguf, name)) {
    LOOM_ASSIGN_OR_RETURN(QuantizedMatrix matrix, ReadQuantized(gguf, name));
    rows = matrix.rows;
    cols = matrix.cols;
    std::vector<float> values(rows * cols);
    kernels::cpu::DequantizeMatrix(matrix, values.data());
    return values;
  }
  const common::GgufTensorInfo* tensor = gguf.FindTensor(name);
  if (tensor == nullptr || tensor->shape.size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", name, " is missing or not 2-D"));
  }
  cols = static_cast<int64_t>(tensor->shape[0]);
  rows = static_cast<int64_t>(tensor->shape[1]);
  return gguf.DequantizeTensor(*tensor);
}

}  // namespace loom::model
