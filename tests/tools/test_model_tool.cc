// Writes the models the GPU verification window uses (tests/gpu/quick.sh), on the machine
// that runs them, so that no model has to travel:
//
//   test_model_tool metadata SRC OUT
//       OUT: every metadata key of the GGUF model SRC and no tensor (the default model's
//       tokenizer, chat template and shapes in a few hundred KB; tests/gpu/bundle.sh packs it).
//   test_model_tool random --shape tiny|default|llama3-8b-bf16|llama3-8b-int4 --metadata META
//                   [--seed N] [--layers N] OUT
//       OUT: a random llama model (tests/common/random_model.h) with META's tokenizer and
//       chat template. tiny: 2 layers, hidden 256, 4 query / 2 KV heads of 64, F16 (for
//       serving smoke tests). default: META's own shapes and the default model's storage
//       (layer matrices Q4_1, embeddings Q8_0, tied), so a random twin of SmolLM2-135M.
//       llama3-8b-*: Llama-3-8B's layers (hidden 4096, 32 query / 8 KV heads of 128, FFN
//       14336, untied output) over META's vocabulary, BF16 throughout or Q4_1 layers with
//       Q8_0 embeddings and output (a GPU serving benchmark's model, written in seconds by
//       WriteLargeRandom; --layers: 32 unless given). Prints bytes_per_token=N: the bytes a
//       decode step reads (every tensor but the embedding table).
//   test_model_tool tokens --metadata META OUT FILE...
//       OUT: META's tokenizer's ids of each FILE's text (BOS as the tokenizer adds it,
//       special-token text not parsed, as `loom perplexity` reads a text), concatenated,
//       uint32 little-endian: the training data tests/gpu/fp8_perplexity.py trains on.
//       Prints tokens=N files=F vocab=V (V: the tokenizer's vocabulary, the model's rows).
//   test_model_tool trained --metadata META --tensors FILE OUT
//       OUT: a llama model with META's tokenizer and chat template and the weights of the
//       safetensors FILE (GGUF tensor names, row-major [rows, cols], F32 or BF16; every
//       tensor of the model and no other), matrices and embeddings stored BF16, norms F32.
//       Its shapes come from FILE's __metadata__ (hidden, heads, kv_heads, head_dim, ffn,
//       layers, context_length); RMSNorm epsilon 1e-5, RoPE base 10000 over pairs
//       (2i, 2i+1), the output head tied to the embeddings, as RandomModelImage lays out a
//       llama: the model tests/gpu/fp8_perplexity.py trains on the GPU machine.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/formats/file_image.h"
#include "common/formats/gguf_file.h"
#include "common/formats/gguf_writer.h"
#include "common/formats/safetensors_file.h"
#include "common/status_macros.h"
#include "common/tokenizer/tokenizer.h"
#include "kernels/cuda/types.h"
#include "tests/common/random_model.h"

namespace loom::common::testing {
namespace {

absl::Status WriteMetadata(const std::string& source, const std::string& out) {
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> gguf, GgufFile::Open(source));
  GgufWriter writer;
  writer.CopyMetadata(*gguf);
  return writer.WriteFile(out);
}

// xorshift64*: random bits at several GB/s, for FastRandomBytes.
class FastRandomBits {
 public:
  explicit FastRandomBits(uint64_t seed) : state_((seed + 1) * 0x9E3779B97F4A7C15ull) {}
  uint64_t Next() {
    state_ ^= state_ >> 12;
    state_ ^= state_ << 25;
    state_ ^= state_ >> 27;
    return state_ * 0x2545F4914F6CDD1Dull;
  }

 private:
  uint64_t state_;
};

/// `count` weights of `type` (F16, BF16, Q8_0, Q4_0, Q4_1) spread over about [-scale, scale]
/// with no per-value arithmetic: 16-bit values drawn from a table of 4096, quantized blocks
/// with one scale (and min) per block and random codes. Empty for another type.
std::string FastRandomBytes(uint32_t type, uint64_t count, float scale,
                                   FastRandomBits& bits) {
  std::string bytes;
  if (type == kGgmlF16 || type == kGgmlBF16) {
    std::vector<float> levels(4096);
    for (size_t i = 0; i < levels.size(); ++i) {
      levels[i] = scale * (2.0f * (static_cast<float>(i) + 0.5f) / 4096.0f - 1.0f);
    }
    const std::string table = type == kGgmlF16 ? F16Bytes(levels) : BF16Bytes(levels);
    bytes.resize(count * 2);
    for (uint64_t i = 0; i < count;) {
      uint64_t draw = bits.Next();
      for (int j = 0; j < 5 && i < count; ++j, ++i, draw >>= 12) {
        std::memcpy(&bytes[i * 2], &table[(draw & 4095) * 2], 2);
      }
    }
    return bytes;
  }
  if (type != kGgmlQ8_0 && type != kGgmlQ4_0 && type != kGgmlQ4_1) return bytes;
  // The block header: Q8_0 d = scale / 127; Q4_0 d = scale / 8 around code 8; Q4_1 d =
  // 2 scale / 15 from min -scale.
  const std::string header = type == kGgmlQ8_0   ? F16Bytes({scale / 127.0f})
                             : type == kGgmlQ4_0 ? F16Bytes({scale / 8.0f})
                                                 : F16Bytes({2.0f * scale / 15.0f, -scale});
  const size_t codes = type == kGgmlQ8_0 ? 32 : 16, block = header.size() + codes;
  bytes.resize(count / 32 * block);
  for (size_t at = 0; at < bytes.size(); at += block) {
    std::memcpy(&bytes[at], header.data(), header.size());
    for (size_t c = 0; c < codes; c += 8) {
      const uint64_t draw = bits.Next();
      std::memcpy(&bytes[at + header.size() + c], &draw, 8);
    }
  }
  return bytes;
}

absl::StatusOr<int64_t> MetadataInt(const GgufFile& gguf, const std::string& key) {
  absl::StatusOr<int64_t> value = gguf.GetInt(key);
  if (!value.ok()) return absl::InvalidArgumentError(absl::StrCat("metadata: ", value.status().message()));
  return value;
}

// The spec of `shape` over the tokenizer and shapes in `meta`.
absl::StatusOr<RandomModelSpec> SpecFor(std::string_view shape, const GgufFile& meta, uint32_t seed,
                                        int64_t layers) {
  LOOM_ASSIGN_OR_RETURN(const GgufValue::Array* tokens, meta.GetArray("tokenizer.ggml.tokens"));
  RandomModelSpec spec;
  spec.seed = seed;
  spec.vocab = static_cast<int64_t>(tokens->size());
  spec.tied = true;
  if (shape == "tiny") {
    spec.matrix_types = {kGgmlF16};
    return spec;
  }
  if (shape == "llama3-8b-bf16" || shape == "llama3-8b-int4") {
    spec.hidden = 4096;
    spec.heads = 32;
    spec.kv_heads = 8;
    spec.head_dim = 128;
    spec.ffn = 14336;
    spec.layers = layers > 0 ? layers : 32;
    spec.tied = false;
    const bool bf16 = shape == "llama3-8b-bf16";
    spec.matrix_types = {bf16 ? kGgmlBF16 : kGgmlQ4_1};
    // Q8_0 embeddings and output head beside Q4_1 layers, as quantized checkpoints keep them.
    spec.embedding_type = bf16 ? kGgmlBF16 : kGgmlQ8_0;
    return spec;
  }
  if (shape != "default") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--shape ", std::string(shape), ": use tiny, default, llama3-8b-bf16 or llama3-8b-int4"));
  }
  LOOM_ASSIGN_OR_RETURN(std::string_view arch, meta.GetString("general.architecture"));
  spec.arch = std::string(arch);
  LOOM_ASSIGN_OR_RETURN(spec.hidden, MetadataInt(meta, spec.arch + ".embedding_length"));
  LOOM_ASSIGN_OR_RETURN(spec.ffn, MetadataInt(meta, spec.arch + ".feed_forward_length"));
  LOOM_ASSIGN_OR_RETURN(spec.layers, MetadataInt(meta, spec.arch + ".block_count"));
  LOOM_ASSIGN_OR_RETURN(spec.heads, MetadataInt(meta, spec.arch + ".attention.head_count"));
  LOOM_ASSIGN_OR_RETURN(spec.kv_heads, MetadataInt(meta, spec.arch + ".attention.head_count_kv"));
  spec.head_dim = spec.hidden / spec.heads;
  spec.matrix_types = {kGgmlQ4_1};
  spec.embedding_type = kGgmlQ8_0;
  return spec;
}

// A llama3-8b shape (GBs), written in seconds: the bytes of FastRandomBytes, streamed to
// the file from buffers drawn once, one layer's matrices written for every layer (a decode
// step reads each layer's bytes all the same, so no benchmark figure depends on layers
// holding different values).
absl::Status WriteLargeRandom(const RandomModelSpec& spec, GgufWriter& writer,
                              const std::string& out) {
  FastRandomBits bits(spec.seed);
  std::deque<std::string> buffers;  // stable addresses for the writer's views
  const uint64_t h = spec.hidden, vocab = spec.vocab, q_rows = spec.heads * spec.head_dim,
                 kv_rows = spec.kv_heads * spec.head_dim, ffn = spec.ffn;
  auto draw = [&](uint32_t type, uint64_t rows, uint64_t cols, float scale) {
    const std::string& bytes =
        buffers.emplace_back(FastRandomBytes(type, rows * cols, scale, bits));
    return absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  };
  auto add = [&](const std::string& name, uint32_t type, uint64_t rows, uint64_t cols,
                 absl::Span<const uint8_t> bytes) {
    const std::vector<uint64_t> shape =
        rows == 1 ? std::vector<uint64_t>{cols} : std::vector<uint64_t>{cols, rows};
    return writer.AddTensorView(name, shape, static_cast<GgmlType>(type), bytes);
  };
  const uint32_t matrix_type = spec.matrix_types.front(), wide = spec.embedding_type;
  const float unit = 1.0f / std::sqrt(static_cast<float>(h));
  const std::string ones = F32Bytes(std::vector<float>(h, 1.0f));
  const auto norm = absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(ones.data()), ones.size());
  LOOM_RETURN_IF_ERROR(add("token_embd.weight", wide, vocab, h, draw(wide, vocab, h, 1.0f)));
  LOOM_RETURN_IF_ERROR(add("output_norm.weight", kGgmlF32, 1, h, norm));
  LOOM_RETURN_IF_ERROR(add("output.weight", wide, vocab, h, draw(wide, vocab, h, unit)));
  const struct {
    const char* name;
    uint64_t rows, cols;
  } matrices[] = {{"attn_q", q_rows, h},      {"attn_k", kv_rows, h}, {"attn_v", kv_rows, h},
                  {"attn_output", h, q_rows}, {"ffn_gate", ffn, h},   {"ffn_up", ffn, h},
                  {"ffn_down", h, ffn}};
  std::vector<absl::Span<const uint8_t>> layer;
  for (const auto& m : matrices) {
    layer.push_back(
        draw(matrix_type, m.rows, m.cols, 1.0f / std::sqrt(static_cast<float>(m.cols))));
  }
  for (int64_t l = 0; l < spec.layers; ++l) {
    const std::string p = absl::StrCat("blk.", l, ".");
    LOOM_RETURN_IF_ERROR(add(p + "attn_norm.weight", kGgmlF32, 1, h, norm));
    LOOM_RETURN_IF_ERROR(add(p + "ffn_norm.weight", kGgmlF32, 1, h, norm));
    for (size_t i = 0; i < layer.size(); ++i) {
      const auto& m = matrices[i];
      LOOM_RETURN_IF_ERROR(add(p + m.name + ".weight", matrix_type, m.rows, m.cols, layer[i]));
    }
  }
  LOOM_RETURN_IF_ERROR(writer.WriteFile(out));
  // What a decode step reads: every tensor but the embedding table (one row of it), for
  // the serving benchmark's bound.
  uint64_t layer_bytes = 2 * ones.size();
  for (const auto& bytes : layer) layer_bytes += bytes.size();
  const uint64_t read = buffers[1].size() + ones.size() + layer_bytes * spec.layers;
  std::printf("bytes_per_token=%llu\n", static_cast<unsigned long long>(read));
  return absl::OkStatus();
}

absl::Status WriteRandom(std::string_view shape, const std::string& metadata, uint32_t seed,
                         int64_t layers, const std::string& out) {
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> meta, GgufFile::Open(metadata));
  LOOM_ASSIGN_OR_RETURN(RandomModelSpec spec, SpecFor(shape, *meta, seed, layers));
  const bool large = shape.starts_with("llama3-8b");
  std::unique_ptr<GgufFile> image;
  if (large) {  // the metadata only: the tensors are WriteLargeRandom's
    GgufImageBuilder builder;
    AddRandomModelMetadata(spec, builder);
    LOOM_ASSIGN_OR_RETURN(image, GgufFile::FromBytes(builder.Build()));
  } else {
    LOOM_ASSIGN_OR_RETURN(image, RandomModelImage(spec));
  }
  GgufWriter writer;
  writer.CopyMetadata(*image);
  for (const auto& [key, value] : meta->metadata()) {
    // tiny keeps its own shapes and takes only the tokenizer; default takes everything.
    if (shape == "default" || absl::StartsWith(key, "tokenizer.")) writer.Set(key, value);
  }
  writer.SetString("general.name", absl::StrCat("random ", std::string(shape), "-shape model, seed ", seed));
  writer.Remove("general.file_type");
  if (shape != "default")
    writer.SetUint32(spec.arch + ".context_length", shape == "tiny" ? 4096 : 8192);
  if (large) return WriteLargeRandom(spec, writer, out);
  for (const GgufTensorInfo& tensor : image->tensors()) {
    LOOM_RETURN_IF_ERROR(
        writer.AddTensorView(tensor.name, tensor.shape, tensor.type, image->TensorData(tensor)));
  }
  return writer.WriteFile(out);
}

absl::Status WriteTokens(const std::string& metadata, const std::string& out,
                         const std::vector<std::string>& files) {
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> meta, GgufFile::Open(metadata));
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer, Tokenizer::FromGguf(*meta));
  std::vector<uint32_t> ids;
  for (const std::string& file : files) {
    LOOM_ASSIGN_OR_RETURN(FileImage text, FileImage::Map(file, "text file"));
    const std::string_view view(reinterpret_cast<const char*>(text.data()), text.size());
    for (int32_t id : tokenizer->Encode(view, /*add_special=*/true, /*parse_special=*/false)) {
      ids.push_back(static_cast<uint32_t>(id));
    }
  }
  std::FILE* f = std::fopen(out.c_str(), "wb");
  if (f == nullptr) return absl::NotFoundError(absl::StrCat("cannot write ", out));
  const size_t written = std::fwrite(ids.data(), sizeof(uint32_t), ids.size(), f);
  if (std::fclose(f) != 0 || written != ids.size()) {
    return absl::DataLossError(absl::StrCat("short write to ", out));
  }
  std::printf("tokens=%zu files=%zu vocab=%d\n", ids.size(), files.size(), tokenizer->vocab_size());
  return absl::OkStatus();
}

// A shape field of the trained weights' __metadata__.
absl::StatusOr<int64_t> TrainedField(const SafetensorsFile& weights, const std::string& key) {
  const auto it = weights.metadata().find(key);
  int64_t value = 0;
  if (it == weights.metadata().end() || !absl::SimpleAtoi(it->second, &value) || value < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(weights.path(), ": __metadata__ needs a positive integer \"", key, "\""));
  }
  return value;
}

absl::Status WriteTrained(const std::string& metadata, const std::string& tensors,
                          const std::string& out) {
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> meta, GgufFile::Open(metadata));
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> weights, SafetensorsFile::Open(tensors));
  LOOM_ASSIGN_OR_RETURN(RandomModelSpec spec, SpecFor("tiny", *meta, /*seed=*/1, /*layers=*/0));
  LOOM_ASSIGN_OR_RETURN(spec.hidden, TrainedField(*weights, "hidden"));
  LOOM_ASSIGN_OR_RETURN(spec.heads, TrainedField(*weights, "heads"));
  LOOM_ASSIGN_OR_RETURN(spec.kv_heads, TrainedField(*weights, "kv_heads"));
  LOOM_ASSIGN_OR_RETURN(spec.head_dim, TrainedField(*weights, "head_dim"));
  LOOM_ASSIGN_OR_RETURN(spec.ffn, TrainedField(*weights, "ffn"));
  LOOM_ASSIGN_OR_RETURN(spec.layers, TrainedField(*weights, "layers"));
  LOOM_ASSIGN_OR_RETURN(const int64_t context, TrainedField(*weights, "context_length"));
  spec.matrix_types = {kGgmlBF16};
  spec.embedding_type = kGgmlBF16;
  // The random model of the same spec gives every tensor's name, GGUF shape and type.
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> layout, RandomModelImage(spec));
  if (layout->tensors().size() != weights->tensors().size()) {
    return absl::InvalidArgumentError(absl::StrCat(tensors, " holds ", weights->tensors().size(),
                                                   " tensors, the model has ",
                                                   layout->tensors().size()));
  }
  GgufWriter writer;
  writer.CopyMetadata(*layout);
  for (const auto& [key, value] : meta->metadata()) {
    if (absl::StartsWith(key, "tokenizer.")) writer.Set(key, value);
  }
  writer.SetString("general.name", "trained llama (tests/gpu/fp8_perplexity.py)");
  writer.SetUint32(spec.arch + ".context_length", static_cast<uint32_t>(context));
  for (const GgufTensorInfo& tensor : layout->tensors()) {
    const SafetensorsTensorInfo* info = weights->FindTensor(tensor.name);
    if (info == nullptr) return absl::NotFoundError(absl::StrCat(tensors, " lacks ", tensor.name));
    // GGUF lists dimensions innermost first, safetensors outermost first.
    if (!std::equal(tensor.shape.rbegin(), tensor.shape.rend(), info->shape.begin(),
                    info->shape.end())) {
      return absl::InvalidArgumentError(absl::StrCat(
          tensor.name, ": shape [", absl::StrJoin(info->shape, ", "), "] is not the model's"));
    }
    if (info->dtype != SafetensorsDtype::kF32 && info->dtype != SafetensorsDtype::kBF16) {
      return absl::InvalidArgumentError(absl::StrCat(tensor.name, ": ",
                                                     std::string(SafetensorsDtypeName(info->dtype)),
                                                     " (F32 or BF16 expected)"));
    }
    const absl::Span<const uint8_t> data = weights->TensorData(*info);
    std::vector<float> values(data.size() / SafetensorsDtypeSize(info->dtype));
    kernels::cuda::ConvertToFloat(info->dtype == SafetensorsDtype::kF32
                                      ? kernels::cuda::DataType::kF32
                                      : kernels::cuda::DataType::kBF16,
                                  data.data(), static_cast<int64_t>(values.size()), values.data());
    const std::string bytes = EncodeAs(static_cast<uint32_t>(tensor.type), values);
    LOOM_RETURN_IF_ERROR(writer.AddTensor(tensor.name, tensor.shape, tensor.type,
                                          std::vector<uint8_t>(bytes.begin(), bytes.end())));
  }
  return writer.WriteFile(out);
}

int Usage() {
  std::fprintf(stderr,
               "usage: test_model_tool metadata SRC OUT\n"
               "       test_model_tool random --shape tiny|default|llama3-8b-bf16|llama3-8b-int4\n"
               "                       --metadata META [--seed N] [--layers N] OUT\n"
               "       test_model_tool tokens --metadata META OUT FILE...\n"
               "       test_model_tool trained --metadata META --tensors FILE OUT\n");
  return 2;
}

int Main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  absl::Status status;
  if (args.size() == 3 && args[0] == "metadata") {
    status = WriteMetadata(args[1], args[2]);
  } else if (!args.empty() && args[0] == "random") {
    std::string shape, metadata, out;
    uint32_t seed = 1;
    int64_t layers = 0;
    for (size_t i = 1; i < args.size(); ++i) {
      const bool has_value = i + 1 < args.size();
      if (args[i] == "--shape" && has_value) {
        shape = args[++i];
      } else if (args[i] == "--metadata" && has_value) {
        metadata = args[++i];
      } else if (args[i] == "--seed" && has_value) {
        if (!absl::SimpleAtoi(args[++i], &seed)) return Usage();
      } else if (args[i] == "--layers" && has_value) {
        if (!absl::SimpleAtoi(args[++i], &layers) || layers < 1) return Usage();
      } else if (out.empty() && !absl::StartsWith(args[i], "--")) {
        out = args[i];
      } else {
        return Usage();
      }
    }
    if (shape.empty() || metadata.empty() || out.empty()) return Usage();
    status = WriteRandom(shape, metadata, seed, layers, out);
  } else if (args.size() >= 5 && args[0] == "tokens" && args[1] == "--metadata") {
    status = WriteTokens(args[2], args[3], std::vector<std::string>(args.begin() + 4, args.end()));
  } else if (args.size() == 6 && args[0] == "trained" && args[1] == "--metadata" &&
             args[3] == "--tensors") {
    status = WriteTrained(args[2], args[4], args[5]);
  } else {
    return Usage();
  }
  if (!status.ok()) {
    std::fprintf(stderr, "test_model_tool: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace loom::common::testing

int main(int argc, char** argv) { return loom::common::testing::Main(argc, argv); }
