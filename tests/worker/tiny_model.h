#pragma once

// Tiny random llama-family models built in memory (common::GgufWriter, F32 tensors) for
// tests that need many forward passes or exact distributions over a small vocabulary:
// the speculative decoding tests run a target and a draft model side by side.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/formats/gguf_file.h"
#include "common/formats/gguf_writer.h"

namespace loom::worker::testing {

struct TinyModelSpec {
  int64_t vocab = 24;
  int64_t hidden = 32;  // multiples of 32: the CPU matmul's column granularity
  int64_t ffn = 64;
  int64_t layers = 2;
  int64_t heads = 2;
  int64_t kv_heads = 1;
  int64_t head_dim = 16;
  int64_t context = 64;
  uint64_t seed = 1;
  // The LM head's scale: logits have about this standard deviation (sharper above ~2).
  float logit_scale = 1.5f;
  // A draft that agrees with the model of `seed`: every weight moves by perturbation times
  // a fresh N(0, 1) sample of seed `perturbation_seed` (times the weight's own scale).
  float perturbation = 0.0f;
  uint64_t perturbation_seed = 0;
  // Tokenizer metadata: "t<i>" for every id (a mismatching vocabulary: another prefix).
  std::string token_prefix = "t";
  // Sliding-window attention on the layers marked true (0: none).
  int64_t sliding_window = 0;
  std::vector<bool> sliding_layers;
};

namespace internal {

inline std::vector<uint8_t> AsBytes(const std::vector<float>& values) {
  std::vector<uint8_t> bytes(values.size() * sizeof(float));
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

}  // namespace internal

/// The GGUF image of a random model: N(0, 1) embeddings, 1/sqrt(fan_in) projections,
/// norm weights near 1, a separate LM head scaled by logit_scale. The same spec gives the
/// same bytes.
inline std::unique_ptr<common::GgufFile> TinyModel(const TinyModelSpec& spec) {
  std::mt19937_64 rng(spec.seed);
  std::mt19937_64 noise_rng(spec.perturbation_seed);
  // One distribution per engine: libstdc++'s normal_distribution keeps a spare value.
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  common::GgufWriter writer;
  writer.SetString("general.architecture", "llama");
  writer.SetString("general.name", absl::StrCat("tiny-", spec.seed));
  writer.SetUint32("llama.context_length", static_cast<uint32_t>(spec.context));
  writer.SetUint32("llama.embedding_length", static_cast<uint32_t>(spec.hidden));
  writer.SetUint32("llama.feed_forward_length", static_cast<uint32_t>(spec.ffn));
  writer.SetUint32("llama.block_count", static_cast<uint32_t>(spec.layers));
  writer.SetUint32("llama.attention.head_count", static_cast<uint32_t>(spec.heads));
  writer.SetUint32("llama.attention.head_count_kv", static_cast<uint32_t>(spec.kv_heads));
  writer.SetUint32("llama.attention.key_length", static_cast<uint32_t>(spec.head_dim));
  writer.SetUint32("llama.attention.value_length", static_cast<uint32_t>(spec.head_dim));
  writer.SetUint32("llama.rope.dimension_count", static_cast<uint32_t>(spec.head_dim));
  writer.SetFloat32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  writer.SetFloat32("llama.rope.freq_base", 10000.0f);
  if (spec.sliding_window > 0) {
    writer.SetUint32("llama.attention.sliding_window", static_cast<uint32_t>(spec.sliding_window));
    common::GgufValue::Array local;
    for (bool flag : spec.sliding_layers) local.emplace_back(common::GgufValueType::kBool, flag);
    writer.Set("llama.attention.sliding_window_pattern",
               common::GgufValue(common::GgufValueType::kArray, std::move(local),
                                 common::GgufValueType::kBool));
  }
  writer.SetString("tokenizer.ggml.model", "gpt2");
  common::GgufValue::Array tokens;
  for (int64_t i = 0; i < spec.vocab; ++i) {
    tokens.emplace_back(common::GgufValueType::kString, absl::StrCat(spec.token_prefix, i));
  }
  writer.Set("tokenizer.ggml.tokens",
             common::GgufValue(common::GgufValueType::kArray, std::move(tokens),
                               common::GgufValueType::kString));
  // No merges: enough for common::Tokenizer to load it (ids to text; the in-process engine
  // detokenizes with it).
  writer.Set("tokenizer.ggml.merges",
             common::GgufValue(common::GgufValueType::kArray, common::GgufValue::Array{},
                               common::GgufValueType::kString));

  // A [rows, cols] matrix (ggml shape [cols, rows]) of N(0, scale^2) values, or a vector
  // (cols 0) of 1 + N(0, scale^2).
  auto add = [&](const std::string& name, int64_t rows, int64_t cols, float scale) {
    const bool vector = cols == 0;
    const int64_t count = vector ? rows : rows * cols;
    std::vector<float> values(count);
    for (float& value : values) {
      value = normal(rng) * scale;
      if (spec.perturbation != 0.0f) value += noise(noise_rng) * scale * spec.perturbation;
      if (vector) value += 1.0f;
    }
    std::vector<uint64_t> shape =
        vector ? std::vector<uint64_t>{static_cast<uint64_t>(rows)}
               : std::vector<uint64_t>{static_cast<uint64_t>(cols), static_cast<uint64_t>(rows)};
    const absl::Status status =
        writer.AddTensor(name, std::move(shape), common::GgmlType::kF32, internal::AsBytes(values));
    if (!status.ok()) std::abort();
  };
  const int64_t q_rows = spec.heads * spec.head_dim;
  const int64_t kv_rows = spec.kv_heads * spec.head_dim;
  const float in_hidden = 1.0f / std::sqrt(static_cast<float>(spec.hidden));
  add("token_embd.weight", spec.vocab, spec.hidden, 1.0f);
  for (int64_t l = 0; l < spec.layers; ++l) {
    const std::string p = absl::StrCat("blk.", l, ".");
    add(p + "attn_norm.weight", spec.hidden, 0, 0.1f);
    add(p + "attn_q.weight", q_rows, spec.hidden, in_hidden);
    add(p + "attn_k.weight", kv_rows, spec.hidden, in_hidden);
    add(p + "attn_v.weight", kv_rows, spec.hidden, in_hidden);
    add(p + "attn_output.weight", spec.hidden, q_rows,
        1.0f / std::sqrt(static_cast<float>(q_rows)));
    add(p + "ffn_norm.weight", spec.hidden, 0, 0.1f);
    add(p + "ffn_gate.weight", spec.ffn, spec.hidden, in_hidden);
    add(p + "ffn_up.weight", spec.ffn, spec.hidden, in_hidden);
    add(p + "ffn_down.weight", spec.hidden, spec.ffn,
        1.0f / std::sqrt(static_cast<float>(spec.ffn)));
  }
  add("output_norm.weight", spec.hidden, 0, 0.1f);
  add("output.weight", spec.vocab, spec.hidden, spec.logit_scale * in_hidden);
  absl::StatusOr<std::string> image = writer.Serialize();
  if (!image.ok()) std::abort();
  absl::StatusOr<std::unique_ptr<common::GgufFile>> file =
      common::GgufFile::FromBytes(*std::move(image));
  if (!file.ok()) std::abort();
  return *std::move(file);
}

}  // namespace loom::worker::testing
