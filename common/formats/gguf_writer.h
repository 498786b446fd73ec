#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/formats/ggml_type.h"
#include "common/formats/gguf_file.h"

namespace loom::common {

/// Builds a GGUF v3 file, the writing side of GgufFile: metadata in insertion order
/// (every value type GgufFile reads, nested arrays included), then tensor infos, then
/// the data section. Layout as the GGUF specification and the PyPI `gguf` writer: the
/// data section starts at the first multiple of the alignment (`general.alignment` when
/// set, else 32) after the tensor infos, and every tensor starts at an aligned offset
/// (zero padding after each tensor, the last one included). Not thread-safe.
class GgufWriter {
 public:
  /// Sets `key` to `value`; an existing key keeps its position and takes the new value.
  void Set(std::string_view key, GgufValue value);
  void SetString(std::string_view key, std::string value);
  void SetUint32(std::string_view key, uint32_t value);
  void SetInt32(std::string_view key, int32_t value);
  void SetFloat32(std::string_view key, float value);
  void SetBool(std::string_view key, bool value);
  /// Removes `key` if present.
  void Remove(std::string_view key);
  /// Copies every metadata key of `file`, in file order, with its stored type.
  void CopyMetadata(const GgufFile& file);
  /// The value of `key`, or nullptr.
  const GgufValue* Find(std::string_view key) const;

  /// Adds a tensor owning `data`. `shape` is in ggml order (shape[0] contiguous); the
  /// data must be exactly GgmlRowBytes(type, product of shape) bytes. InvalidArgument
  /// naming the tensor for a duplicate name, a bad shape or a size mismatch.
  absl::Status AddTensor(std::string name, std::vector<uint64_t> shape, GgmlType type,
                         std::vector<uint8_t> data);
  /// As AddTensor, over bytes owned elsewhere (e.g. the mapped source file), which must
  /// stay valid until the file is written.
  absl::Status AddTensorView(std::string name, std::vector<uint64_t> shape, GgmlType type,
                             absl::Span<const uint8_t> data);

  size_t num_tensors() const { return tensors_.size(); }

  /// The whole file image (tests; small files).
  absl::StatusOr<std::string> Serialize() const;
  /// Writes the file to `path` (through `path`.tmp and a rename, so a reader never sees
  /// a half-written file). InvalidArgument/Internal naming the path on I/O errors.
  absl::Status WriteFile(const std::string& path) const;

 private:
  struct Tensor {
    GgufTensorInfo info;             // offset filled in at serialization
    std::vector<uint8_t> owned;      // the bytes, or empty for a view
    absl::Span<const uint8_t> view;  // the bytes of a view (empty when owned)
    absl::Span<const uint8_t> bytes() const {
      return owned.empty() ? view : absl::MakeConstSpan(owned);
    }
  };

  absl::Status CheckTensor(const std::string& name, const std::vector<uint64_t>& shape,
                           GgmlType type, size_t data_size) const;
  // Alignment from general.alignment (validated) or the default.
  absl::StatusOr<uint64_t> Alignment() const;
  // Everything before the data section, padding included; fills `offsets`.
  absl::StatusOr<std::string> Header(std::vector<uint64_t>& offsets) const;

  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::vector<Tensor> tensors_;
};

}  // namespace loom::common
