#include "common/formats/hf_quantization.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/formats/gguf_file.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace loom::common {
namespace {

using nlohmann::json;

// Loom's encoding of quantized matrices in GGUF (model/quantized_gguf.h, which owns the
// layout; these are its tensor suffixes).
constexpr char kQ4[] = ".q4";
constexpr char kQ8[] = ".q8";
constexpr char kScale[] = ".scale";
constexpr char kMin[] = ".min";
// Loom's INT4/INT8 groups are whole multiples of the activation group.
constexpr int64_t kLoomGroupMultiple = 32;
// AutoAWQ's GEMM layout puts output column 8c + kAwqOrder[k] into nibble k of word c.
constexpr int kAwqOrder[8] = {0, 2, 4, 6, 1, 3, 5, 7};

uint16_t FloatToHalfBits(float value) {
  const _Float16 half = static_cast<_Float16>(value);  // round to nearest even
  uint16_t bits;
  std::memcpy(&bits, &half, sizeof(bits));
  return bits;
}

// OCP FP8 E4M3 ("fn": no infinities; 0x7f and 0xff are NaN): bias 7, 3 mantissa bits.
float E4M3ToFloat(uint8_t code) {
  const int exponent = (code >> 3) & 15, mantissa = code & 7;
  if (exponent == 15 && mantissa == 7) return std::numeric_limits<float>::quiet_NaN();
  const float magnitude = exponent == 0 ? std::ldexp(static_cast<float>(mantissa), -9)
                                        : std::ldexp(1.0f + mantissa / 8.0f, exponent - 7);
  return code & 0x80 ? -magnitude : magnitude;
}

// An FP8 block size [rows, columns] from `key` of `object`, into result.fp8_block_*.
absl::Status ReadFp8Block(const json& object, const char* key, HfQuantization& result) {
  const auto field = object.find(key);
  if (field == object.end() || field->is_null()) return absl::OkStatus();
  if (!field->is_array() || field->size() != 2 || !(*field)[0].is_number_integer() ||
      !(*field)[1].is_number_integer() || (*field)[0].get<int64_t>() <= 0 ||
      (*field)[1].get<int64_t>() <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: quantization_config ", key,
                                                   " must be two positive integers, got ",
                                                   field->dump()));
  }
  result.fp8_block_rows = (*field)[0].get<int64_t>();
  result.fp8_block_cols = (*field)[1].get<int64_t>();
  return absl::OkStatus();
}

// compressed-tensors: FP8 (float, 8 bits) weights in every config group; the activations'
// scheme does not matter on the CPU (Loom multiplies in F32).
absl::Status ParseCompressedTensors(const json& q, HfQuantization& result) {
  const auto format = q.find("format");
  const std::string name =
      format != q.end() && format->is_string() ? format->get<std::string>() : "";
  if (name != "float-quantized" && name != "naive-quantized") {
    return absl::UnimplementedError(
        absl::StrCat("config.json: compressed-tensors format '", name,
                     "' is not supported (FP8 weights: float-quantized)"));
  }
  const auto groups = q.find("config_groups");
  if (groups == q.end() || !groups->is_object() || groups->empty()) {
    return absl::InvalidArgumentError("config.json: compressed-tensors without config_groups");
  }
  for (const auto& [group, scheme] : groups->items()) {
    const json weights = scheme.is_object() ? scheme.value("weights", json()) : json();
    if (!weights.is_object() || weights.value("type", "") != "float" ||
        weights.value("num_bits", 0) != 8) {
      return absl::UnimplementedError(absl::StrCat(
          "config.json: compressed-tensors group '", group,
          "' does not quantize weights to 8-bit floats (only FP8 weights are supported)"));
    }
    if (weights.value("strategy", "") == "block") {
      LOOM_RETURN_IF_ERROR(ReadFp8Block(weights, "block_structure", result));
    }
  }
  return absl::OkStatus();
}

template <typename T>
T Load(absl::Span<const uint8_t> bytes, uint64_t index) {
  T value;
  std::memcpy(&value, bytes.data() + index * sizeof(T), sizeof(T));
  return value;
}

// The checkpoint's values as plain arrays: q [out][in], zeros [groups][out], scales
// [groups][out], and each input column's group.
struct Unpacked {
  int64_t in = 0, out = 0, groups = 0;
  std::vector<uint8_t> q;
  std::vector<int32_t> zeros;
  std::vector<float> scales;
  std::vector<uint16_t> scale_bits;
  std::vector<int32_t> group_of;  // [in]
};

absl::Status CheckShape(const std::string& name, const char* what,
                        const std::vector<uint64_t>& shape, uint64_t rows, uint64_t cols,
                        absl::Span<const uint8_t> bytes, uint64_t element) {
  if (shape.size() != 2 || shape[0] != rows || shape[1] != cols ||
      bytes.size() != rows * cols * element) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": ", what, " has shape [",
                                                   absl::StrJoin(shape, ", "), "], expected [",
                                                   rows, ", ", cols, "]"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Unpacked> Unpack(const HfQuantization& quantization, const std::string& name,
                                const QuantizedLinearTensors& t) {
  Unpacked u;
  const bool awq = quantization.method == HfQuantization::Method::kAwq;
  const int bits = quantization.bits;
  const int pack = 32 / bits;
  const uint32_t mask = (1u << bits) - 1;
  if (t.qweight_shape.size() != 2 || t.scales_shape.size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": qweight and scales must be 2-D"));
  }
  // AWQ: qweight [in, out / 8]; GPTQ: qweight [in / pack, out].
  u.in = static_cast<int64_t>(awq ? t.qweight_shape[0] : t.qweight_shape[0] * pack);
  u.out = static_cast<int64_t>(awq ? t.qweight_shape[1] * pack : t.qweight_shape[1]);
  u.groups = static_cast<int64_t>(t.scales_shape[0]);
  if (u.groups <= 0 || u.in % u.groups != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": ", u.groups, " scale groups over ", u.in, " input columns"));
  }
  LOOM_RETURN_IF_ERROR(CheckShape(name, "qweight", t.qweight_shape, t.qweight_shape[0],
                                  t.qweight_shape[1], t.qweight, 4));
  LOOM_RETURN_IF_ERROR(CheckShape(name, "scales", t.scales_shape, u.groups, u.out, t.scales, 2));
  LOOM_RETURN_IF_ERROR(
      CheckShape(name, "qzeros", t.qzeros_shape, u.groups, u.out / pack, t.qzeros, 4));
  const int64_t group = u.in / u.groups;
  u.q.resize(u.in * u.out);
  for (int64_t i = 0; i < static_cast<int64_t>(t.qweight_shape[0]); ++i) {
    for (int64_t c = 0; c < static_cast<int64_t>(t.qweight_shape[1]); ++c) {
      const uint32_t word = Load<uint32_t>(t.qweight, i * t.qweight_shape[1] + c);
      for (int k = 0; k < pack; ++k) {
        const uint8_t value = static_cast<uint8_t>((word >> (bits * k)) & mask);
        if (awq) {
          u.q[(c * pack + kAwqOrder[k]) * u.in + i] = value;
        } else {
          u.q[c * u.in + i * pack + k] = value;
        }
      }
    }
  }
  u.zeros.resize(u.groups * u.out);
  for (int64_t g = 0; g < u.groups; ++g) {
    for (int64_t c = 0; c < u.out / pack; ++c) {
      const uint32_t word = Load<uint32_t>(t.qzeros, g * (u.out / pack) + c);
      for (int k = 0; k < pack; ++k) {
        const int64_t o = c * pack + (awq ? kAwqOrder[k] : k);
        u.zeros[g * u.out + o] = static_cast<int32_t>((word >> (bits * k)) & mask) +
                                 (quantization.zeros_plus_one ? 1 : 0);
      }
    }
  }
  u.scale_bits.resize(u.groups * u.out);
  u.scales.resize(u.groups * u.out);
  for (int64_t i = 0; i < u.groups * u.out; ++i) {
    u.scale_bits[i] = Load<uint16_t>(t.scales, i);
    u.scales[i] = HalfToFloat(u.scale_bits[i]);
  }
  u.group_of.resize(u.in);
  for (int64_t i = 0; i < u.in; ++i) u.group_of[i] = static_cast<int32_t>(i / group);
  if (!t.g_idx.empty()) {
    if (t.g_idx.size() != static_cast<size_t>(u.in) * 4) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": g_idx has ", t.g_idx.size() / 4,
                                                     " entries for ", u.in, " input columns"));
    }
    for (int64_t i = 0; i < u.in; ++i) {
      const int32_t g = Load<int32_t>(t.g_idx, i);
      if (g < 0 || g >= u.groups) {
        return absl::InvalidArgumentError(
            absl::StrCat(name, ": g_idx[", i, "] = ", g, " is not one of ", u.groups, " groups"));
      }
      u.group_of[i] = g;
    }
  }
  return u;
}

OwnedTensor Tensor(std::string name, std::vector<uint64_t> shape, GgmlType type,
                   std::vector<uint8_t> bytes) {
  return OwnedTensor{std::move(name), std::move(shape), type, std::move(bytes)};
}

// [out][groups] F16 bits of `values` [groups][out].
std::vector<uint8_t> Transposed(const std::vector<uint16_t>& values, int64_t groups, int64_t out) {
  std::vector<uint8_t> bytes(groups * out * 2);
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t g = 0; g < groups; ++g) {
      std::memcpy(bytes.data() + (o * groups + g) * 2, &values[g * out + o], 2);
    }
  }
  return bytes;
}

}  // namespace

absl::StatusOr<HfQuantization> ParseHfQuantization(const json& config) {
  HfQuantization result;
  auto it = config.find("quantization_config");
  if (it == config.end() || it->is_null()) return result;
  if (!it->is_object()) {
    return absl::InvalidArgumentError("config.json: 'quantization_config' is not an object");
  }
  const json& q = *it;
  auto text = [&](const char* key, const char* fallback) {
    auto field = q.find(key);
    return absl::AsciiStrToLower(field != q.end() && field->is_string() ? field->get<std::string>()
                                                                        : fallback);
  };
  auto integer = [&](std::initializer_list<const char*> keys, int64_t fallback) {
    for (const char* key : keys) {
      if (auto field = q.find(key); field != q.end() && field->is_number_integer()) {
        return field->get<int64_t>();
      }
    }
    return fallback;
  };
  auto flag = [&](const char* key, bool fallback) {
    auto field = q.find(key);
    return field != q.end() && field->is_boolean() ? field->get<bool>() : fallback;
  };
  const std::string method = text("quant_method", "");
  if (method == "awq") {
    result.method = HfQuantization::Method::kAwq;
    const std::string version = text("version", "gemm");
    if (version != "gemm") {
      return absl::UnimplementedError(
          absl::StrCat("config.json: AWQ version '", version,
                       "' is not supported (Loom reads AutoAWQ's GEMM layout)"));
    }
    if (!flag("zero_point", true)) {
      return absl::UnimplementedError("config.json: AWQ without zero points is not supported");
    }
    result.bits = static_cast<int>(integer({"bits", "w_bit"}, 4));
    result.group_size = integer({"group_size", "q_group_size"}, 128);
    if (result.bits != 4) {
      return absl::UnimplementedError(
          absl::StrCat("config.json: AWQ with ", result.bits, " bits is not supported (4 only)"));
    }
  } else if (method == "gptq") {
    result.method = HfQuantization::Method::kGptq;
    result.bits = static_cast<int>(integer({"bits"}, 4));
    result.group_size = integer({"group_size"}, 128);
    result.desc_act = flag("desc_act", false);
    const std::string format = text("checkpoint_format", "gptq");
    if (format != "gptq" && format != "gptq_v2") {
      return absl::UnimplementedError(absl::StrCat("config.json: GPTQ checkpoint_format '", format,
                                                   "' is not supported (gptq, gptq_v2)"));
    }
    result.zeros_plus_one = format == "gptq";
    if (result.bits != 4 && result.bits != 8) {
      return absl::UnimplementedError(
          absl::StrCat("config.json: GPTQ with ", result.bits, " bits is not supported (4 or 8)"));
    }
  } else if (method == "fp8") {
    result.method = HfQuantization::Method::kFp8;
    result.bits = 8;
    LOOM_RETURN_IF_ERROR(ReadFp8Block(q, "weight_block_size", result));
  } else if (method == "mxfp4") {
    // gpt-oss: its experts' MXFP4 blocks (common/formats/hf_gpt_oss_experts), the rest plain.
    result.method = HfQuantization::Method::kMxfp4;
    result.bits = 4;
    result.group_size = 32;
  } else if (method == "compressed-tensors") {
    LOOM_RETURN_IF_ERROR(ParseCompressedTensors(q, result));
    result.method = HfQuantization::Method::kFp8;
    result.bits = 8;
  } else {
    return absl::UnimplementedError(
        absl::StrCat("config.json: quantization_config quant_method '", method,
                     "' is not supported (supported: awq, gptq, fp8, compressed-tensors FP8, "
                     "mxfp4 (gpt-oss); or an unquantized checkpoint)"));
  }
  return result;
}

namespace {

// An FP8 layer's scales as floats, and which one applies to (o, i): that of
// (o / block_rows) * grid_cols + i / block_cols.
struct Fp8Scales {
  std::vector<float> values;
  uint64_t out = 0, in = 0;
  uint64_t block_rows = 0, block_cols = 0, grid_cols = 1;
};

absl::StatusOr<Fp8Scales> ReadFp8Scales(const std::string& name, const Fp8LinearTensors& t) {
  if (t.weight_shape.size() != 2 || t.weight.size() != t.weight_shape[0] * t.weight_shape[1]) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": an FP8 weight must be 2-D"));
  }
  Fp8Scales s;
  s.out = t.weight_shape[0];
  s.in = t.weight_shape[1];
  s.block_cols = s.in;
  const uint64_t scale_size = t.scale_type == GgmlType::kF32 ? 4 : 2;
  const uint64_t count = t.scale.size() / scale_size;
  // Which scale applies to (o, i): one, one per row, or one per block of a grid.
  const std::vector<uint64_t>& shape = t.scale_shape;
  if (count == 1) {
    s.block_rows = s.out;
  } else if ((shape.size() == 1 && shape[0] == s.out) ||
             (shape.size() == 2 && shape[0] == s.out && shape[1] == 1)) {
    s.block_rows = 1;
  } else if (shape.size() == 2 && shape[0] > 0 && shape[1] > 0) {
    if (t.block_rows <= 0 || t.block_cols <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": a [", shape[0], ", ", shape[1],
          "] grid of scales needs its block size "
          "(quantization_config's weight_block_size or block_structure), which config.json "
          "does not give"));
    }
    s.grid_cols = shape[1];
    s.block_rows = static_cast<uint64_t>(t.block_rows);
    s.block_cols = static_cast<uint64_t>(t.block_cols);
    if ((s.out + s.block_rows - 1) / s.block_rows != shape[0] ||
        (s.in + s.block_cols - 1) / s.block_cols != s.grid_cols) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": scale grid [", shape[0], ", ", shape[1], "] is not the [",
                       s.block_rows, ", ", s.block_cols, "] blocks of [", s.out, ", ", s.in, "]"));
    }
  }
  if (s.block_rows == 0 || count * scale_size != t.scale.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": scale of shape [", absl::StrJoin(shape, ", "),
        "] is neither per tensor, per output channel nor per block of [", s.out, ", ", s.in, "]"));
  }
  s.values.resize(count);
  for (uint64_t k = 0; k < count; ++k) {
    if (t.scale_type == GgmlType::kF32) {
      s.values[k] = Load<float>(t.scale, k);
    } else if (t.scale_type == GgmlType::kBF16) {
      const uint32_t bits = static_cast<uint32_t>(Load<uint16_t>(t.scale, k)) << 16;
      std::memcpy(&s.values[k], &bits, sizeof(float));
    } else {
      s.values[k] = HalfToFloat(Load<uint16_t>(t.scale, k));
    }
  }
  return s;
}

}  // namespace

absl::StatusOr<OwnedTensor> DequantizeFp8Linear(const std::string& name,
                                                const Fp8LinearTensors& t) {
  LOOM_ASSIGN_OR_RETURN(const Fp8Scales s, ReadFp8Scales(name, t));
  const uint64_t out = s.out, in = s.in;
  OwnedTensor result{name, {in, out}, GgmlType::kF16, std::vector<uint8_t>(out * in * 2)};
  for (uint64_t o = 0; o < out; ++o) {
    for (uint64_t i = 0; i < in; ++i) {
      const float scale = s.values[(o / s.block_rows) * s.grid_cols + i / s.block_cols];
      const uint16_t bits = FloatToHalfBits(E4M3ToFloat(t.weight[o * in + i]) * scale);
      std::memcpy(result.bytes.data() + (o * in + i) * 2, &bits, 2);
    }
  }
  return result;
}

absl::StatusOr<std::optional<OwnedTensor>> Fp8RowScales(const std::string& name,
                                                        const Fp8LinearTensors& t) {
  LOOM_ASSIGN_OR_RETURN(const Fp8Scales s, ReadFp8Scales(name, t));
  if (s.block_cols != s.in) return std::nullopt;  // a grid: no scale holds a whole row
  std::vector<float> rows(s.out);
  for (uint64_t o = 0; o < s.out; ++o) {
    rows[o] = s.values[o / s.block_rows];
    if (!(rows[o] > 0.0f) || !std::isfinite(rows[o])) return std::nullopt;
  }
  OwnedTensor result{name + std::string(kFp8RowScaleSuffix),
                     {s.out},
                     GgmlType::kF32,
                     std::vector<uint8_t>(s.out * sizeof(float))};
  std::memcpy(result.bytes.data(), rows.data(), result.bytes.size());
  return result;
}

absl::StatusOr<std::vector<OwnedTensor>> ConvertQuantizedLinear(
    const HfQuantization& quantization, const std::string& name,
    const QuantizedLinearTensors& tensors) {
  LOOM_ASSIGN_OR_RETURN(Unpacked u, Unpack(quantization, name, tensors));
  const int64_t group = u.in / u.groups;
  bool contiguous = group % kLoomGroupMultiple == 0;
  for (int64_t i = 0; contiguous && i < u.in; ++i) contiguous = u.group_of[i] == i / group;
  bool symmetric8 = quantization.bits == 8;
  for (int32_t z : u.zeros) symmetric8 = symmetric8 && z == 128;
  const auto out = static_cast<uint64_t>(u.out), in = static_cast<uint64_t>(u.in);
  const auto groups = static_cast<uint64_t>(u.groups);
  std::vector<OwnedTensor> result;
  if (contiguous && quantization.bits == 4) {
    // INT4: value = q * s + min with min = -z * s (F16, as Loom's INT4 keeps it).
    std::vector<uint8_t> q4(out * in / 2);
    for (int64_t o = 0; o < u.out; ++o) {
      for (int64_t i = 0; i < u.in; i += 2) {
        q4[(o * u.in + i) / 2] =
            static_cast<uint8_t>(u.q[o * u.in + i] | (u.q[o * u.in + i + 1] << 4));
      }
    }
    std::vector<uint16_t> mins(u.groups * u.out);
    for (int64_t k = 0; k < u.groups * u.out; ++k) {
      mins[k] = FloatToHalfBits(-static_cast<float>(u.zeros[k]) * u.scales[k]);
    }
    result.push_back(Tensor(name + kQ4, {in / 2, out}, GgmlType::kI8, std::move(q4)));
    result.push_back(Tensor(name + kScale, {groups, out}, GgmlType::kF16,
                            Transposed(u.scale_bits, u.groups, u.out)));
    result.push_back(
        Tensor(name + kMin, {groups, out}, GgmlType::kF16, Transposed(mins, u.groups, u.out)));
    return result;
  }
  if (contiguous && symmetric8) {
    // INT8: value = (q - 128) * s exactly.
    std::vector<uint8_t> q8(out * in);
    for (size_t k = 0; k < q8.size(); ++k) {
      q8[k] = static_cast<uint8_t>(static_cast<int8_t>(static_cast<int>(u.q[k]) - 128));
    }
    result.push_back(Tensor(name + kQ8, {in, out}, GgmlType::kI8, std::move(q8)));
    result.push_back(Tensor(name + kScale, {groups, out}, GgmlType::kF16,
                            Transposed(u.scale_bits, u.groups, u.out)));
    return result;
  }
  // Act-order, asymmetric 8-bit or odd groups: the dequantized weight in F16.
  std::vector<uint8_t> dense(out * in * 2);
  for (int64_t o = 0; o < u.out; ++o) {
    for (int64_t i = 0; i < u.in; ++i) {
      const int64_t k = u.group_of[i] * u.out + o;
      const uint16_t bits =
          FloatToHalfBits((static_cast<float>(u.q[o * u.in + i]) - u.zeros[k]) * u.scales[k]);
      std::memcpy(dense.data() + (o * u.in + i) * 2, &bits, 2);
    }
  }
  result.push_back(Tensor(name, {in, out}, GgmlType::kF16, std::move(dense)));
  return result;
}

bool HasFp8RowScales(const GgufFile& gguf) {
  for (const GgufTensorInfo& tensor : gguf.tensors()) {
    if (tensor.name.ends_with(kFp8RowScaleSuffix)) return true;
  }
  return false;
}

}  // namespace loom::common
