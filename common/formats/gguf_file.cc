#include "common/formats/gguf_file.h"


#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace loom::common {
namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" read as little-endian uint32
constexpr uint64_t kDefaultAlignment = 32;
// general.alignment above this is not a plausible file layout (and would let a hostile
// file push the data section arbitrarily far).
constexpr uint64_t kMaxAlignment = uint64_t{1} << 30;
// Nested arrays recurse; this bounds the stack depth a hostile file can cause.
constexpr int kMaxArrayDepth = 16;
constexpr uint32_t kMaxDims = 4;
// Smallest possible encodings, used to bound counts by the bytes that remain.
constexpr uint64_t kMinKeyValueBytes = 8 + 4 + 1;         // empty key, type, uint8
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;  // name, n_dims, 1 dim, type, offset

absl::string_view ValueTypeName(uint32_t type) {
  switch (static_cast<GgufValueType>(type)) {
    case GgufValueType::kUint8: return "uint8";
    case GgufValueType::kInt8: return "int8";
    case GgufValueType::kUint16: return "uint16";
    case GgufValueType::kInt16: return "int16";
    case GgufValueType::kUint32: return "uint32";
    case GgufValueType::kInt32: return "int32";
    case GgufValueType::kFloat32: return "float32";
    case GgufValueType::kBool: return "bool";
    case GgufValueType::kString: return "string";
    case GgufValueType::kArray: return "array";
    case GgufValueType::kUint64: return "uint64";
    case GgufValueType::kInt64: return "int64";
    case GgufValueType::kFloat64: return "float64";
  }
  return "unknown";
}

// Bytes one value of `type` occupies at least; 0 for a type GGUF does not define.
uint64_t MinValueBytes(uint32_t type) {
  switch (static_cast<GgufValueType>(type)) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kBool:
      return 1;
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
      return 2;
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kFloat32:
      return 4;
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
    case GgufValueType::kFloat64:
    case GgufValueType::kString:  // the uint64 length
      return 8;
    case GgufValueType::kArray:  // element type + count
      return 12;
  }
  return 0;
}

// Bounds-checked little-endian cursor over the file image. Every read reports what it
// was reading and where, so errors on hostile files say what was wrong.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }

  absl::Status Need(uint64_t bytes, absl::string_view what) const {
    if (bytes > remaining()) {
      return absl::OutOfRangeError(absl::StrCat("GGUF truncated reading ", what, " at offset ",
                                                pos_, ": need ", bytes, " bytes, ",
                                                remaining(), " remain"));
    }
    return absl::OkStatus();
  }

  template <typename T>
  absl::StatusOr<T> Read(absl::string_view what) {
    LOOM_RETURN_IF_ERROR(Need(sizeof(T), what));
    T value;
    std::memcpy(&value, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return value;
  }

  absl::StatusOr<std::string> ReadString(absl::string_view what) {
    LOOM_ASSIGN_OR_RETURN(uint64_t length, Read<uint64_t>(what));
    if (length > remaining()) {
      return absl::OutOfRangeError(absl::StrCat("GGUF ", what, " at offset ", pos_ - 8,
                                                " has length ", length, " but only ",
                                                remaining(), " bytes remain"));
    }
    std::string value(reinterpret_cast<const char*>(data_ + pos_), length);
    pos_ += length;
    return value;
  }

 private:
  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

absl::StatusOr<GgufValue> ReadValue(Reader& reader, uint32_t type, absl::string_view key,
                                    int depth);

absl::StatusOr<GgufValue> ReadArray(Reader& reader, absl::string_view key, int depth) {
  if (depth >= kMaxArrayDepth) {
    return absl::InvalidArgumentError(absl::StrCat("GGUF key '", key, "': arrays nested deeper than ",
                                                   kMaxArrayDepth, " levels"));
  }
  LOOM_ASSIGN_OR_RETURN(uint32_t element_type, reader.Read<uint32_t>("array element type"));
  const uint64_t min_bytes = MinValueBytes(element_type);
  if (min_bytes == 0) {
    return absl::InvalidArgumentError(absl::StrCat("GGUF key '", key,
                                                   "': unknown array element type ",
                                                   element_type));
  }
  LOOM_ASSIGN_OR_RETURN(uint64_t count, reader.Read<uint64_t>("array length"));
  if (count > reader.remaining() / min_bytes) {
    return absl::OutOfRangeError(absl::StrCat(
        "GGUF key '", key, "': array of ", count, " ", ValueTypeName(element_type),
        " elements cannot fit in the ", reader.remaining(), " bytes that remain"));
  }
  GgufValue::Array elements;
  elements.reserve(count);
  for (uint64_t i = 0; i < count; ++i) {
    LOOM_ASSIGN_OR_RETURN(GgufValue element, ReadValue(reader, element_type, key, depth + 1));
    elements.push_back(std::move(element));
  }
  return GgufValue(GgufValueType::kArray, std::move(elements),
                   static_cast<GgufValueType>(element_type));
}

absl::StatusOr<GgufValue> ReadValue(Reader& reader, uint32_t type, absl::string_view key,
                                    int depth) {
  const auto value_type = static_cast<GgufValueType>(type);
  switch (value_type) {
    case GgufValueType::kUint8: {
      LOOM_ASSIGN_OR_RETURN(uint8_t v, reader.Read<uint8_t>("uint8 value"));
      return GgufValue(value_type, uint64_t{v});
    }
    case GgufValueType::kInt8: {
      LOOM_ASSIGN_OR_RETURN(int8_t v, reader.Read<int8_t>("int8 value"));
      return GgufValue(value_type, int64_t{v});
    }
    case GgufValueType::kUint16: {
      LOOM_ASSIGN_OR_RETURN(uint16_t v, reader.Read<uint16_t>("uint16 value"));
      return GgufValue(value_type, uint64_t{v});
    }
    case GgufValueType::kInt16: {
      LOOM_ASSIGN_OR_RETURN(int16_t v, reader.Read<int16_t>("int16 value"));
      return GgufValue(value_type, int64_t{v});
    }
    case GgufValueType::kUint32: {
      LOOM_ASSIGN_OR_RETURN(uint32_t v, reader.Read<uint32_t>("uint32 value"));
      return GgufValue(value_type, uint64_t{v});
    }
    case GgufValueType::kInt32: {
      LOOM_ASSIGN_OR_RETURN(int32_t v, reader.Read<int32_t>("int32 value"));
      return GgufValue(value_type, int64_t{v});
    }
    case GgufValueType::kUint64: {
      LOOM_ASSIGN_OR_RETURN(uint64_t v, reader.Read<uint64_t>("uint64 value"));
      return GgufValue(value_type, v);
    }
    case GgufValueType::kInt64: {
      LOOM_ASSIGN_OR_RETURN(int64_t v, reader.Read<int64_t>("int64 value"));
      return GgufValue(value_type, v);
    }
    case GgufValueType::kFloat32: {
      LOOM_ASSIGN_OR_RETURN(float v, reader.Read<float>("float32 value"));
      return GgufValue(value_type, double{v});
    }
    case GgufValueType::kFloat64: {
      LOOM_ASSIGN_OR_RETURN(double v, reader.Read<double>("float64 value"));
      return GgufValue(value_type, v);
    }
    case GgufValueType::kBool: {
      const uint64_t offset = reader.pos();
      LOOM_ASSIGN_OR_RETURN(uint8_t v, reader.Read<uint8_t>("bool value"));
      if (v > 1) {
        return absl::InvalidArgumentError(absl::StrCat("GGUF key '", key, "': bool at offset ",
                                                       offset, " has value ", v,
                                                       " (expected 0 or 1)"));
      }
      return GgufValue(value_type, v == 1);
    }
    case GgufValueType::kString: {
      LOOM_ASSIGN_OR_RETURN(std::string v, reader.ReadString("string value"));
      return GgufValue(value_type, std::move(v));
    }
    case GgufValueType::kArray:
      return ReadArray(reader, key, depth);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("GGUF key '", key, "': unknown value type ", type));
}

absl::string_view AbslView(std::string_view s) { return absl::string_view(s.data(), s.size()); }

std::string ShapeString(const std::vector<uint64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace

// ---------------------------------------------------------------------------------------
// GgufValue

absl::StatusOr<int64_t> GgufValue::AsInt() const {
  if (const auto* u = std::get_if<uint64_t>(&storage_)) {
    if (*u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return absl::OutOfRangeError(absl::StrCat("value ", *u, " does not fit in int64"));
    }
    return static_cast<int64_t>(*u);
  }
  if (const auto* i = std::get_if<int64_t>(&storage_)) return *i;
  if (const auto* b = std::get_if<bool>(&storage_)) return *b ? 1 : 0;
  return absl::InvalidArgumentError(
      absl::StrCat("expected an integer, got ", ValueTypeName(static_cast<uint32_t>(type_))));
}

absl::StatusOr<double> GgufValue::AsDouble() const {
  if (const auto* d = std::get_if<double>(&storage_)) return *d;
  if (const auto* u = std::get_if<uint64_t>(&storage_)) return static_cast<double>(*u);
  if (const auto* i = std::get_if<int64_t>(&storage_)) return static_cast<double>(*i);
  return absl::InvalidArgumentError(
      absl::StrCat("expected a number, got ", ValueTypeName(static_cast<uint32_t>(type_))));
}

absl::StatusOr<bool> GgufValue::AsBool() const {
  if (const auto* b = std::get_if<bool>(&storage_)) return *b;
  return absl::InvalidArgumentError(
      absl::StrCat("expected a bool, got ", ValueTypeName(static_cast<uint32_t>(type_))));
}

absl::StatusOr<std::string_view> GgufValue::AsString() const {
  if (const auto* s = std::get_if<std::string>(&storage_)) return std::string_view(*s);
  return absl::InvalidArgumentError(
      absl::StrCat("expected a string, got ", ValueTypeName(static_cast<uint32_t>(type_))));
}

absl::StatusOr<const GgufValue::Array*> GgufValue::AsArray() const {
  if (const auto* a = std::get_if<Array>(&storage_)) return a;
  return absl::FailedPreconditionError(
      absl::StrCat("expected an array, got ", ValueTypeName(static_cast<uint32_t>(type_))));
}

// ---------------------------------------------------------------------------------------
// GgufFile

GgufFile::~GgufFile() = default;

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  LOOM_ASSIGN_OR_RETURN(FileImage image, FileImage::Map(path, "GGUF file"));
  auto file = std::unique_ptr<GgufFile>(new GgufFile());
  file->image_ = std::move(image);
  file->data_ = file->image_.data();
  file->size_ = file->image_.size();
  absl::Status status = file->Parse();
  if (!status.ok()) {
    return absl::Status(status.code(), absl::StrCat(path, ": ", status.message()));
  }
  return file;
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::FromBytes(std::string bytes) {
  auto file = std::unique_ptr<GgufFile>(new GgufFile());
  file->image_ = FileImage::FromBytes(std::move(bytes));
  file->data_ = file->image_.data();
  file->size_ = file->image_.size();
  LOOM_RETURN_IF_ERROR(file->Parse());
  return file;
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::FromParts(
    std::vector<std::pair<std::string, GgufValue>> metadata, std::vector<GgufTensorInfo> tensors,
    std::vector<absl::Span<const uint8_t>> tensor_data, std::shared_ptr<const void> backing) {
  if (tensor_data.size() != tensors.size()) {
    return absl::InvalidArgumentError(absl::StrCat("GGUF view: ", tensors.size(), " tensors but ",
                                                   tensor_data.size(), " data spans"));
  }
  auto file = std::unique_ptr<GgufFile>(new GgufFile());
  file->version_ = 3;
  file->is_view_ = true;
  for (size_t i = 0; i < metadata.size(); ++i) {
    if (!file->metadata_index_.emplace(metadata[i].first, i).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("GGUF view: duplicate metadata key '", metadata[i].first, "'"));
    }
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensor_data[i].size() != tensors[i].num_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("GGUF view: tensor '", tensors[i].name,
                                                     "' has ", tensor_data[i].size(),
                                                     " bytes, expected ", tensors[i].num_bytes));
    }
    if (!file->tensor_index_.emplace(tensors[i].name, i).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("GGUF view: duplicate tensor '", tensors[i].name, "'"));
    }
  }
  file->metadata_ = std::move(metadata);
  file->tensors_ = std::move(tensors);
  file->external_data_ = std::move(tensor_data);
  file->backing_ = std::move(backing);
  return file;
}

namespace {

// The magic and the version (2 or 3), with what is wrong named: v1, big-endian, unknown.
absl::StatusOr<uint32_t> ReadMagicAndVersion(Reader& reader, const uint8_t* data) {
  LOOM_ASSIGN_OR_RETURN(uint32_t magic, reader.Read<uint32_t>("magic"));
  if (magic != kGgufMagic) {
    std::string found(reinterpret_cast<const char*>(data), 4);
    return absl::InvalidArgumentError(absl::StrFormat(
        "not a GGUF file: bad magic 0x%08x (\"%s\"), expected \"GGUF\"", magic,
        absl::CHexEscape(found)));
  }
  LOOM_ASSIGN_OR_RETURN(uint32_t version, reader.Read<uint32_t>("version"));
  if (version == 1) {
    return absl::InvalidArgumentError(
        "unsupported GGUF version 1 (pre-release format with 32-bit counts); re-convert the "
        "model to GGUF v3");
  }
  if (version != 2 && version != 3) {
    const uint32_t swapped = __builtin_bswap32(version);
    if (swapped >= 1 && swapped <= 3) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unsupported big-endian GGUF file (version ", swapped, " byte-swapped)"));
    }
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported GGUF version ", version, " (supported: 2, 3)"));
  }
  return version;
}

// The value of metadata key `key` (type, then value); errors from a generic read name
// the key.
absl::StatusOr<GgufValue> ReadMetadataValue(Reader& reader, const std::string& key) {
  LOOM_ASSIGN_OR_RETURN(uint32_t type, reader.Read<uint32_t>("metadata value type"));
  absl::StatusOr<GgufValue> value = ReadValue(reader, type, key, 0);
  if (!value.ok()) {
    std::string message(value.status().message());
    if (message.find(absl::StrCat("'", key, "'")) == std::string::npos) {
      message = absl::StrCat("GGUF key '", key, "': ", message);
    }
    return absl::Status(value.status().code(), message);
  }
  return value;
}

// general.alignment, which changes where tensor data starts: a power of two in
// [1, kMaxAlignment]; kDefaultAlignment when absent.
absl::StatusOr<uint64_t> AlignmentOf(const GgufValue* alignment) {
  if (alignment == nullptr) return kDefaultAlignment;
  absl::StatusOr<int64_t> value = alignment->AsInt();
  if (!value.ok() || alignment->type() == GgufValueType::kBool) {
    return absl::InvalidArgumentError(
        absl::StrCat("GGUF key 'general.alignment' must be an unsigned integer, got ",
                     ValueTypeName(static_cast<uint32_t>(alignment->type()))));
  }
  if (*value <= 0 || static_cast<uint64_t>(*value) > kMaxAlignment ||
      (*value & (*value - 1)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("GGUF key 'general.alignment' is ", *value,
                                                   ": must be a power of two in [1, ",
                                                   kMaxAlignment, "]"));
  }
  return static_cast<uint64_t>(*value);
}

// One tensor info after its name: shape, type, byte count and an aligned data offset.
absl::Status ReadTensorInfo(Reader& reader, uint64_t alignment, GgufTensorInfo& info) {
  auto tensor_error = [&info](absl::string_view message) {
    return absl::InvalidArgumentError(absl::StrCat("GGUF tensor '", info.name, "': ", message));
  };
  // Truncation keeps its OutOfRange code but names the tensor.
  auto read_error = [&info](const absl::Status& status) {
    return absl::Status(status.code(),
                        absl::StrCat("GGUF tensor '", info.name, "': ", status.message()));
  };
  absl::StatusOr<uint32_t> n_dims = reader.Read<uint32_t>("tensor n_dims");
  if (!n_dims.ok()) return read_error(n_dims.status());
  if (*n_dims == 0 || *n_dims > kMaxDims) {
    return tensor_error(absl::StrCat("n_dims ", *n_dims, " is out of range [1, ", kMaxDims, "]"));
  }
  uint64_t num_elements = 1;
  for (uint32_t d = 0; d < *n_dims; ++d) {
    absl::StatusOr<uint64_t> dim = reader.Read<uint64_t>("tensor dimension");
    if (!dim.ok()) return read_error(dim.status());
    info.shape.push_back(*dim);
    if (*dim == 0) {
      return tensor_error(absl::StrCat("dimension ", d, " is 0"));
    }
    if (*dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / num_elements) {
      return tensor_error(absl::StrCat("element count of shape so far ", ShapeString(info.shape),
                                       " overflows int64"));
    }
    num_elements *= *dim;
  }
  info.num_elements = num_elements;
  absl::StatusOr<uint32_t> raw_type = reader.Read<uint32_t>("tensor type");
  if (!raw_type.ok()) return read_error(raw_type.status());
  absl::StatusOr<GgmlTypeTraits> traits = GetGgmlTypeTraits(*raw_type);
  if (!traits.ok()) {
    return tensor_error(absl::StrCat("unknown tensor type ", *raw_type));
  }
  info.type = static_cast<GgmlType>(*raw_type);
  if (info.shape[0] % static_cast<uint64_t>(traits->block_size) != 0) {
    return tensor_error(absl::StrCat("row length ", info.shape[0], " of type ",
                                     AbslView(traits->name),
                                     " is not a multiple of its block size ", traits->block_size));
  }
  absl::StatusOr<uint64_t> num_bytes = GgmlRowBytes(info.type, num_elements);
  if (!num_bytes.ok()) return read_error(num_bytes.status());
  info.num_bytes = *num_bytes;
  absl::StatusOr<uint64_t> offset = reader.Read<uint64_t>("tensor data offset");
  if (!offset.ok()) return read_error(offset.status());
  info.offset = *offset;
  if (info.offset % alignment != 0) {
    return tensor_error(absl::StrCat("data offset ", info.offset,
                                     " is not a multiple of the alignment ", alignment));
  }
  return absl::OkStatus();
}

// Every tensor's bytes inside the data section of `data_size` bytes, and no two sharing any.
absl::Status CheckTensorData(const std::vector<GgufTensorInfo>& tensors, uint64_t data_size) {
  for (const GgufTensorInfo& info : tensors) {
    if (info.offset > data_size || info.num_bytes > data_size - info.offset) {
      return absl::OutOfRangeError(
          absl::StrCat("GGUF tensor '", info.name, "': data [", info.offset, ", +", info.num_bytes,
                       ") of shape ", ShapeString(info.shape), " ",
                       RawGgmlTypeName(static_cast<uint32_t>(info.type)),
                       " runs past the end of the ", data_size, "-byte data section"));
    }
  }
  std::vector<const GgufTensorInfo*> by_offset;
  by_offset.reserve(tensors.size());
  for (const GgufTensorInfo& info : tensors) by_offset.push_back(&info);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const GgufTensorInfo* a, const GgufTensorInfo* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const GgufTensorInfo& previous = *by_offset[i - 1];
    const GgufTensorInfo& current = *by_offset[i];
    if (previous.offset + previous.num_bytes > current.offset) {
      return absl::InvalidArgumentError(
          absl::StrCat("GGUF tensors '", previous.name, "' (data [", previous.offset, ", ",
                       previous.offset + previous.num_bytes, ")) and '", current.name,
                       "' (data at ", current.offset, ") overlap"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status GgufFile::Parse() {
  Reader reader(data_, size_);
  LOOM_ASSIGN_OR_RETURN(version_, ReadMagicAndVersion(reader, data_));
  LOOM_ASSIGN_OR_RETURN(uint64_t tensor_count, reader.Read<uint64_t>("tensor count"));
  LOOM_ASSIGN_OR_RETURN(uint64_t metadata_count, reader.Read<uint64_t>("metadata count"));
  if (metadata_count > reader.remaining() / kMinKeyValueBytes) {
    return absl::OutOfRangeError(absl::StrCat("GGUF metadata count ", metadata_count,
                                              " cannot fit in the ", reader.remaining(),
                                              " bytes that remain"));
  }
  if (tensor_count > reader.remaining() / kMinTensorInfoBytes) {
    return absl::OutOfRangeError(absl::StrCat("GGUF tensor count ", tensor_count,
                                              " cannot fit in the ", reader.remaining(),
                                              " bytes that remain"));
  }

  metadata_.reserve(metadata_count);
  for (uint64_t i = 0; i < metadata_count; ++i) {
    const uint64_t key_offset = reader.pos();
    LOOM_ASSIGN_OR_RETURN(std::string key, reader.ReadString("metadata key"));
    if (metadata_index_.contains(key)) {
      return absl::InvalidArgumentError(
          absl::StrCat("GGUF duplicate metadata key '", key, "' at offset ", key_offset));
    }
    LOOM_ASSIGN_OR_RETURN(GgufValue value, ReadMetadataValue(reader, key));
    metadata_index_.emplace(key, metadata_.size());
    metadata_.emplace_back(std::move(key), std::move(value));
  }
  LOOM_ASSIGN_OR_RETURN(alignment_, AlignmentOf(Find("general.alignment")));

  tensors_.reserve(tensor_count);
  for (uint64_t i = 0; i < tensor_count; ++i) {
    GgufTensorInfo info;
    LOOM_ASSIGN_OR_RETURN(info.name, reader.ReadString("tensor name"));
    if (tensor_index_.contains(info.name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("GGUF duplicate tensor name '", info.name, "'"));
    }
    LOOM_RETURN_IF_ERROR(ReadTensorInfo(reader, alignment_, info));
    tensor_index_.emplace(info.name, tensors_.size());
    tensors_.push_back(std::move(info));
  }

  // The data section starts at the next multiple of the alignment.
  const uint64_t infos_end = reader.pos();
  data_offset_ = (infos_end + alignment_ - 1) / alignment_ * alignment_;
  if (data_offset_ > size_) {
    if (!tensors_.empty()) {
      return absl::OutOfRangeError(absl::StrCat("GGUF data section would start at offset ",
                                                data_offset_, ", past the end of the ",
                                                size_, "-byte file"));
    }
    data_offset_ = size_;  // no tensors: the padding may be omitted
  }
  return CheckTensorData(tensors_, size_ - data_offset_);
}

const GgufValue* GgufFile::Find(std::string_view key) const {
  auto it = metadata_index_.find(absl::string_view(key.data(), key.size()));
  if (it == metadata_index_.end()) return nullptr;
  return &metadata_[it->second].second;
}

namespace {

// Gives a typed look-up's failure the key's name: InvalidArgument for type mismatches,
// the value's own code otherwise (OutOfRange for integers that do not fit).
absl::Status KeyError(absl::string_view key, const absl::Status& status) {
  const absl::StatusCode code = status.code() == absl::StatusCode::kOutOfRange
                                    ? absl::StatusCode::kOutOfRange
                                    : absl::StatusCode::kInvalidArgument;
  return absl::Status(code, absl::StrCat("GGUF key '", key, "': ", status.message()));
}

absl::Status KeyNotFound(absl::string_view key) {
  return absl::NotFoundError(absl::StrCat("GGUF key '", key, "' not found"));
}

template <typename T, typename Fn>
absl::StatusOr<T> TypedGet(const GgufFile& file, std::string_view key, Fn fn) {
  const GgufValue* value = file.Find(key);
  if (value == nullptr) return KeyNotFound(AbslView(key));
  absl::StatusOr<T> result = fn(*value);
  if (!result.ok()) return KeyError(AbslView(key), result.status());
  return result;
}

}  // namespace

absl::StatusOr<int64_t> GgufFile::GetInt(std::string_view key) const {
  return TypedGet<int64_t>(*this, key, [](const GgufValue& v) { return v.AsInt(); });
}

absl::StatusOr<double> GgufFile::GetDouble(std::string_view key) const {
  return TypedGet<double>(*this, key, [](const GgufValue& v) { return v.AsDouble(); });
}

absl::StatusOr<bool> GgufFile::GetBool(std::string_view key) const {
  return TypedGet<bool>(*this, key, [](const GgufValue& v) { return v.AsBool(); });
}

absl::StatusOr<std::string_view> GgufFile::GetString(std::string_view key) const {
  return TypedGet<std::string_view>(*this, key,
                                    [](const GgufValue& v) { return v.AsString(); });
}

absl::StatusOr<const GgufValue::Array*> GgufFile::GetArray(std::string_view key) const {
  return TypedGet<const GgufValue::Array*>(*this, key,
                                           [](const GgufValue& v) { return v.AsArray(); });
}

const GgufTensorInfo* GgufFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(absl::string_view(name.data(), name.size()));
  if (it == tensor_index_.end()) return nullptr;
  return &tensors_[it->second];
}

absl::Span<const uint8_t> GgufFile::TensorData(const GgufTensorInfo& tensor) const {
  if (is_view_) {
    auto it = tensor_index_.find(absl::string_view(tensor.name.data(), tensor.name.size()));
    if (it == tensor_index_.end() || external_data_[it->second].size() != tensor.num_bytes) {
      return {};
    }
    return external_data_[it->second];
  }
  const uint64_t data_size = size_ - data_offset_;
  // A tensor info from another file must not read outside this one.
  if (tensor.offset > data_size || tensor.num_bytes > data_size - tensor.offset) return {};
  return absl::Span<const uint8_t>(data_ + data_offset_ + tensor.offset, tensor.num_bytes);
}

absl::StatusOr<std::vector<float>> GgufFile::DequantizeTensor(const GgufTensorInfo& tensor) const {
  if (!CanDequantize(tensor.type)) {
    return absl::UnimplementedError(absl::StrCat(
        "tensor '", tensor.name, "': dequantization of type ",
        RawGgmlTypeName(static_cast<uint32_t>(tensor.type)), " is not implemented"));
  }
  absl::StatusOr<uint64_t> num_bytes = GgmlRowBytes(tensor.type, tensor.num_elements);
  if (!num_bytes.ok() || *num_bytes != tensor.num_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", tensor.name, "': ", tensor.num_elements, " elements do not match its ",
        tensor.num_bytes, " bytes"));
  }
  absl::Span<const uint8_t> data = TensorData(tensor);
  if (data.size() != tensor.num_bytes) {
    return absl::OutOfRangeError(
        absl::StrCat("tensor '", tensor.name, "': data lies outside this file"));
  }
  std::vector<float> values(tensor.num_elements);
  LOOM_RETURN_IF_ERROR(DequantizeToF32(tensor.type, data.data(), tensor.num_elements,
                                       values.data()));
  return values;
}

}  // namespace loom::common
