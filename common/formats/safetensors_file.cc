#include "common/formats/safetensors_file.h"


#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace loom::common {
namespace {

using nlohmann::json;

// The format's own limit on the header (safetensors refuses larger ones too).
constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;
constexpr size_t kMaxDims = 8;

// Dtypes the format defines that Loom does not serve: refused by name.
constexpr std::string_view kRefusedDtypes[] = {"F64", "I64",     "U64",     "U32",     "I16",
                                               "U16", "I8",      "BOOL",    "F8_E5M2", "F8_E8M0",
                                               "F4",  "F6_E2M3", "F6_E3M2", "C64"};

absl::StatusOr<SafetensorsDtype> ParseDtype(const std::string& name, const std::string& tensor) {
  if (name == "F32") return SafetensorsDtype::kF32;
  if (name == "F16") return SafetensorsDtype::kF16;
  if (name == "BF16") return SafetensorsDtype::kBF16;
  if (name == "I32") return SafetensorsDtype::kI32;
  if (name == "F8_E4M3") return SafetensorsDtype::kF8E4M3;
  if (name == "U8") return SafetensorsDtype::kU8;
  for (std::string_view refused : kRefusedDtypes) {
    if (name == refused) {
      return absl::UnimplementedError(absl::StrCat("tensor '", tensor, "' has dtype ", name,
                                                   ", which Loom does not read (supported: F32, "
                                                   "F16, BF16, I32, F8_E4M3, U8)"));
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("tensor '", tensor, "' has unknown dtype '", name, "'"));
}

// a * b, or false on uint64 overflow.
bool MulOverflows(uint64_t a, uint64_t b, uint64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}

absl::StatusOr<std::string> ReadTextFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read '", path.string(), "'"));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

std::string_view SafetensorsDtypeName(SafetensorsDtype dtype) {
  switch (dtype) {
    case SafetensorsDtype::kF32:
      return "F32";
    case SafetensorsDtype::kF16:
      return "F16";
    case SafetensorsDtype::kBF16:
      return "BF16";
    case SafetensorsDtype::kI32:
      return "I32";
    case SafetensorsDtype::kF8E4M3:
      return "F8_E4M3";
    case SafetensorsDtype::kU8:
      return "U8";
  }
  return "unknown";
}

uint64_t SafetensorsDtypeSize(SafetensorsDtype dtype) {
  switch (dtype) {
    case SafetensorsDtype::kF32:
    case SafetensorsDtype::kI32:
      return 4;
    case SafetensorsDtype::kF8E4M3:
    case SafetensorsDtype::kU8:
      return 1;
    default:
      return 2;
  }
}

SafetensorsFile::~SafetensorsFile() = default;

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  LOOM_ASSIGN_OR_RETURN(FileImage image, FileImage::Map(path, "safetensors file"));
  auto file = std::unique_ptr<SafetensorsFile>(new SafetensorsFile());
  file->path_ = path;
  file->image_ = std::move(image);
  file->data_ = file->image_.data();
  file->size_ = file->image_.size();
  absl::Status status = file->Parse();
  if (!status.ok()) {
    return absl::Status(status.code(), absl::StrCat(path, ": ", status.message()));
  }
  return file;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::FromBytes(std::string bytes,
                                                                            std::string label) {
  auto file = std::unique_ptr<SafetensorsFile>(new SafetensorsFile());
  file->path_ = std::move(label);
  file->image_ = FileImage::FromBytes(std::move(bytes));
  file->data_ = file->image_.data();
  file->size_ = file->image_.size();
  absl::Status status = file->Parse();
  if (!status.ok()) {
    return absl::Status(status.code(), absl::StrCat(file->path_, ": ", status.message()));
  }
  return file;
}

absl::Status SafetensorsFile::Parse() {
  if (size_ < 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("truncated: ", size_, " bytes, less than the 8-byte header length"));
  }
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | data_[i];
  if (header_bytes > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("header length ", header_bytes, " exceeds the limit of ", kMaxHeaderBytes));
  }
  if (header_bytes > size_ - 8) {
    return absl::InvalidArgumentError(absl::StrCat("truncated: header length ", header_bytes,
                                                   " but only ", size_ - 8,
                                                   " bytes follow the length"));
  }
  data_offset_ = 8 + header_bytes;
  const uint64_t data_size = size_ - data_offset_;
  const char* header_text = reinterpret_cast<const char*>(data_ + 8);
  json header = json::parse(header_text, header_text + header_bytes, nullptr,
                            /*allow_exceptions=*/false);
  if (header.is_discarded()) return absl::InvalidArgumentError("header is not valid JSON");
  if (!header.is_object()) return absl::InvalidArgumentError("header is not a JSON object");

  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) {
        return absl::InvalidArgumentError("__metadata__ is not an object of strings");
      }
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) {
          return absl::InvalidArgumentError(
              absl::StrCat("__metadata__ entry '", key, "' is not a string"));
        }
        metadata_[key] = value.get<std::string>();
      }
      continue;
    }
    if (!entry.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", name, "': entry is not an object"));
    }
    const auto dtype = entry.find("dtype");
    const auto shape = entry.find("shape");
    const auto offsets = entry.find("data_offsets");
    if (dtype == entry.end() || !dtype->is_string()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': no string 'dtype'"));
    }
    if (shape == entry.end() || !shape->is_array() || shape->size() > kMaxDims) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", name, "': 'shape' is not an array of at most ", kMaxDims, " sizes"));
    }
    if (offsets == entry.end() || !offsets->is_array() || offsets->size() != 2 ||
        !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", name, "': 'data_offsets' is not a pair of non-negative integers"));
    }
    SafetensorsTensorInfo info;
    info.name = name;
    LOOM_ASSIGN_OR_RETURN(info.dtype, ParseDtype(dtype->get<std::string>(), name));
    uint64_t bytes = SafetensorsDtypeSize(info.dtype);
    for (const json& dim : *shape) {
      if (!dim.is_number_unsigned()) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor '", name, "': shape entry ", dim.dump(), " is not a size"));
      }
      const uint64_t size = dim.get<uint64_t>();
      info.shape.push_back(size);
      if (MulOverflows(bytes, size, &bytes)) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor '", name, "': shape ", shape->dump(), " overflows"));
      }
    }
    const uint64_t begin = (*offsets)[0].get<uint64_t>();
    const uint64_t end = (*offsets)[1].get<uint64_t>();
    if (begin > end || end > data_size) {
      return absl::OutOfRangeError(absl::StrCat("tensor '", name, "': data_offsets [", begin, ", ",
                                                end, "] outside the ", data_size,
                                                "-byte data section (truncated file?)"));
    }
    if (end - begin != bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", name, "': shape ", shape->dump(), " of ", dtype->get<std::string>(),
          " needs ", bytes, " bytes but data_offsets span ", end - begin));
    }
    info.offset = begin;
    info.num_bytes = bytes;
    tensor_index_[info.name] = tensors_.size();
    tensors_.push_back(std::move(info));
  }

  // No two tensors may share bytes.
  std::vector<const SafetensorsTensorInfo*> by_offset;
  for (const SafetensorsTensorInfo& tensor : tensors_) {
    if (tensor.num_bytes > 0) by_offset.push_back(&tensor);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const auto* a, const auto* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const SafetensorsTensorInfo& previous = *by_offset[i - 1];
    if (by_offset[i]->offset < previous.offset + previous.num_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensors '", previous.name, "' and '", by_offset[i]->name, "' overlap"));
    }
  }
  return absl::OkStatus();
}

const SafetensorsTensorInfo* SafetensorsFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(absl::string_view(name.data(), name.size()));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

absl::Span<const uint8_t> SafetensorsFile::TensorData(const SafetensorsTensorInfo& tensor) const {
  const uint64_t data_size = size_ - data_offset_;
  // A tensor info from another file must not read outside this one.
  if (tensor.offset > data_size || tensor.num_bytes > data_size - tensor.offset) return {};
  return absl::Span<const uint8_t>(data_ + data_offset_ + tensor.offset, tensor.num_bytes);
}

absl::StatusOr<absl::Span<const uint8_t>> SafetensorsFile::Rows(const SafetensorsTensorInfo& tensor,
                                                                uint64_t first_row,
                                                                uint64_t num_rows) const {
  if (tensor.shape.empty() || tensor.shape.size() > 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", tensor.name, "' is not 1-D or 2-D: no rows to slice"));
  }
  const uint64_t rows = tensor.shape[0];
  const uint64_t row_bytes =
      SafetensorsDtypeSize(tensor.dtype) * (tensor.shape.size() == 2 ? tensor.shape[1] : 1);
  if (first_row > rows || num_rows > rows - first_row) {
    return absl::OutOfRangeError(absl::StrCat("tensor '", tensor.name, "': rows [", first_row,
                                              ", +", num_rows, ") outside its ", rows, " rows"));
  }
  absl::Span<const uint8_t> data = TensorData(tensor);
  if (data.size() != tensor.num_bytes) {
    return absl::OutOfRangeError(
        absl::StrCat("tensor '", tensor.name, "': data lies outside this file"));
  }
  return data.subspan(first_row * row_bytes, num_rows * row_bytes);
}

absl::StatusOr<std::vector<uint8_t>> SafetensorsFile::Columns(const SafetensorsTensorInfo& tensor,
                                                              uint64_t first_col,
                                                              uint64_t num_cols) const {
  if (tensor.shape.size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", tensor.name, "' is not 2-D: no columns to slice"));
  }
  const uint64_t cols = tensor.shape[1];
  if (first_col > cols || num_cols > cols - first_col) {
    return absl::OutOfRangeError(absl::StrCat("tensor '", tensor.name, "': columns [", first_col,
                                              ", +", num_cols, ") outside its ", cols, " columns"));
  }
  absl::Span<const uint8_t> data = TensorData(tensor);
  if (data.size() != tensor.num_bytes) {
    return absl::OutOfRangeError(
        absl::StrCat("tensor '", tensor.name, "': data lies outside this file"));
  }
  const uint64_t element = SafetensorsDtypeSize(tensor.dtype);
  const uint64_t rows = tensor.shape[0];
  std::vector<uint8_t> slice(rows * num_cols * element);
  // An empty tensor's data may be a null span (nothing to copy from).
  if (slice.empty()) return slice;
  for (uint64_t r = 0; r < rows; ++r) {
    std::memcpy(slice.data() + r * num_cols * element,
                data.data() + (r * cols + first_col) * element, num_cols * element);
  }
  return slice;
}

absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> SafetensorsCheckpoint::Open(
    const std::string& dir) {
  namespace fs = std::filesystem;
  auto checkpoint = std::unique_ptr<SafetensorsCheckpoint>(new SafetensorsCheckpoint());
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  const fs::path single_path = fs::path(dir) / "model.safetensors";
  std::error_code error;
  // Tensor name -> shard file name, from the index (empty for a single file).
  std::map<std::string, std::string> weight_map;
  std::vector<std::string> shard_names;
  if (fs::exists(index_path, error)) {
    LOOM_ASSIGN_OR_RETURN(std::string text, ReadTextFile(index_path));
    json index = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (index.is_discarded() || !index.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(index_path.string(), ": not a JSON object"));
    }
    const auto map = index.find("weight_map");
    if (map == index.end() || !map->is_object() || map->empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path.string(), ": no 'weight_map' object of tensor -> shard"));
    }
    for (const auto& [tensor, shard] : map->items()) {
      if (!shard.is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat(index_path.string(), ": weight_map['", tensor, "'] is not a file name"));
      }
      const std::string shard_name = shard.get<std::string>();
      // Shards are files beside the index, never paths elsewhere.
      if (shard_name.empty() || shard_name.find('/') != std::string::npos || shard_name == "." ||
          shard_name == "..") {
        return absl::InvalidArgumentError(absl::StrCat(index_path.string(), ": weight_map['",
                                                       tensor, "'] names '", shard_name,
                                                       "', not a file in the directory"));
      }
      weight_map[tensor] = shard_name;
      if (std::find(shard_names.begin(), shard_names.end(), shard_name) == shard_names.end()) {
        shard_names.push_back(shard_name);
      }
    }
  } else if (fs::exists(single_path, error)) {
    shard_names.push_back("model.safetensors");
  } else {
    return absl::NotFoundError(
        absl::StrCat("'", dir, "' has neither model.safetensors nor model.safetensors.index.json"));
  }
  std::sort(shard_names.begin(), shard_names.end());

  for (const std::string& shard_name : shard_names) {
    LOOM_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> shard,
                          SafetensorsFile::Open((fs::path(dir) / shard_name).string()));
    checkpoint->shards_.push_back(std::move(shard));
  }
  for (size_t s = 0; s < checkpoint->shards_.size(); ++s) {
    const SafetensorsFile& shard = *checkpoint->shards_[s];
    const std::string shard_name = fs::path(shard.path()).filename().string();
    for (const SafetensorsTensorInfo& tensor : shard.tensors()) {
      if (!weight_map.empty()) {
        auto it = weight_map.find(tensor.name);
        if (it == weight_map.end() || it->second != shard_name) {
          return absl::InvalidArgumentError(absl::StrCat(shard.path(), ": tensor '", tensor.name,
                                                         "' is not assigned to this shard by ",
                                                         index_path.string()));
        }
      }
      if (!checkpoint->index_.emplace(tensor.name, checkpoint->entries_.size()).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor '", tensor.name, "' appears in more than one shard"));
      }
      checkpoint->entries_.push_back(Entry{&shard, &tensor});
    }
  }
  for (const auto& [tensor, shard_name] : weight_map) {
    if (!checkpoint->index_.contains(tensor)) {
      return absl::InvalidArgumentError(absl::StrCat(index_path.string(), ": tensor '", tensor,
                                                     "' is missing from shard ", shard_name));
    }
  }
  return checkpoint;
}

SafetensorsCheckpoint::Entry SafetensorsCheckpoint::Find(std::string_view name) const {
  auto it = index_.find(absl::string_view(name.data(), name.size()));
  return it == index_.end() ? Entry{} : entries_[it->second];
}

}  // namespace loom::common
