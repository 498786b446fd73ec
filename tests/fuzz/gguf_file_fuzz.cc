// libFuzzer target for the GGUF reader: any byte string must give either a parsed
// file or an error status, never a crash, a sanitizer report or an unbounded allocation.
// Built and run by run_fuzz.sh (ctest entry fuzz/gguf_file).

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/formats/gguf_file.h"
#include "common/formats/model_config.h"

namespace {

using loom::common::GgufFile;
using loom::common::GgufTensorInfo;
using loom::common::GgufValue;

// Tensors up to this many elements are dequantized (bounds time per input).
constexpr uint64_t kMaxDequantizeElements = uint64_t{1} << 16;

// Reads every accessor of a value, recursing into arrays; returns a checksum so the
// compiler keeps the reads.
uint64_t TouchValue(const GgufValue& value) {
  uint64_t checksum = static_cast<uint64_t>(value.type()) + static_cast<uint64_t>(value.element_type());
  if (auto i = value.AsInt(); i.ok()) checksum += static_cast<uint64_t>(*i);
  if (auto d = value.AsDouble(); d.ok()) checksum += static_cast<uint64_t>(*d == *d);
  if (auto b = value.AsBool(); b.ok()) checksum += *b;
  if (auto s = value.AsString(); s.ok()) {
    for (char c : *s) checksum += static_cast<unsigned char>(c);
  }
  if (auto a = value.AsArray(); a.ok()) {
    for (const GgufValue& element : **a) checksum += TouchValue(element);
  }
  return checksum;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::StatusOr<std::unique_ptr<GgufFile>> parsed =
      GgufFile::FromBytes(std::string(reinterpret_cast<const char*>(data), size));
  if (!parsed.ok()) return 0;
  const GgufFile& file = **parsed;
  volatile uint64_t checksum = file.version() + file.alignment();
  for (const auto& [key, value] : file.metadata()) {
    checksum = checksum + TouchValue(value);
    if (file.Find(key) != &value) __builtin_trap();  // the index must agree
    (void)file.GetInt(key);
    (void)file.GetDouble(key);
    (void)file.GetBool(key);
    (void)file.GetString(key);
    (void)file.GetArray(key);
  }
  for (const GgufTensorInfo& tensor : file.tensors()) {
    if (file.FindTensor(tensor.name) != &tensor) __builtin_trap();
    absl::Span<const uint8_t> bytes = file.TensorData(tensor);
    if (bytes.size() != tensor.num_bytes) __builtin_trap();  // validated on open
    for (uint8_t byte : bytes) checksum = checksum + byte;
    if (tensor.num_elements <= kMaxDequantizeElements) {
      absl::StatusOr<std::vector<float>> values = file.DequantizeTensor(tensor);
      if (values.ok()) {
        if (values->size() != tensor.num_elements) __builtin_trap();
        for (float v : *values) checksum = checksum + (v == v);
      }
    }
  }
  absl::StatusOr<loom::common::ModelConfig> config = loom::common::ModelConfigFromGguf(file);
  if (config.ok()) checksum = checksum + static_cast<uint64_t>(config->num_layers);
  return 0;
}
