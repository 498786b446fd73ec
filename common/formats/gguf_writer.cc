#include "common/formats/gguf_writer.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace loom::common {
namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" little-endian
constexpr uint32_t kGgufVersion = 3;
constexpr uint64_t kDefaultAlignment = 32;
constexpr uint64_t kMaxAlignment = uint64_t{1} << 30;
constexpr size_t kMaxDims = 4;

template <typename T>
void Put(std::string& out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  out.append(bytes, sizeof(T));
}

void PutString(std::string& out, std::string_view text) {
  Put<uint64_t>(out, text.size());
  out.append(text.data(), text.size());
}

absl::string_view AbslView(std::string_view s) { return absl::string_view(s.data(), s.size()); }

uint64_t AlignUp(uint64_t value, uint64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

// Encodes the payload of `value` (no type tag) as `type`.
absl::Status PutValue(std::string& out, GgufValueType type, const GgufValue& value,
                      std::string_view key) {
  auto mismatch = [&]() {
    return absl::InvalidArgumentError(absl::StrCat("GGUF key '", AbslView(key),
                                                   "': stored value does not match its type ",
                                                   static_cast<uint32_t>(type)));
  };
  const GgufValue::Storage& storage = value.storage();
  auto unsigned_value = [&](uint64_t max, uint64_t& result) -> bool {
    if (const auto* u = std::get_if<uint64_t>(&storage)) {
      result = *u;
    } else if (const auto* i = std::get_if<int64_t>(&storage); i != nullptr && *i >= 0) {
      result = static_cast<uint64_t>(*i);
    } else {
      return false;
    }
    return result <= max;
  };
  auto signed_value = [&](int64_t min, int64_t max, int64_t& result) -> bool {
    if (const auto* i = std::get_if<int64_t>(&storage)) {
      result = *i;
    } else if (const auto* u = std::get_if<uint64_t>(&storage);
               u != nullptr && *u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      result = static_cast<int64_t>(*u);
    } else {
      return false;
    }
    return result >= min && result <= max;
  };
  uint64_t u = 0;
  int64_t i = 0;
  switch (type) {
    case GgufValueType::kUint8:
      if (!unsigned_value(0xff, u)) return mismatch();
      Put<uint8_t>(out, static_cast<uint8_t>(u));
      return absl::OkStatus();
    case GgufValueType::kUint16:
      if (!unsigned_value(0xffff, u)) return mismatch();
      Put<uint16_t>(out, static_cast<uint16_t>(u));
      return absl::OkStatus();
    case GgufValueType::kUint32:
      if (!unsigned_value(0xffffffffu, u)) return mismatch();
      Put<uint32_t>(out, static_cast<uint32_t>(u));
      return absl::OkStatus();
    case GgufValueType::kUint64:
      if (!unsigned_value(std::numeric_limits<uint64_t>::max(), u)) return mismatch();
      Put<uint64_t>(out, u);
      return absl::OkStatus();
    case GgufValueType::kInt8:
      if (!signed_value(-128, 127, i)) return mismatch();
      Put<int8_t>(out, static_cast<int8_t>(i));
      return absl::OkStatus();
    case GgufValueType::kInt16:
      if (!signed_value(-32768, 32767, i)) return mismatch();
      Put<int16_t>(out, static_cast<int16_t>(i));
      return absl::OkStatus();
    case GgufValueType::kInt32:
      if (!signed_value(std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max(),
                        i)) {
        return mismatch();
      }
      Put<int32_t>(out, static_cast<int32_t>(i));
      return absl::OkStatus();
    case GgufValueType::kInt64:
      if (!signed_value(std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(),
                        i)) {
        return mismatch();
      }
      Put<int64_t>(out, i);
      return absl::OkStatus();
    case GgufValueType::kFloat32:
    case GgufValueType::kFloat64: {
      const auto* d = std::get_if<double>(&storage);
      if (d == nullptr) return mismatch();
      // A float32 read from a file widens to double exactly, so this narrows it back
      // to the same bits.
      if (type == GgufValueType::kFloat32) {
        Put<float>(out, static_cast<float>(*d));
      } else {
        Put<double>(out, *d);
      }
      return absl::OkStatus();
    }
    case GgufValueType::kBool: {
      const auto* b = std::get_if<bool>(&storage);
      if (b == nullptr) return mismatch();
      Put<uint8_t>(out, *b ? 1 : 0);
      return absl::OkStatus();
    }
    case GgufValueType::kString: {
      const auto* s = std::get_if<std::string>(&storage);
      if (s == nullptr) return mismatch();
      PutString(out, *s);
      return absl::OkStatus();
    }
    case GgufValueType::kArray: {
      const auto* elements = std::get_if<GgufValue::Array>(&storage);
      if (elements == nullptr) return mismatch();
      const GgufValueType element_type = value.element_type();
      Put<uint32_t>(out, static_cast<uint32_t>(element_type));
      Put<uint64_t>(out, elements->size());
      for (const GgufValue& element : *elements) {
        // Each element is encoded as the array's element type (nested arrays carry
        // their own element type).
        LOOM_RETURN_IF_ERROR(PutValue(out, element_type, element, key));
      }
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "GGUF key '", AbslView(key), "': unknown value type ", static_cast<uint32_t>(type)));
}

}  // namespace

void GgufWriter::Set(std::string_view key, GgufValue value) {
  for (auto& [existing, stored] : metadata_) {
    if (existing == key) {
      stored = std::move(value);
      return;
    }
  }
  metadata_.emplace_back(std::string(key), std::move(value));
}

void GgufWriter::SetString(std::string_view key, std::string value) {
  Set(key, GgufValue(GgufValueType::kString, std::move(value)));
}

void GgufWriter::SetUint32(std::string_view key, uint32_t value) {
  Set(key, GgufValue(GgufValueType::kUint32, uint64_t{value}));
}

void GgufWriter::SetInt32(std::string_view key, int32_t value) {
  Set(key, GgufValue(GgufValueType::kInt32, int64_t{value}));
}

void GgufWriter::SetFloat32(std::string_view key, float value) {
  Set(key, GgufValue(GgufValueType::kFloat32, double{value}));
}

void GgufWriter::SetBool(std::string_view key, bool value) {
  Set(key, GgufValue(GgufValueType::kBool, value));
}

void GgufWriter::Remove(std::string_view key) {
  for (auto it = metadata_.begin(); it != metadata_.end(); ++it) {
    if (it->first == key) {
      metadata_.erase(it);
      return;
    }
  }
}

void GgufWriter::CopyMetadata(const GgufFile& file) {
  for (const auto& [key, value] : file.metadata()) Set(key, value);
}

const GgufValue* GgufWriter::Find(std::string_view key) const {
  for (const auto& [existing, value] : metadata_) {
    if (existing == key) return &value;
  }
  return nullptr;
}

absl::Status GgufWriter::CheckTensor(const std::string& name, const std::vector<uint64_t>& shape,
                                     GgmlType type, size_t data_size) const {
  auto error = [&](std::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("GGUF tensor '", name, "': ", AbslView(what)));
  };
  if (name.empty()) return absl::InvalidArgumentError("GGUF tensor name is empty");
  for (const Tensor& tensor : tensors_) {
    if (tensor.info.name == name) return error("added twice");
  }
  if (shape.empty() || shape.size() > kMaxDims) {
    return error(absl::StrCat(shape.size(), " dimensions (GGUF allows 1 to ", kMaxDims, ")"));
  }
  uint64_t elements = 1;
  for (uint64_t dim : shape) {
    if (dim == 0) return error("a dimension is 0");
    if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / elements) {
      return error("element count overflows int64");
    }
    elements *= dim;
  }
  LOOM_ASSIGN_OR_RETURN(GgmlTypeTraits traits, GetGgmlTypeTraits(static_cast<uint32_t>(type)));
  if (shape[0] % static_cast<uint64_t>(traits.block_size) != 0) {
    return error(absl::StrCat("row length ", shape[0], " is not a multiple of ",
                              AbslView(traits.name), "'s block size ", traits.block_size));
  }
  LOOM_ASSIGN_OR_RETURN(uint64_t bytes, GgmlRowBytes(type, elements));
  if (bytes != data_size) {
    return error(absl::StrCat(elements, " elements of ", AbslView(traits.name), " take ", bytes,
                              " bytes, got ", data_size));
  }
  return absl::OkStatus();
}

absl::Status GgufWriter::AddTensor(std::string name, std::vector<uint64_t> shape, GgmlType type,
                                   std::vector<uint8_t> data) {
  LOOM_RETURN_IF_ERROR(CheckTensor(name, shape, type, data.size()));
  Tensor tensor;
  tensor.info.name = std::move(name);
  tensor.info.shape = std::move(shape);
  tensor.info.type = type;
  tensor.info.num_bytes = data.size();
  tensor.owned = std::move(data);
  tensors_.push_back(std::move(tensor));
  return absl::OkStatus();
}

absl::Status GgufWriter::AddTensorView(std::string name, std::vector<uint64_t> shape, GgmlType type,
                                       absl::Span<const uint8_t> data) {
  LOOM_RETURN_IF_ERROR(CheckTensor(name, shape, type, data.size()));
  Tensor tensor;
  tensor.info.name = std::move(name);
  tensor.info.shape = std::move(shape);
  tensor.info.type = type;
  tensor.info.num_bytes = data.size();
  tensor.view = data;
  tensors_.push_back(std::move(tensor));
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> GgufWriter::Alignment() const {
  const GgufValue* value = Find("general.alignment");
  if (value == nullptr) return kDefaultAlignment;
  absl::StatusOr<int64_t> alignment = value->AsInt();
  if (!alignment.ok() || value->type() == GgufValueType::kBool || *alignment <= 0 ||
      static_cast<uint64_t>(*alignment) > kMaxAlignment || (*alignment & (*alignment - 1)) != 0) {
    return absl::InvalidArgumentError(
        "GGUF key 'general.alignment' must be a power of two in [1, 2^30]");
  }
  return static_cast<uint64_t>(*alignment);
}

absl::StatusOr<std::string> GgufWriter::Header(std::vector<uint64_t>& offsets) const {
  LOOM_ASSIGN_OR_RETURN(uint64_t alignment, Alignment());
  std::string out;
  Put<uint32_t>(out, kGgufMagic);
  Put<uint32_t>(out, kGgufVersion);
  Put<uint64_t>(out, tensors_.size());
  Put<uint64_t>(out, metadata_.size());
  for (const auto& [key, value] : metadata_) {
    PutString(out, key);
    Put<uint32_t>(out, static_cast<uint32_t>(value.type()));
    LOOM_RETURN_IF_ERROR(PutValue(out, value.type(), value, key));
  }
  offsets.clear();
  uint64_t offset = 0;
  for (const Tensor& tensor : tensors_) {
    PutString(out, tensor.info.name);
    Put<uint32_t>(out, static_cast<uint32_t>(tensor.info.shape.size()));
    for (uint64_t dim : tensor.info.shape) Put<uint64_t>(out, dim);
    Put<uint32_t>(out, static_cast<uint32_t>(tensor.info.type));
    Put<uint64_t>(out, offset);
    offsets.push_back(offset);
    offset = AlignUp(offset + tensor.info.num_bytes, alignment);
  }
  out.resize(AlignUp(out.size(), alignment), '\0');
  return out;
}

absl::StatusOr<std::string> GgufWriter::Serialize() const {
  std::vector<uint64_t> offsets;
  LOOM_ASSIGN_OR_RETURN(std::string out, Header(offsets));
  LOOM_ASSIGN_OR_RETURN(uint64_t alignment, Alignment());
  const size_t data_start = out.size();
  for (size_t t = 0; t < tensors_.size(); ++t) {
    out.resize(data_start + offsets[t], '\0');
    absl::Span<const uint8_t> bytes = tensors_[t].bytes();
    out.append(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    out.resize(data_start + AlignUp(out.size() - data_start, alignment), '\0');
  }
  return out;
}

absl::Status GgufWriter::WriteFile(const std::string& path) const {
  std::vector<uint64_t> offsets;
  LOOM_ASSIGN_OR_RETURN(std::string header, Header(offsets));
  LOOM_ASSIGN_OR_RETURN(uint64_t alignment, Alignment());
  const std::string tmp = path + ".tmp";
  std::FILE* file = std::fopen(tmp.c_str(), "wb");
  if (file == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot create '", tmp, "': ", std::strerror(errno)));
  }
  bool ok = std::fwrite(header.data(), 1, header.size(), file) == header.size();
  const std::string zeros(alignment, '\0');
  uint64_t written = 0;  // bytes of the data section so far
  for (size_t t = 0; ok && t < tensors_.size(); ++t) {
    absl::Span<const uint8_t> bytes = tensors_[t].bytes();
    ok = std::fwrite(bytes.data(), 1, bytes.size(), file) == bytes.size();
    written = offsets[t] + bytes.size();
    const uint64_t padding = AlignUp(written, alignment) - written;
    ok = ok && std::fwrite(zeros.data(), 1, padding, file) == padding;
  }
  const int saved_errno = errno;
  ok = (std::fclose(file) == 0) && ok;
  if (!ok) {
    std::remove(tmp.c_str());
    return absl::InternalError(
        absl::StrCat("writing '", tmp, "' failed: ", std::strerror(saved_errno)));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int error = errno;
    std::remove(tmp.c_str());
    return absl::InternalError(
        absl::StrCat("cannot rename '", tmp, "' to '", path, "': ", std::strerror(error)));
  }
  return absl::OkStatus();
}

}  // namespace loom::common
