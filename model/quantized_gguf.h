#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/formats/gguf_file.h"
#include "common/formats/gguf_writer.h"
#include "kernels/cpu/quantize.h"

namespace loom::model {

/// How Loom's INT8 / INT4 weights are stored in a GGUF file (docs/quantization.md).
/// A matrix W [rows, cols] named N is stored as companions of N (no tensor N itself, so
/// a reader that checks N's logical shape never sees a packed one), in ggml order:
///   N.q8     I8  [cols, rows]      INT8: q in [-128, 127]
///   N.q4     I8  [cols / 2, rows]  INT4: two q in [0, 15] per byte (column 2j in the
///                                  low nibble, 2j + 1 in the high one)
///   N.scale  F16 [cols / group_size, rows]
///   N.min    F16 [cols / group_size, rows]  (INT4 only)
/// value = q * scale (INT8), q * scale + min (INT4); the group size is cols divided by
/// N.scale's first dimension. `loom.quantization.*` metadata describes how the file was
/// made (format, requested group size, method, calibration).
inline constexpr char kQ8Suffix[] = ".q8";
inline constexpr char kQ4Suffix[] = ".q4";
inline constexpr char kScaleSuffix[] = ".scale";
inline constexpr char kMinSuffix[] = ".min";
inline constexpr char kQuantizationVersionKey[] = "loom.quantization.version";
/// Version of this layout; files with a larger loom.quantization.version are refused.
inline constexpr uint32_t kQuantizationVersion = 1;

/// For a tensor of `gguf` that is one of the companions above, the matrix name N it
/// belongs to (and whether it holds the q values); nullopt for any other tensor.
std::optional<std::pair<std::string, bool>> LoomMatrixOf(const common::GgufFile& gguf,
                                                         std::string_view tensor_name);

/// True when the matrix `name` is stored in Loom's encoding in `gguf` (N.q8 or N.q4).
bool IsLoomQuantized(const common::GgufFile& gguf, std::string_view name);

/// FailedPrecondition when the file's loom.quantization.version is newer than this
/// build understands (absent: fine).
absl::Status CheckQuantizationVersion(const common::GgufFile& gguf);

/// Adds `matrix` to `writer` as the tensor `name` and its companions.
absl::Status AddQuantizedTensor(common::GgufWriter& writer, const std::string& name,
                                const kernels::cpu::QuantizedMatrix& matrix);

/// Rows [row_begin, row_begin + num_rows) of the Loom-quantized matrix `name`, which
/// must be [rows, cols]; only those bytes of the file are read. InvalidArgument naming
/// the tensor for a wrong type, shape or companion.
absl::StatusOr<kernels::cpu::QuantizedMatrix> ReadQuantizedRows(const common::GgufFile& gguf,
                                                                const std::string& name,
                                                                int64_t rows, int64_t cols,
                                                                int64_t row_begin,
                                                                int64_t num_rows);

/// The whole Loom-quantized matrix `name`, its shape taken from the file.
absl::StatusOr<kernels::cpu::QuantizedMatrix> ReadQuantized(const common::GgufFile& gguf,
                                                            const std::string& name);

/// Any 2-D weight `name` as F32 [rows, cols] (GGUF types through DequantizeTensor, Loom's
/// encoding through DequantizeMatrix); `rows`/`cols` receive the shape.
absl::StatusOr<std::vector<float>> ReadMatrixF32(const common::GgufFile& gguf,
                                                 const std::string& name, int64_t& rows,
                                                 int64_t& cols);

}  // namespace loom::model
