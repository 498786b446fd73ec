// Dequantizes tensors of a GGUF file to F32 for tests/common/ggml_type_test.py.
//
//   gguf_dequant_tool [--packed] <in.gguf> <out.bin> [tensor names...]
//
// With no names, every tensor is written. --packed reads each matrix (2-D tensor) as the
// CPU backend holds it: packed by kernels::cpu::PackWeight, then read back with
// DequantizeRows (what "loads without changing a value" is checked against). out.bin holds, per tensor: uint32 name
// length, the name, uint64 element count, then the F32 values (little-endian).
// Exits 1 with the error on stderr when the file or a tensor cannot be read.

#include <cstdio>
#include <string>
#include <vector>

#include "common/formats/gguf_file.h"
#include "kernels/cpu/weights.h"

namespace {

using loom::common::GgufFile;
using loom::common::GgufTensorInfo;

bool WriteTensor(std::FILE* out, const std::string& name, const std::vector<float>& values) {
  const uint32_t name_length = static_cast<uint32_t>(name.size());
  const uint64_t count = values.size();
  return std::fwrite(&name_length, sizeof(name_length), 1, out) == 1 &&
         std::fwrite(name.data(), 1, name.size(), out) == name.size() &&
         std::fwrite(&count, sizeof(count), 1, out) == 1 &&
         std::fwrite(values.data(), sizeof(float), values.size(), out) == values.size();
}

// The matrix as the CPU backend packs it, read back as F32.
absl::StatusOr<std::vector<float>> PackedValues(const GgufFile& file, const GgufTensorInfo& tensor) {
  const int64_t cols = static_cast<int64_t>(tensor.shape[0]);
  const int64_t rows = static_cast<int64_t>(tensor.shape[1]);
  absl::StatusOr<loom::kernels::cpu::PackedWeight> packed =
      loom::kernels::cpu::PackWeight(tensor.type, file.TensorData(tensor).data(), rows, cols);
  if (!packed.ok()) return packed.status();
  std::vector<float> values(static_cast<size_t>(rows * cols));
  loom::kernels::cpu::DequantizeRows(*packed, 0, rows, values.data());
  std::fprintf(stderr, "%s: %s\n", tensor.name.c_str(), packed->source.c_str());
  return values;
}

}  // namespace

int main(int argc, char** argv) {
  const bool packed = argc > 1 && std::string(argv[1]) == "--packed";
  if (packed) {
    --argc;
    ++argv;
  }
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s [--packed] <in.gguf> <out.bin> [tensor names...]\n", argv[0]);
    return 2;
  }
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(argv[1]);
  if (!file.ok()) {
    std::fprintf(stderr, "%s\n", std::string(file.status().message()).c_str());
    return 1;
  }
  std::vector<const GgufTensorInfo*> selected;
  if (argc == 3) {
    for (const GgufTensorInfo& tensor : (*file)->tensors()) selected.push_back(&tensor);
  } else {
    for (int i = 3; i < argc; ++i) {
      const GgufTensorInfo* tensor = (*file)->FindTensor(argv[i]);
      if (tensor == nullptr) {
        std::fprintf(stderr, "no tensor named '%s'\n", argv[i]);
        return 1;
      }
      selected.push_back(tensor);
    }
  }
  std::FILE* out = std::fopen(argv[2], "wb");
  if (out == nullptr) {
    std::perror(argv[2]);
    return 1;
  }
  for (const GgufTensorInfo* tensor : selected) {
    absl::StatusOr<std::vector<float>> values = packed && tensor->shape.size() == 2
                                                    ? PackedValues(**file, *tensor)
                                                    : (*file)->DequantizeTensor(*tensor);
    if (!values.ok()) {
      std::fprintf(stderr, "%s\n", std::string(values.status().message()).c_str());
      std::fclose(out);
      return 1;
    }
    if (!WriteTensor(out, tensor->name, *values)) {
      std::perror(argv[2]);
      std::fclose(out);
      return 1;
    }
  }
  return std::fclose(out) == 0 ? 0 : 1;
}
