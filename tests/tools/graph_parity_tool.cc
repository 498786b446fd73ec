// Driver for tests/model/cpu_graph_parity_test.py: proves that the model graph on the CPU
// device (worker::CpuForwardPass = model::LlamaGraph over model::CpuDevice) reproduces, bit for
// bit, the logits of the CPU forward pass as it was written before the model/ layer existed.
// That forward pass is kept below, frozen, as the reference (LegacyCpuForward: the loop of
// worker/cpu_forward_pass.cc at commit f279c61, single rank, over kernels/cpu directly). Both run
// the same steps (a batched prefill of prompts crossing KV blocks, batched decodes, a mixed
// prefill + decode step) on the same weights; the tool prints one JSON line:
//   {"steps": N, "floats": F, "mismatched": M, "max_abs_diff": D}
// --perturb doubles the reference's RMSNorm epsilon (a change of about 1e-6 in each norm), so the test can
// check that the comparison notices a change that small.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common/formats/gguf_file.h"
#include "common/formats/hf_model.h"
#include "common/status_macros.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/paged_attention.h"
#include "kernels/cpu/rope.h"
#include "model/cpu_kv_cache.h"
#include "model/model_weights.h"
#include "worker/cpu_forward_pass.h"
#include "worker/step_batch.h"

namespace {

namespace cpu = loom::kernels::cpu;
using loom::worker::StepBatch;

// The pre-model/ CPU forward pass (one rank, no observer), kept verbatim in substance.
class LegacyCpuForward {
 public:
  absl::Status Init(const loom::common::GgufFile& gguf, const loom::worker::CpuForwardPassOptions& o,
                    double eps_scale) {
    LOOM_ASSIGN_OR_RETURN(weights_, loom::model::LoadModelWeights(gguf));
    LOOM_ASSIGN_OR_RETURN(kv_cache_, loom::model::CpuKvCache::Create(weights_->config,
                                                                     o.num_kv_blocks,
                                                                     o.block_size, o.kv_dtype));
    pool_ = std::make_unique<cpu::ThreadPool>(o.num_threads);
    activations_ = o.activations;
    eps_scale_ = eps_scale;
    return absl::OkStatus();
  }

  absl::Status Step(const StepBatch& batch, std::vector<float>& logits) {
    const loom::common::ModelConfig& c = weights_->config;
    const loom::model::ShardPlan& shard = weights_->shard;
    const int64_t T = batch.num_tokens();
    const int64_t H = c.hidden_size;
    const int64_t q_dim = shard.num_heads * c.head_dim;
    const int64_t kv_dim = shard.num_kv_heads * c.head_dim;
    const int64_t qkv_dim = q_dim + 2 * kv_dim;
    const int64_t ffn = shard.ffn;
    const float eps = static_cast<float>(c.rms_norm_eps * eps_scale_);
    const cpu::ActivationPrecision precision = activations_;

    residual_.resize(T * H);
    normed_.resize(T * H);
    qkv_.resize(T * qkv_dim);
    q_.resize(T * q_dim);
    k_.resize(T * kv_dim);
    v_.resize(T * kv_dim);
    attn_.resize(T * q_dim);
    proj_.resize(T * H);
    gate_up_.resize(T * 2 * ffn);
    act_.resize(T * ffn);

    for (int64_t t = 0; t < T; ++t) {
      const int64_t id = batch.token_ids[t] - shard.vocab0;
      if (id >= 0 && id < shard.vocab) {
        cpu::DequantizeRows(weights_->token_embedding, id, id + 1, residual_.data() + t * H);
      } else {
        std::fill_n(residual_.data() + t * H, H, 0.0f);
      }
    }

    cpu::RopeParams rope;
    rope.q = q_.data();
    rope.k = k_.data();
    rope.positions = batch.positions.data();
    rope.inv_freq = weights_->rope_inv_freq.data();
    rope.num_tokens = T;
    rope.num_heads = shard.num_heads;
    rope.num_kv_heads = shard.num_kv_heads;
    rope.head_dim = c.head_dim;
    rope.rope_dim = c.rope_dim;
    rope.neox = c.rope_neox;

    cpu::PagedAttentionParams attention;
    attention.q = q_.data();
    attention.out = attn_.data();
    attention.query_start = batch.query_start.data();
    attention.context_len = batch.context_len.data();
    attention.block_indptr = batch.block_indptr.data();
    attention.block_indices = batch.block_indices.data();
    attention.num_seqs = batch.num_seqs();
    attention.num_heads = shard.num_heads;
    attention.group = c.num_heads / c.num_kv_heads;
    attention.head0 = shard.head0;
    attention.kv_head0 = shard.kv_head0;
    attention.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));

    for (size_t l = 0; l < weights_->layers.size(); ++l) {
      const loom::model::LayerWeights& layer = weights_->layers[l];
      if (l == 0) {
        cpu::RmsNorm(residual_.data(), layer.attn_norm.data(), eps, T, H, normed_.data());
      } else {
        cpu::AddRmsNorm(residual_.data(), proj_.data(), layer.attn_norm.data(), eps, T, H,
                        normed_.data());
      }
      LOOM_RETURN_IF_ERROR(cpu::Matmul({normed_.data(), &layer.qkv,
                                        layer.qkv_bias.empty() ? nullptr : layer.qkv_bias.data(),
                                        qkv_.data(), T, precision},
                                       *pool_));
      for (int64_t t = 0; t < T; ++t) {
        const float* row = qkv_.data() + t * qkv_dim;
        std::memcpy(q_.data() + t * q_dim, row, q_dim * sizeof(float));
        std::memcpy(k_.data() + t * kv_dim, row + q_dim, kv_dim * sizeof(float));
        std::memcpy(v_.data() + t * kv_dim, row + q_dim + kv_dim, kv_dim * sizeof(float));
      }
      if (!layer.q_norm.empty()) {
        cpu::RmsNorm(q_.data(), layer.q_norm.data(), eps, T * shard.num_heads, c.head_dim,
                     q_.data());
        cpu::RmsNorm(k_.data(), layer.k_norm.data(), eps, T * shard.num_kv_heads, c.head_dim,
                     k_.data());
      }
      cpu::Rope(rope);
      attention.cache = kv_cache_->layer(static_cast<int64_t>(l));
      LOOM_RETURN_IF_ERROR(
          cpu::WriteKv(attention.cache, k_.data(), v_.data(), batch.slots.data(), T));
      LOOM_RETURN_IF_ERROR(cpu::PagedAttention(attention, *pool_));
      LOOM_RETURN_IF_ERROR(cpu::Matmul(
          {attn_.data(), &layer.attn_output, nullptr, proj_.data(), T, precision}, *pool_));
      cpu::AddRmsNorm(residual_.data(), proj_.data(), layer.ffn_norm.data(), eps, T, H,
                      normed_.data());
      LOOM_RETURN_IF_ERROR(cpu::Matmul(
          {normed_.data(), &layer.gate_up, nullptr, gate_up_.data(), T, precision}, *pool_));
      cpu::SiluMul(gate_up_.data(), T, ffn, act_.data(), *pool_);
      LOOM_RETURN_IF_ERROR(
          cpu::Matmul({act_.data(), &layer.down, nullptr, proj_.data(), T, precision}, *pool_));
    }

    const int64_t S = static_cast<int64_t>(batch.sample_rows.size());
    sampled_.resize(S * H);
    for (int64_t i = 0; i < S; ++i) {
      const int64_t t = batch.sample_rows[i];
      float* dst = sampled_.data() + i * H;
      for (int64_t h = 0; h < H; ++h) dst[h] = residual_[t * H + h] + proj_[t * H + h];
    }
    cpu::RmsNorm(sampled_.data(), weights_->output_norm.data(), eps, S, H, sampled_.data());
    logits.resize(S * c.vocab_size);
    if (S == 0) return absl::OkStatus();
    return cpu::Matmul(
        {sampled_.data(), &weights_->lm_head(), nullptr, logits.data(), S, precision}, *pool_);
  }

 private:
  std::unique_ptr<loom::model::ModelWeights> weights_;
  std::unique_ptr<loom::model::CpuKvCache> kv_cache_;
  std::unique_ptr<cpu::ThreadPool> pool_;
  cpu::ActivationPrecision activations_ = cpu::ActivationPrecision::kF32;
  double eps_scale_ = 1.0;
  std::vector<float> residual_, normed_, qkv_, q_, k_, v_, attn_, proj_, gate_up_, act_, sampled_;
};

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "graph_parity_tool: %s\n", status.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path;
  bool perturb = false;
  loom::worker::CpuForwardPassOptions options;
  options.num_kv_blocks = 64;
  options.block_size = 16;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    const char* value = i + 1 < argc ? argv[i + 1] : "";
    if (flag == "--perturb") {
      perturb = true;
      continue;
    }
    ++i;
    if (flag == "--model") model_path = value;
    else if (flag == "--kv-dtype") options.kv_dtype = std::string(value) == "f32" ? cpu::KvDtype::kF32 : cpu::KvDtype::kF16;
    else if (flag == "--threads") options.num_threads = std::atoi(value);
    else if (flag == "--activations") {
      absl::StatusOr<cpu::ActivationPrecision> precision = cpu::ParseActivationPrecision(value);
      if (!precision.ok()) return Fail(precision.status());
      options.activations = *precision;
    } else {
      return Fail(absl::InvalidArgumentError("unknown flag " + flag));
    }
  }
  absl::StatusOr<std::unique_ptr<loom::common::GgufFile>> gguf =
      loom::common::OpenModelFile(model_path);
  if (!gguf.ok()) return Fail(gguf.status());
  absl::StatusOr<std::unique_ptr<loom::worker::CpuForwardPass>> forward_pass =
      loom::worker::CpuForwardPass::Create(**gguf, options);
  if (!forward_pass.ok()) return Fail(forward_pass.status());
  LegacyCpuForward legacy;
  if (absl::Status init = legacy.Init(**gguf, options, perturb ? 2.0 : 1.0); !init.ok()) {
    return Fail(init);
  }
  const int64_t vocab = (*forward_pass)->config().vocab_size;
  const int32_t block_size = static_cast<int32_t>(options.block_size);

  // Four sequences of 1, 17, 33 and 40 tokens (pseudo-random ids), each in its own 4 blocks.
  uint64_t state = 2024;
  auto next_id = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<int32_t>((state >> 33) % static_cast<uint64_t>(vocab));
  };
  std::vector<std::vector<int32_t>> sequences;
  for (int len : {1, 17, 33, 40}) {
    std::vector<int32_t> ids(len);
    for (int32_t& id : ids) id = next_id();
    sequences.push_back(ids);
  }
  auto blocks_of = [](int seq) {
    return std::vector<int32_t>{4 * seq, 4 * seq + 1, 4 * seq + 2, 4 * seq + 3};
  };
  std::vector<StepBatch> steps;
  {  // sequences 0-2 prefilled together, every token's logits sampled
    StepBatch prefill;
    for (int s = 0; s < 3; ++s) {
      if (absl::Status added = loom::worker::AppendSequence(prefill, sequences[s], 0, blocks_of(s),
                                                            block_size, true);
          !added.ok()) {
        return Fail(added);
      }
    }
    for (int32_t t = 0; t < prefill.num_tokens(); t += 3) prefill.sample_rows.push_back(t);
    std::sort(prefill.sample_rows.begin(), prefill.sample_rows.end());
    prefill.sample_rows.erase(std::unique(prefill.sample_rows.begin(), prefill.sample_rows.end()),
                              prefill.sample_rows.end());
    steps.push_back(prefill);
  }
  std::vector<int32_t> computed = {1, 17, 33, 0};
  for (int decode = 0; decode < 3; ++decode) {  // sequences 0-2 decode one token each
    StepBatch batch;
    for (int s = 0; s < 3; ++s) {
      const int32_t id = next_id();
      if (absl::Status added = loom::worker::AppendSequence(batch, {id}, computed[s], blocks_of(s),
                                                            block_size, true);
          !added.ok()) {
        return Fail(added);
      }
      ++computed[s];
    }
    steps.push_back(batch);
  }
  {  // sequence 3's prefill mixed with a decode of sequence 1
    StepBatch mixed;
    const int32_t id = next_id();
    if (absl::Status added = loom::worker::AppendSequence(mixed, {id}, computed[1], blocks_of(1),
                                                          block_size, true);
        !added.ok()) {
      return Fail(added);
    }
    if (absl::Status added = loom::worker::AppendSequence(mixed, sequences[3], 0, blocks_of(3),
                                                          block_size, true);
        !added.ok()) {
      return Fail(added);
    }
    steps.push_back(mixed);
  }

  int64_t floats = 0, mismatched = 0;
  double max_abs_diff = 0;
  std::vector<float> graph_logits, legacy_logits;
  for (const StepBatch& step : steps) {
    if (absl::Status ran = (*forward_pass)->Step(step, graph_logits); !ran.ok()) return Fail(ran);
    if (absl::Status ran = legacy.Step(step, legacy_logits); !ran.ok()) return Fail(ran);
    if (graph_logits.size() != legacy_logits.size()) {
      return Fail(absl::InternalError("logit counts differ"));
    }
    for (size_t i = 0; i < graph_logits.size(); ++i) {
      ++floats;
      if (std::memcmp(&graph_logits[i], &legacy_logits[i], sizeof(float)) != 0) ++mismatched;
      max_abs_diff = std::max(max_abs_diff,
                              static_cast<double>(std::fabs(graph_logits[i] - legacy_logits[i])));
    }
  }
  std::printf("{\"steps\": %zu, \"floats\": %lld, \"mismatched\": %lld, \"max_abs_diff\": %.9g}\n",
              steps.size(), static_cast<long long>(floats), static_cast<long long>(mismatched),
              max_abs_diff);
  return 0;
}
