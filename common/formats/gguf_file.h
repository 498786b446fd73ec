#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/formats/file_image.h"
#include "absl/types/span.h"
#include "common/formats/ggml_type.h"

namespace loom::common {

/// Metadata value types of the GGUF format (v2 and v3).
enum class GgufValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

/// One metadata value: a scalar, a string, or an array of values (arrays nest).
class GgufValue {
 public:
  using Array = std::vector<GgufValue>;
  using Storage = std::variant<uint64_t, int64_t, double, bool, std::string, Array>;

  GgufValue() = default;
  GgufValue(GgufValueType type, Storage storage, GgufValueType element_type = GgufValueType::kUint8)
      : type_(type), element_type_(element_type), storage_(std::move(storage)) {}

  /// The type as stored in the file.
  GgufValueType type() const { return type_; }
  /// For arrays: the type of the elements; meaningless otherwise.
  GgufValueType element_type() const { return element_type_; }

  /// Any integer type (or bool) as int64; OutOfRange if it does not fit.
  absl::StatusOr<int64_t> AsInt() const;
  /// Float32/Float64, or an integer converted to double.
  absl::StatusOr<double> AsDouble() const;
  absl::StatusOr<bool> AsBool() const;
  absl::StatusOr<std::string_view> AsString() const;
  /// The elements of an array; FailedPrecondition for non-arrays.
  absl::StatusOr<const Array*> AsArray() const;
  /// The stored value itself (uint64 for unsigned types, int64 for signed, double for
  /// floats): what GgufWriter re-encodes, so values round-trip bit for bit.
  const Storage& storage() const { return storage_; }

 private:
  GgufValueType type_ = GgufValueType::kUint8;
  GgufValueType element_type_ = GgufValueType::kUint8;
  Storage storage_;
};

/// Where one tensor lives in the file.
struct GgufTensorInfo {
  std::string name;
  std::vector<uint64_t> shape;  // ggml order: shape[0] is the contiguous (fastest) dim
  GgmlType type = GgmlType::kF32;
  uint64_t offset = 0;        // from the start of the data section, aligned
  uint64_t num_elements = 0;  // product of shape
  uint64_t num_bytes = 0;     // bytes of data in the file
};

/// A parsed GGUF file. The tensor data stays memory-mapped (or in the owned buffer);
/// metadata and tensor infos are parsed and validated on open. Every offset, count and
/// size is checked against the file, so a truncated or hostile file gives an error,
/// never a crash or an unbounded allocation. Immutable after creation, thread-safe.
class GgufFile {
 public:
  /// Maps and parses the file at `path`.
  static absl::StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);
  /// Parses an in-memory image of a GGUF file (tests, fuzzing); takes ownership.
  static absl::StatusOr<std::unique_ptr<GgufFile>> FromBytes(std::string bytes);
  /// A GGUF view of a model stored in another format (a Hugging Face directory): the
  /// given metadata and tensor infos, tensor i's bytes at `tensor_data[i]` (not copied;
  /// `backing` keeps them alive). InvalidArgument for duplicate names or a span whose
  /// size differs from the tensor's num_bytes.
  static absl::StatusOr<std::unique_ptr<GgufFile>> FromParts(
      std::vector<std::pair<std::string, GgufValue>> metadata, std::vector<GgufTensorInfo> tensors,
      std::vector<absl::Span<const uint8_t>> tensor_data, std::shared_ptr<const void> backing);

  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }

  /// Metadata in file order.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return metadata_; }
  /// The value for `key`, or nullptr.
  const GgufValue* Find(std::string_view key) const;
  /// Typed look-ups: NotFound when absent, InvalidArgument (naming the key) on a type
  /// mismatch.
  absl::StatusOr<int64_t> GetInt(std::string_view key) const;
  absl::StatusOr<double> GetDouble(std::string_view key) const;
  absl::StatusOr<bool> GetBool(std::string_view key) const;
  absl::StatusOr<std::string_view> GetString(std::string_view key) const;
  absl::StatusOr<const GgufValue::Array*> GetArray(std::string_view key) const;

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  /// The tensor named `name`, or nullptr.
  const GgufTensorInfo* FindTensor(std::string_view name) const;
  /// The raw bytes of a tensor (valid while this object lives).
  absl::Span<const uint8_t> TensorData(const GgufTensorInfo& tensor) const;
  /// Dequantizes a whole tensor to F32.
  absl::StatusOr<std::vector<float>> DequantizeTensor(const GgufTensorInfo& tensor) const;

 private:
  GgufFile() = default;
  absl::Status Parse();

  FileImage image_;
  const uint8_t* data_ = nullptr;  // image_'s bytes (empty for a FromParts view)
  size_t size_ = 0;

  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;  // start of the tensor data section in the image
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  absl::flat_hash_map<std::string, size_t> metadata_index_;
  std::vector<GgufTensorInfo> tensors_;
  absl::flat_hash_map<std::string, size_t> tensor_index_;
  bool is_view_ = false;  // made by FromParts
  // FromParts only: tensor i's bytes (parallel to tensors_), and what owns them.
  std::vector<absl::Span<const uint8_t>> external_data_;
  std::shared_ptr<const void> backing_;
};

}  // namespace loom::common
