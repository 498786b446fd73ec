#include "common/formats/model_fingerprint.h"

#include <bit>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "absl/strings/str_format.h"

namespace loom::common {
namespace {

// Two independent 64-bit hashes over the same framed byte stream: FNV-1a, and a
// multiply-rotate hash with different constants; each is finished with the splitmix64
// avalanche. Only determinism matters here (no secret, no adversary), so simple and
// dependency-free beats cryptographic.
class FingerprintHasher {
 public:
  void Bytes(const void* data, size_t size) {
    const auto* bytes = static_cast<const uint8_t*>(data);
    for (size_t i = 0; i < size; ++i) {
      fnv_ = (fnv_ ^ bytes[i]) * 0x100000001b3ULL;
      mix_ = std::rotl((mix_ + bytes[i]) * 0x9e3779b97f4a7c15ULL, 27);
    }
  }
  void U64(uint64_t value) {
    uint8_t le[8];
    for (int i = 0; i < 8; ++i) le[i] = static_cast<uint8_t>(value >> (8 * i));
    Bytes(le, sizeof(le));
  }
  // Length-prefixed, so ("ab", "c") and ("a", "bc") differ.
  void String(std::string_view text) {
    U64(text.size());
    Bytes(text.data(), text.size());
  }
  void Value(const GgufValue& value) {
    U64(static_cast<uint64_t>(value.type()));
    switch (value.type()) {
      case GgufValueType::kString:
        String(value.AsString().value_or(std::string_view()));
        return;
      case GgufValueType::kArray: {
        U64(static_cast<uint64_t>(value.element_type()));
        absl::StatusOr<const GgufValue::Array*> elements = value.AsArray();
        if (!elements.ok()) return;
        U64((*elements)->size());
        for (const GgufValue& element : **elements) Value(element);
        return;
      }
      case GgufValueType::kFloat32:
      case GgufValueType::kFloat64: {
        const double number = value.AsDouble().value_or(0.0);
        U64(std::bit_cast<uint64_t>(number));
        return;
      }
      default: {
        // Integers and bools. A uint64 above INT64_MAX does not fit AsInt: hash it as
        // a double, tagged so it cannot collide with an integer.
        absl::StatusOr<int64_t> integer = value.AsInt();
        if (integer.ok()) {
          U64(static_cast<uint64_t>(*integer));
        } else {
          U64(0xffffffffffffffffULL);
          U64(std::bit_cast<uint64_t>(value.AsDouble().value_or(0.0)));
        }
        return;
      }
    }
  }

  std::string HexDigest() const {
    return absl::StrFormat("%016x%016x", Finish(fnv_), Finish(mix_));
  }

 private:
  static uint64_t Finish(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
  }

  uint64_t fnv_ = 0xcbf29ce484222325ULL;
  uint64_t mix_ = 0x243f6a8885a308d3ULL;
};

}  // namespace

std::string ModelFingerprint(const GgufFile& gguf) {
  FingerprintHasher hasher;
  hasher.String("loom.model_fingerprint.v1");
  hasher.U64(gguf.version());
  hasher.U64(gguf.alignment());
  hasher.U64(gguf.metadata().size());
  for (const auto& [key, value] : gguf.metadata()) {
    hasher.String(key);
    hasher.Value(value);
  }
  hasher.U64(gguf.tensors().size());
  for (const GgufTensorInfo& tensor : gguf.tensors()) {
    hasher.String(tensor.name);
    hasher.U64(tensor.shape.size());
    for (uint64_t dim : tensor.shape) hasher.U64(dim);
    hasher.U64(static_cast<uint64_t>(tensor.type));
    hasher.U64(tensor.offset);
    hasher.U64(tensor.num_bytes);
  }
  return hasher.HexDigest();
}

}  // namespace loom::common
