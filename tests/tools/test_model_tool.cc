// Writes the models the GPU verification window uses (tests/gpu/quick.sh), on the machine
// that runs them, so that no model has to travel:
//
//   test_model_tool metadata SRC OUT
//       OUT: every metadata key of the GGUF model SRC and no tensor (the default model's
//       tokenizer, chat template and shapes in a few hundred KB; tests/gpu/bundle.sh packs it).
//   test_model_tool random --shape tiny|default --metadata META [--seed N] OUT
//       OUT: a random llama model (tests/common/random_model.h) with META's tokenizer and
//       chat template. tiny: 2 layers, hidden 256, 4 query / 2 KV heads of 64, F16 (for
//       serving smoke tests). default: META's own shapes and the default model's storage
//       (layer matrices Q4_1, embeddings Q8_0, tied), so a random twin of SmolLM2-135M.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "common/formats/gguf_file.h"
#include "common/formats/gguf_writer.h"
#include "common/status_macros.h"
#include "tests/common/random_model.h"

namespace loom::common::testing {
namespace {

absl::Status WriteMetadata(const std::string& source, const std::string& out) {
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> gguf, GgufFile::Open(source));
  GgufWriter writer;
  writer.CopyMetadata(*gguf);
  return writer.WriteFile(out);
}

absl::StatusOr<int64_t> MetadataInt(const GgufFile& gguf, const std::string& key) {
  absl::StatusOr<int64_t> value = gguf.GetInt(key);
  if (!value.ok()) return absl::InvalidArgumentError(absl::StrCat("metadata: ", value.status().message()));
  return value;
}

// The spec of `shape` over the tokenizer and shapes in `meta`.
absl::StatusOr<RandomModelSpec> SpecFor(std::string_view shape, const GgufFile& meta,
                                        uint32_t seed) {
  LOOM_ASSIGN_OR_RETURN(const GgufValue::Array* tokens, meta.GetArray("tokenizer.ggml.tokens"));
  RandomModelSpec spec;
  spec.seed = seed;
  spec.vocab = static_cast<int64_t>(tokens->size());
  spec.tied = true;
  if (shape == "tiny") {
    spec.matrix_types = {kGgmlF16};
    return spec;
  }
  if (shape != "default") {
    return absl::InvalidArgumentError(absl::StrCat("--shape ", std::string(shape), ": use tiny or default"));
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

absl::Status WriteRandom(std::string_view shape, const std::string& metadata, uint32_t seed,
                         const std::string& out) {
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> meta, GgufFile::Open(metadata));
  LOOM_ASSIGN_OR_RETURN(RandomModelSpec spec, SpecFor(shape, *meta, seed));
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> image, RandomModelImage(spec));
  GgufWriter writer;
  writer.CopyMetadata(*image);
  for (const auto& [key, value] : meta->metadata()) {
    // tiny keeps its own shapes and takes only the tokenizer; default takes everything.
    if (shape == "default" || absl::StartsWith(key, "tokenizer.")) writer.Set(key, value);
  }
  writer.SetString("general.name", absl::StrCat("random ", std::string(shape), "-shape model, seed ", seed));
  writer.Remove("general.file_type");
  if (shape == "tiny") writer.SetUint32(spec.arch + ".context_length", 4096);
  for (const GgufTensorInfo& tensor : image->tensors()) {
    LOOM_RETURN_IF_ERROR(
        writer.AddTensorView(tensor.name, tensor.shape, tensor.type, image->TensorData(tensor)));
  }
  return writer.WriteFile(out);
}

int Usage() {
  std::fprintf(stderr,
               "usage: test_model_tool metadata SRC OUT\n"
               "       test_model_tool random --shape tiny|default --metadata META [--seed N] OUT\n");
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
    for (size_t i = 1; i < args.size(); ++i) {
      const bool has_value = i + 1 < args.size();
      if (args[i] == "--shape" && has_value) {
        shape = args[++i];
      } else if (args[i] == "--metadata" && has_value) {
        metadata = args[++i];
      } else if (args[i] == "--seed" && has_value) {
        if (!absl::SimpleAtoi(args[++i], &seed)) return Usage();
      } else if (out.empty() && !absl::StartsWith(args[i], "--")) {
        out = args[i];
      } else {
        return Usage();
      }
    }
    if (shape.empty() || metadata.empty() || out.empty()) return Usage();
    status = WriteRandom(shape, metadata, seed, out);
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
