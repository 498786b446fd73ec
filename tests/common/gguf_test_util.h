#pragma once

// Builds GGUF images in memory for tests: valid ones through the typed helpers, and
// malformed ones by overriding counts/version or by editing the returned bytes.

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "common/formats/gguf_file.h"

namespace loom::common::testing {

/// Little-endian encodings of GGUF primitives.
inline std::string Le32(uint32_t value) {
  std::string bytes(4, '\0');
  std::memcpy(bytes.data(), &value, 4);
  return bytes;
}
inline std::string Le64(uint64_t value) {
  std::string bytes(8, '\0');
  std::memcpy(bytes.data(), &value, 8);
  return bytes;
}
inline std::string GgufString(const std::string& text) { return Le64(text.size()) + text; }
template <typename T>
std::string Raw(T value) {
  std::string bytes(sizeof(T), '\0');
  std::memcpy(bytes.data(), &value, sizeof(T));
  return bytes;
}

/// Encoded value of an array: element type, count, then `payload` (the encoded elements).
inline std::string ArrayValue(GgufValueType element_type, uint64_t count,
                              const std::string& payload) {
  return Le32(static_cast<uint32_t>(element_type)) + Le64(count) + payload;
}

/// An in-memory GGUF writer. Tensors get the next aligned offset unless one is given.
class GgufImageBuilder {
 public:
  /// Adds one key with an already-encoded value of `type`.
  GgufImageBuilder& Kv(const std::string& key, GgufValueType type, const std::string& value) {
    kvs_ += GgufString(key) + Le32(static_cast<uint32_t>(type)) + value;
    ++num_kvs_;
    return *this;
  }
  GgufImageBuilder& KvU32(const std::string& key, uint32_t value) {
    return Kv(key, GgufValueType::kUint32, Le32(value));
  }
  GgufImageBuilder& KvI32(const std::string& key, int32_t value) {
    return Kv(key, GgufValueType::kInt32, Raw(value));
  }
  GgufImageBuilder& KvU64(const std::string& key, uint64_t value) {
    return Kv(key, GgufValueType::kUint64, Le64(value));
  }
  GgufImageBuilder& KvF32(const std::string& key, float value) {
    return Kv(key, GgufValueType::kFloat32, Raw(value));
  }
  GgufImageBuilder& KvBool(const std::string& key, bool value) {
    return Kv(key, GgufValueType::kBool, std::string(1, value ? '\1' : '\0'));
  }
  GgufImageBuilder& KvString(const std::string& key, const std::string& value) {
    return Kv(key, GgufValueType::kString, GgufString(value));
  }
  GgufImageBuilder& KvStringArray(const std::string& key, const std::vector<std::string>& values) {
    std::string payload;
    for (const std::string& value : values) payload += GgufString(value);
    return Kv(key, GgufValueType::kArray, ArrayValue(GgufValueType::kString, values.size(), payload));
  }
  /// Sets general.alignment (as uint32) and pads with it.
  GgufImageBuilder& Alignment(uint32_t alignment) {
    alignment_ = alignment;
    return KvU32("general.alignment", alignment);
  }

  /// Adds a tensor info with `data` as its bytes (zeros of the right size if empty).
  GgufImageBuilder& Tensor(const std::string& name, const std::vector<uint64_t>& shape,
                           uint32_t type, std::string data = {},
                           std::optional<uint64_t> offset = std::nullopt) {
    if (data.empty()) {
      uint64_t elements = 1;
      for (uint64_t dim : shape) elements *= dim;
      absl::StatusOr<uint64_t> bytes = GgmlRowBytes(static_cast<GgmlType>(type), elements);
      data.assign(bytes.ok() ? *bytes : 0, '\0');
    }
    // The data goes at the next aligned position; an explicit `offset` is recorded as
    // given (to build overlapping, misaligned or out-of-range tensors).
    const uint64_t at = (blob_.size() + alignment_ - 1) / alignment_ * alignment_;
    blob_.resize(at, '\0');
    blob_ += data;
    infos_ += GgufString(name) + Le32(static_cast<uint32_t>(shape.size()));
    for (uint64_t dim : shape) infos_ += Le64(dim);
    infos_ += Le32(type) + Le64(offset.value_or(at));
    ++num_tensors_;
    return *this;
  }
  /// Raw bytes appended after the tensor infos (before alignment padding).
  GgufImageBuilder& RawInfo(const std::string& bytes, uint64_t num_tensors) {
    infos_ += bytes;
    num_tensors_ += num_tensors;
    return *this;
  }

  GgufImageBuilder& Version(uint32_t version) {
    version_ = version;
    return *this;
  }
  GgufImageBuilder& KvCount(uint64_t count) {
    kv_count_override_ = count;
    return *this;
  }
  GgufImageBuilder& TensorCount(uint64_t count) {
    tensor_count_override_ = count;
    return *this;
  }

  /// The file image.
  std::string Build() const {
    std::string image = "GGUF" + Le32(version_) + Le64(tensor_count_override_.value_or(num_tensors_)) +
                        Le64(kv_count_override_.value_or(num_kvs_)) + kvs_ + infos_;
    if (num_tensors_ > 0 || !blob_.empty()) {
      image.resize((image.size() + alignment_ - 1) / alignment_ * alignment_, '\0');
      image += blob_;
    }
    return image;
  }

 private:
  uint32_t version_ = 3;
  uint64_t alignment_ = 32;
  std::optional<uint64_t> kv_count_override_;
  std::optional<uint64_t> tensor_count_override_;
  std::string kvs_;
  uint64_t num_kvs_ = 0;
  std::string infos_;
  uint64_t num_tensors_ = 0;
  std::string blob_;
};

}  // namespace loom::common::testing
