#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/formats/file_image.h"

namespace loom::common {

/// Element types Loom reads from safetensors files. Other dtypes of the format (F64, I64,
/// I16, I8, BOOL, F8_*) are refused by name when a file is opened.
/// kI32: the packed integers of AWQ/GPTQ checkpoints; kF8E4M3: FP8 checkpoints' weights
/// (common/formats/hf_quantization); kU8: MXFP4 checkpoints' packed nibbles and exponents
/// (gpt-oss, common/formats/hf_gpt_oss_experts).
enum class SafetensorsDtype { kF32, kF16, kBF16, kI32, kF8E4M3, kU8 };

/// "F32", "F16", "BF16", "I32", "F8_E4M3" or "U8".
std::string_view SafetensorsDtypeName(SafetensorsDtype dtype);
/// Bytes of one element: 4, 2 or 1.
uint64_t SafetensorsDtypeSize(SafetensorsDtype dtype);

/// Where one tensor lives in a safetensors file.
struct SafetensorsTensorInfo {
  std::string name;
  SafetensorsDtype dtype = SafetensorsDtype::kF32;
  std::vector<uint64_t> shape;  // row-major (numpy order): shape.back() is contiguous
  uint64_t offset = 0;          // from the start of the data section
  uint64_t num_bytes = 0;       // == product(shape) * element size (checked on open)
};

/// A parsed safetensors file (8-byte little-endian header length, JSON header, data).
/// The data stays memory-mapped (or in the owned buffer). The header is validated on
/// open: dtypes known, shapes times element size equal to each tensor's byte span,
/// spans inside the file and not overlapping, so a truncated or hostile file gives an
/// error, never a crash. Immutable after creation, thread-safe.
class SafetensorsFile {
 public:
  /// Maps and parses the file at `path`.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  /// Parses an in-memory image (tests, fuzzing); `label` names it in errors.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> FromBytes(std::string bytes,
                                                                    std::string label = "<memory>");

  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  /// The path (or label) the file was opened from.
  const std::string& path() const { return path_; }
  /// Tensors in name order.
  const std::vector<SafetensorsTensorInfo>& tensors() const { return tensors_; }
  /// `__metadata__` string entries.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// The tensor named `name`, or nullptr.
  const SafetensorsTensorInfo* FindTensor(std::string_view name) const;
  /// The raw bytes of a tensor of this file (valid while this object lives; mapped, not
  /// copied).
  absl::Span<const uint8_t> TensorData(const SafetensorsTensorInfo& tensor) const;
  /// Rows [first_row, first_row + num_rows) of a 1-D or 2-D tensor, viewed as [rows,
  /// cols] (1-D: one element per row): a contiguous range of the mapping, no copy.
  /// OutOfRange when the range does not lie inside the tensor.
  absl::StatusOr<absl::Span<const uint8_t>> Rows(const SafetensorsTensorInfo& tensor,
                                                 uint64_t first_row, uint64_t num_rows) const;
  /// Columns [first_col, first_col + num_cols) of every row of a 2-D tensor, copied into
  /// a packed [rows, num_cols] buffer (only the slice is read). OutOfRange when the range
  /// does not lie inside the tensor.
  absl::StatusOr<std::vector<uint8_t>> Columns(const SafetensorsTensorInfo& tensor,
                                               uint64_t first_col, uint64_t num_cols) const;

 private:
  SafetensorsFile() = default;
  absl::Status Parse();

  std::string path_;
  FileImage image_;
  const uint8_t* data_ = nullptr;  // image_'s bytes
  size_t size_ = 0;
  uint64_t data_offset_ = 0;  // 8 + header length

  std::vector<SafetensorsTensorInfo> tensors_;
  absl::flat_hash_map<std::string, size_t> tensor_index_;
  std::map<std::string, std::string> metadata_;
};

/// The weights of a Hugging Face checkpoint directory: `model.safetensors`, or the shards
/// listed by `model.safetensors.index.json` (its `weight_map`). Every shard is opened and
/// validated; each tensor must be in the shard the index names. Immutable, thread-safe.
class SafetensorsCheckpoint {
 public:
  /// Opens the checkpoint in directory `dir`.
  static absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> Open(const std::string& dir);

  /// One tensor and the shard that holds it.
  struct Entry {
    const SafetensorsFile* file = nullptr;
    const SafetensorsTensorInfo* tensor = nullptr;
  };
  /// The tensor named `name`; `file` is null when absent.
  Entry Find(std::string_view name) const;
  /// Every tensor, in shard then header order.
  const std::vector<Entry>& entries() const { return entries_; }
  /// The opened shards.
  const std::vector<std::unique_ptr<SafetensorsFile>>& shards() const { return shards_; }

 private:
  SafetensorsCheckpoint() = default;
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::vector<Entry> entries_;
  absl::flat_hash_map<std::string, size_t> index_;
};

}  // namespace loom::common
