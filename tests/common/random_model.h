#pragma once

// Seeded random llama-family models as GGUF images, with weights scaled like a trained
// network's (1/sqrt(fan_in) projections, norm weights near 1) and stored in the GGUF types
// real checkpoints use (F32, F16, Q8_0, Q4_0, Q4_1): the CUDA forward pass tests compare them
// against the CPU, and tests/tools/test_model_tool writes them to files on the GPU machine
// (tests/gpu/quick.sh), where no real model travels.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/formats/gguf_file.h"
#include "kernels/cuda/types.h"
#include "tests/common/gguf_test_util.h"
#include "tests/kernels/kquant_test_util.h"

namespace loom::common::testing {

inline constexpr uint32_t kGgmlF32 = 0, kGgmlF16 = 1, kGgmlQ4_0 = 2, kGgmlQ4_1 = 3, kGgmlQ8_0 = 8,
                          kGgmlQ4_K = 12, kGgmlQ6_K = 14, kGgmlBF16 = 30;  // ggml type ids

struct RandomModelSpec {
  std::string arch = "llama";  // llama: RoPE pairs (2i, 2i+1); qwen2: NeoX pairs, QKV bias;
                               // qwen3: NeoX pairs, QK-norm (per-head RMSNorm of q and k)
  int64_t hidden = 256;
  int64_t heads = 4;
  int64_t kv_heads = 2;
  int64_t head_dim = 64;
  int64_t ffn = 512;
  int64_t layers = 2;
  int64_t vocab = 512;
  bool tied = true;
  bool int4 = false;  // layer matrices as GGUF Q4_0 / Q4_1 (the W4A16 GEMM's inputs)
  uint32_t seed = 1;
  // The storage types the layer matrices cycle through; empty: Q4_0 and Q4_1 alternating
  // when int4, else F16, Q8_0 and F32 (so every conversion path is exercised).
  std::vector<uint32_t> matrix_types;
  uint32_t embedding_type = kGgmlF16;  // F16, BF16 or Q8_0
  // Local layers (<arch>.attention.sliding_window): 0 none; with sliding_period N every
  // N-th layer is global (<arch>.attention.sliding_window_pattern), 0: every layer local.
  int64_t sliding_window = 0;
  int64_t sliding_period = 0;
  float attn_logit_softcap = 0.0f;  // <arch>.attn_logit_softcapping (Gemma 2); 0: none
  // A mixture of experts in place of the dense FFN (<arch>.expert_count experts of width
  // ffn, expert_used_count per token; a router and one matrix per expert, as older Mixtral
  // files store them); 0: dense.
  int64_t experts = 0;
  int64_t experts_used = 2;
  // Beside the experts, a shared expert of this width (Qwen2-MoE's ffn_*_shexp, with its
  // sigmoid gate ffn_gate_inp_shexp [hidden]); 0: none.
  int64_t shared_ffn = 0;
  // Granite's multipliers (<arch>.embedding_scale, residual_scale, attention.scale,
  // logit_scale); 0: the key is absent.
  float embedding_scale = 0.0f;
  float residual_scale = 0.0f;
  float attention_scale = 0.0f;
  float logit_scale = 0.0f;
};

inline std::string F32Bytes(const std::vector<float>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
}

inline std::string F16Bytes(const std::vector<float>& values) {
  std::string bytes(values.size() * 2, '\0');
  kernels::cuda::ConvertFromFloat(kernels::cuda::DataType::kF16, values.data(),
                                  static_cast<int64_t>(values.size()), bytes.data());
  return bytes;
}

// GGUF Q8_0: blocks of 32 values, an F16 scale then 32 int8 (value = q * scale).
inline std::string Q8_0Bytes(const std::vector<float>& values) {
  std::string bytes;
  bytes.reserve(values.size() / 32 * 34);
  for (size_t block = 0; block < values.size(); block += 32) {
    float max_abs = 0.0f;
    for (size_t i = 0; i < 32; ++i) max_abs = std::max(max_abs, std::abs(values[block + i]));
    const float scale = max_abs / 127.0f;
    const std::vector<float> scale_vector = {scale};
    bytes += F16Bytes(scale_vector);
    for (size_t i = 0; i < 32; ++i) {
      const float q = scale > 0 ? std::round(values[block + i] / scale) : 0.0f;
      bytes.push_back(static_cast<char>(static_cast<int8_t>(std::clamp(q, -127.0f, 127.0f))));
    }
  }
  return bytes;
}

// GGUF Q4_0 / Q4_1: blocks of 32 values, an F16 scale (Q4_1: then an F16 min), then 16
// bytes whose low nibbles hold values 0-15 and high nibbles values 16-31 (ggml's layout).
// Q4_0: value = (q - 8) * scale; Q4_1: value = q * scale + min.
inline std::string Q4Bytes(const std::vector<float>& values, bool with_min) {
  std::string bytes;
  bytes.reserve(values.size() / 32 * (with_min ? 20 : 18));
  for (size_t block = 0; block < values.size(); block += 32) {
    const float* x = values.data() + block;
    float scale = 0.0f, min = 0.0f;
    if (with_min) {
      min = *std::min_element(x, x + 32);
      scale = (*std::max_element(x, x + 32) - min) / 15.0f;
    } else {
      float extreme = 0.0f;  // the value of largest magnitude, with its sign
      for (int i = 0; i < 32; ++i) {
        if (std::abs(x[i]) > std::abs(extreme)) extreme = x[i];
      }
      scale = extreme / -8.0f;
    }
    bytes += F16Bytes({scale});
    if (with_min) bytes += F16Bytes({min});
    const float inverse = scale != 0.0f ? 1.0f / scale : 0.0f;
    int q[32];
    for (int i = 0; i < 32; ++i) {
      const float level = with_min ? (x[i] - min) * inverse : x[i] * inverse + 8.0f;
      q[i] = std::clamp(static_cast<int>(std::lround(level)), 0, 15);
    }
    for (int j = 0; j < 16; ++j) bytes.push_back(static_cast<char>(q[j] | (q[j + 16] << 4)));
  }
  return bytes;
}

// Q4_K / Q6_K: random super-blocks (there is no K-quant encoder here), the values' count
// and first value seeding them, their scales chosen so the weights are a few hundredths
// (as 1 / sqrt(columns) for the columns these models have). Columns: multiples of 256.
inline std::string RandomKQuantBytes(uint32_t type, const std::vector<float>& values) {
  uint32_t seed = static_cast<uint32_t>(values.size());
  if (!values.empty()) seed ^= static_cast<uint32_t>(values[0] * 1e6f);
  // Q6_K: d * int8 scale * (q - 32), ~1000 d; Q4_K: d * 6-bit scale * q - dmin * 6-bit min.
  const float max_scale = type == kGgmlQ6_K ? 6e-5f : 2.5e-4f;
  const std::vector<uint8_t> blocks = kernels::cpu::testing_util::RandomKQuantBlocks(
      static_cast<common::GgmlType>(type), static_cast<int64_t>(values.size()), seed, max_scale);
  return std::string(blocks.begin(), blocks.end());
}

inline std::string BF16Bytes(const std::vector<float>& values) {
  std::string bytes(values.size() * 2, '\0');
  kernels::cuda::ConvertFromFloat(kernels::cuda::DataType::kBF16, values.data(),
                                  static_cast<int64_t>(values.size()), bytes.data());
  return bytes;
}

inline std::string EncodeAs(uint32_t type, const std::vector<float>& values) {
  switch (type) {
    case kGgmlF32: return F32Bytes(values);
    case kGgmlF16: return F16Bytes(values);
    case kGgmlBF16:
      return BF16Bytes(values);
    case kGgmlQ8_0: return Q8_0Bytes(values);
    case kGgmlQ4_K:
    case kGgmlQ6_K:
      return RandomKQuantBytes(type, values);
    default: return Q4Bytes(values, type == kGgmlQ4_1);
  }
}

/// The metadata of the random model `spec` describes: its architecture's shape keys.
inline void AddRandomModelMetadata(const RandomModelSpec& spec, GgufImageBuilder& builder) {
  const std::string& a = spec.arch;
  builder.KvString("general.architecture", a)
      .KvString("general.name", "cuda-runner-test-" + a)
      .KvU32(a + ".context_length", 1024)
      .KvU32(a + ".embedding_length", static_cast<uint32_t>(spec.hidden))
      .KvU32(a + ".feed_forward_length", static_cast<uint32_t>(spec.ffn))
      .KvU32(a + ".block_count", static_cast<uint32_t>(spec.layers))
      .KvU32(a + ".attention.head_count", static_cast<uint32_t>(spec.heads))
      .KvU32(a + ".attention.head_count_kv", static_cast<uint32_t>(spec.kv_heads))
      .KvU32(a + ".attention.key_length", static_cast<uint32_t>(spec.head_dim))
      .KvU32(a + ".attention.value_length", static_cast<uint32_t>(spec.head_dim))
      .KvF32(a + ".attention.layer_norm_rms_epsilon", 1e-5f)
      .KvF32(a + ".rope.freq_base", 10000.0f);
  if (spec.sliding_window > 0) {
    builder.KvU32(a + ".attention.sliding_window", static_cast<uint32_t>(spec.sliding_window));
    if (spec.sliding_period > 0) {
      builder.KvU32(a + ".attention.sliding_window_pattern",
                    static_cast<uint32_t>(spec.sliding_period));
    }
  }
  for (auto [suffix, value] : {std::pair{".embedding_scale", spec.embedding_scale},
                               std::pair{".residual_scale", spec.residual_scale},
                               std::pair{".attention.scale", spec.attention_scale},
                               std::pair{".logit_scale", spec.logit_scale}}) {
    if (value != 0.0f) builder.KvF32(a + suffix, value);
  }
  if (spec.attn_logit_softcap > 0.0f) {
    builder.KvF32(a + ".attn_logit_softcapping", spec.attn_logit_softcap);
  }
  if (spec.experts > 0) {
    builder.KvU32(a + ".expert_count", static_cast<uint32_t>(spec.experts))
        .KvU32(a + ".expert_used_count", static_cast<uint32_t>(spec.experts_used));
    if (spec.shared_ffn > 0) {
      builder.KvU32(a + ".expert_shared_feed_forward_length",
                    static_cast<uint32_t>(spec.shared_ffn));
    }
  }
}

/// The GGUF image of the random model `spec` describes (the same spec gives the same bytes),
/// with the architecture's shape keys and no tokenizer.
inline absl::StatusOr<std::unique_ptr<GgufFile>> RandomModelImage(const RandomModelSpec& spec) {
  std::mt19937 rng(spec.seed);
  auto uniform = [&](int64_t count, float scale, float offset = 0.0f) {
    std::uniform_real_distribution<float> dist(-scale, scale);
    std::vector<float> out(count);
    for (float& x : out) x = offset + dist(rng);
    return out;
  };
  GgufImageBuilder builder;
  AddRandomModelMetadata(spec, builder);
  const uint64_t h = spec.hidden, q_rows = spec.heads * spec.head_dim,
                 kv_rows = spec.kv_heads * spec.head_dim, ffn = spec.ffn, vocab = spec.vocab;
  const std::vector<uint32_t> types =
      !spec.matrix_types.empty() ? spec.matrix_types
      : spec.int4                ? std::vector<uint32_t>{kGgmlQ4_0, kGgmlQ4_1}
                                 : std::vector<uint32_t>{kGgmlF16, kGgmlQ8_0, kGgmlF32};
  size_t matrix_index = 0;
  auto matrix = [&](const std::string& name, uint64_t rows, uint64_t cols) {
    const std::vector<float> values =
        uniform(static_cast<int64_t>(rows * cols), 1.0f / std::sqrt(static_cast<float>(cols)));
    const uint32_t type = types[matrix_index++ % types.size()];
    builder.Tensor(name, {cols, rows}, type, EncodeAs(type, values));
  };
  auto vector = [&](const std::string& name, uint64_t size, float scale, float offset) {
    builder.Tensor(name, {size}, kGgmlF32,
                   F32Bytes(uniform(static_cast<int64_t>(size), scale, offset)));
  };
  builder.Tensor("token_embd.weight", {h, vocab}, spec.embedding_type,
                 EncodeAs(spec.embedding_type, uniform(static_cast<int64_t>(vocab * h), 1.0f)));
  vector("output_norm.weight", h, 0.1f, 1.0f);
  if (!spec.tied) matrix("output.weight", vocab, h);
  for (int64_t l = 0; l < spec.layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    vector(p + "attn_norm.weight", h, 0.1f, 1.0f);
    matrix(p + "attn_q.weight", q_rows, h);
    matrix(p + "attn_k.weight", kv_rows, h);
    matrix(p + "attn_v.weight", kv_rows, h);
    if (spec.arch == "qwen2") {
      vector(p + "attn_q.bias", q_rows, 0.5f, 0.0f);
      vector(p + "attn_k.bias", kv_rows, 0.5f, 0.0f);
      vector(p + "attn_v.bias", kv_rows, 0.5f, 0.0f);
    }
    if (spec.arch == "qwen3") {
      vector(p + "attn_q_norm.weight", spec.head_dim, 0.2f, 1.0f);
      vector(p + "attn_k_norm.weight", spec.head_dim, 0.2f, 1.0f);
    }
    matrix(p + "attn_output.weight", h, q_rows);
    vector(p + "ffn_norm.weight", h, 0.1f, 1.0f);
    if (spec.experts > 0) {
      matrix(p + "ffn_gate_inp.weight", static_cast<uint64_t>(spec.experts), h);
      for (int64_t e = 0; e < spec.experts; ++e) {
        const std::string suffix = "." + std::to_string(e) + ".weight";
        matrix(p + "ffn_gate" + suffix, ffn, h);
        matrix(p + "ffn_up" + suffix, ffn, h);
        matrix(p + "ffn_down" + suffix, h, ffn);
      }
      if (spec.shared_ffn > 0) {
        const auto shared = static_cast<uint64_t>(spec.shared_ffn);
        matrix(p + "ffn_gate_shexp.weight", shared, h);
        matrix(p + "ffn_up_shexp.weight", shared, h);
        matrix(p + "ffn_down_shexp.weight", h, shared);
        vector(p + "ffn_gate_inp_shexp.weight", h, 4.0f / std::sqrt(static_cast<float>(h)), 0.0f);
      }
      continue;
    }
    matrix(p + "ffn_gate.weight", ffn, h);
    matrix(p + "ffn_up.weight", ffn, h);
    matrix(p + "ffn_down.weight", h, ffn);
  }
  return GgufFile::FromBytes(builder.Build());
}

}  // namespace loom::common::testing
