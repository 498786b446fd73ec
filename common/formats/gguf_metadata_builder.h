#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/formats/gguf_file.h"

namespace loom::common {

/// Collects GGUF metadata entries in order (for GgufFile::FromParts): what the
/// translation of another model format into a GGUF view writes. Not thread-safe.
class GgufMetadataBuilder {
 public:
  using Entries = std::vector<std::pair<std::string, GgufValue>>;

  void Int(std::string key, int64_t value) {
    entries_.emplace_back(std::move(key), GgufValue(GgufValueType::kInt64, value));
  }
  void Float(std::string key, double value) {
    entries_.emplace_back(std::move(key), GgufValue(GgufValueType::kFloat64, value));
  }
  void Bool(std::string key, bool value) {
    entries_.emplace_back(std::move(key), GgufValue(GgufValueType::kBool, value));
  }
  void String(std::string key, std::string value) {
    entries_.emplace_back(std::move(key), GgufValue(GgufValueType::kString, std::move(value)));
  }
  void StringArray(std::string key, const std::vector<std::string>& values) {
    GgufValue::Array array;
    array.reserve(values.size());
    for (const std::string& value : values) array.emplace_back(GgufValueType::kString, value);
    entries_.emplace_back(
        std::move(key), GgufValue(GgufValueType::kArray, std::move(array), GgufValueType::kString));
  }
  void IntArray(std::string key, const std::vector<int64_t>& values) {
    GgufValue::Array array;
    array.reserve(values.size());
    for (int64_t value : values) array.emplace_back(GgufValueType::kInt32, value);
    entries_.emplace_back(
        std::move(key), GgufValue(GgufValueType::kArray, std::move(array), GgufValueType::kInt32));
  }
  void BoolArray(std::string key, const std::vector<bool>& values) {
    GgufValue::Array array;
    array.reserve(values.size());
    for (bool value : values) array.emplace_back(GgufValueType::kBool, value);
    entries_.emplace_back(std::move(key),
                          GgufValue(GgufValueType::kArray, std::move(array), GgufValueType::kBool));
  }
  void FloatArray(std::string key, const std::vector<float>& values) {
    GgufValue::Array array;
    array.reserve(values.size());
    for (float value : values) array.emplace_back(GgufValueType::kFloat32, double{value});
    entries_.emplace_back(std::move(key), GgufValue(GgufValueType::kArray, std::move(array),
                                                    GgufValueType::kFloat32));
  }
  /// Whether `key` was added.
  bool Has(const std::string& key) const {
    for (const auto& entry : entries_) {
      if (entry.first == key) return true;
    }
    return false;
  }

  Entries& entries() { return entries_; }

 private:
  Entries entries_;
};

}  // namespace loom::common
