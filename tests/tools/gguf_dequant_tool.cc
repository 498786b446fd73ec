// Dequantizes tensors of a GGUF file to F32 for tests/common/ggml_type_test.py.
//
//   gguf_dequant_tool <in.gguf> <out.bin> [tensor names...]
//
// With no names, every tensor is written. out.bin holds, per tensor: uint32 name
// length, the name, uint64 element count, then the F32 values (little-endian).
// Exits 1 with the error on stderr when the file or a tensor cannot be read.

#include <cstdio>
#include <string>
#include <vector>

#include "common/formats/gguf_file.h"

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

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s <in.gguf> <out.bin> [tensor names...]\n", argv[0]);
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
    absl::StatusOr<std::vector<float>> values = (*file)->DequantizeTensor(*tensor);
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
