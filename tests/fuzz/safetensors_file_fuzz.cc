// libFuzzer target for the safetensors reader: any byte string must give either a parsed
// file or an error status, never a crash, a sanitizer report or an unbounded allocation.
// Built and run by run_fuzz.sh (ctest entry fuzz/safetensors_file).

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/formats/safetensors_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using loom::common::SafetensorsFile;
  using loom::common::SafetensorsTensorInfo;
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> parsed =
      SafetensorsFile::FromBytes(std::string(reinterpret_cast<const char*>(data), size));
  if (!parsed.ok()) return 0;
  const SafetensorsFile& file = **parsed;
  uint64_t checksum = 0;
  for (const SafetensorsTensorInfo& tensor : file.tensors()) {
    for (uint8_t byte : file.TensorData(tensor)) checksum += byte;
    // Slices at the edges of every tensor (valid and one past the end).
    const uint64_t rows = tensor.shape.empty() ? 0 : tensor.shape[0];
    for (uint64_t first : {uint64_t{0}, rows / 2, rows}) {
      if (auto slice = file.Rows(tensor, first, rows - first); slice.ok())
        checksum += slice->size();
      if (auto slice = file.Rows(tensor, first, rows + 1); slice.ok()) checksum += slice->size();
    }
    if (tensor.shape.size() == 2 && tensor.num_bytes <= (uint64_t{1} << 16)) {
      const uint64_t cols = tensor.shape[1];
      if (auto slice = file.Columns(tensor, cols / 2, cols - cols / 2); slice.ok()) {
        checksum += slice->size();
      }
      if (auto slice = file.Columns(tensor, cols, 1); slice.ok()) checksum += slice->size();
    }
  }
  return checksum == 1 ? 0 : 0;
}
