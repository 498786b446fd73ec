#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace loom::common {

/// A whole model file's bytes, as the GGUF and safetensors readers parse them: mapped
/// read-only from disk (no copy; pages load on first touch), or owned bytes made in memory
/// (tests, fuzzers). Move-only; unmapped on destruction. Not thread-safe to move, safe to
/// read from any thread.
class FileImage {
 public:
  /// Maps `path` read-only. NotFound when it does not exist; InvalidArgument when it cannot
  /// be opened, is not a regular file or cannot be mapped. `kind` names the format in the
  /// messages ("GGUF file", "safetensors file").
  static absl::StatusOr<FileImage> Map(const std::string& path, absl::string_view kind);
  /// Holds `bytes` itself.
  static FileImage FromBytes(std::string bytes);

  FileImage() = default;
  FileImage(FileImage&& other) noexcept;
  FileImage& operator=(FileImage&& other) noexcept;
  FileImage(const FileImage&) = delete;
  FileImage& operator=(const FileImage&) = delete;
  ~FileImage();

  /// The first byte (null for an empty image) and the byte count.
  const uint8_t* data() const {
    return mapped_ != nullptr ? static_cast<const uint8_t*>(mapped_)
                              : reinterpret_cast<const uint8_t*>(owned_.data());
  }
  size_t size() const { return mapped_ != nullptr ? mapped_size_ : owned_.size(); }

 private:
  // Exactly one of mapped_ (with mapped_size_) and owned_ holds the bytes.
  void* mapped_ = nullptr;
  size_t mapped_size_ = 0;
  std::string owned_;
};

}  // namespace loom::common
