#include "worker/model_runner.h"

#include <cmath>
#include <algorithm>
#include <cstring>

#include "absl/strings/str_format.h"

#include "common/status_macros.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/rope.h"

namespace loom::worker {

namespace cpu = kernels::cpu;

absl::StatusOr<std::unique_ptr<ModelRunner>> ModelRunner::Create(
    const common::GgufFile& gguf, const ModelRunnerOptions& options) {
  if (options.num_threads < 1) {
    return absl::InvalidArgumentError("the model runner needs at least one thread");
  }
  if (options.tp_size > 1 &&
      (options.communicator == nullptr || options.communicator->world_size() != options.tp_size ||
       options.communicator->rank() != options.tp_rank)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "tensor parallel rank %d of %d needs a communicator of that rank and size",
        options.tp_rank, options.tp_size));
  }
  std::unique_ptr<ModelRunner> runner(new ModelRunner());
  LOOM_ASSIGN_OR_RETURN(runner->weights_,
                        LoadModelWeights(gguf, options.tp_rank, options.tp_size));
  runner->communicator_ = options.tp_size > 1 ? options.communicator : nullptr;
  // The KV pool holds this rank's KV heads only.
  LOOM_ASSIGN_OR_RETURN(
      runner->kv_cache_,
      KvCache::Create(LocalConfig(runner->weights_->config, runner->weights_->shard),
                      options.num_kv_blocks, options.block_size, options.kv_dtype));
  runner->pool_ = options.thread_pool != nullptr
                      ? options.thread_pool
                      : std::make_shared<cpu::ThreadPool>(options.num_threads);
  runner->activations_ = options.activations;
  runner->progress_ = options.progress;
  return runner;
}

absl::Status ModelRunner::Step(const StepBatch& batch, std::vector<float>& logits) {
  const common::ModelConfig& c = weights_->config;
  LOOM_RETURN_IF_ERROR(ValidateStepBatch(batch, c.vocab_size, c.context_length,
                                         kv_cache_->num_blocks(), kv_cache_->block_size()));
  const ShardPlan& shard = weights_->shard;
  const int64_t T = batch.num_tokens();
  const int64_t H = c.hidden_size;
  // This rank's heads and FFN channels (all of them without tensor parallelism).
  const int64_t q_dim = shard.num_heads * c.head_dim;
  const int64_t kv_dim = shard.num_kv_heads * c.head_dim;
  const int64_t qkv_dim = q_dim + 2 * kv_dim;
  const int64_t ffn = shard.ffn;
  // Tensor parallel: partial sums of the row-parallel layers (and the embedding rows)
  // add up across ranks.
  auto all_reduce = [&](std::vector<float>& data) -> absl::Status {
    if (communicator_ == nullptr) return absl::OkStatus();
    return communicator_->AllReduceSum(absl::MakeSpan(data.data(), T * H));
  };
  const float eps = static_cast<float>(c.rms_norm_eps);
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
    // A rank holds the embedding rows of its vocabulary slice; the others add zeros.
    const int64_t id = batch.token_ids[t] - shard.vocab0;
    if (id >= 0 && id < shard.vocab) {
      cpu::DequantizeRows(weights_->token_embedding, id, id + 1, residual_.data() + t * H);
    } else {
      std::fill_n(residual_.data() + t * H, H, 0.0f);
    }
  }
  LOOM_RETURN_IF_ERROR(all_reduce(residual_));

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
  rope.attention_factor = static_cast<float>(c.rope_attention_factor);

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
    const LayerWeights& layer = weights_->layers[l];
    if (l == 0) {
      cpu::RmsNorm(residual_.data(), layer.attn_norm.data(), eps, T, H, normed_.data());
    } else {
      // The previous layer's MLP output joins the residual stream here.
      cpu::AddRmsNorm(residual_.data(), proj_.data(), layer.attn_norm.data(), eps, T, H,
                      normed_.data());
    }
    if (observer_) observer_(static_cast<int64_t>(l), LinearInput::kQkv, normed_.data(), T);
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
      // Qwen3's QK-norm: each head of q and k is RMS-normalized before RoPE.
      cpu::RmsNorm(q_.data(), layer.q_norm.data(), eps, T * shard.num_heads, c.head_dim, q_.data());
      cpu::RmsNorm(k_.data(), layer.k_norm.data(), eps, T * shard.num_kv_heads, c.head_dim,
                   k_.data());
    }
    cpu::Rope(rope);
    attention.cache = kv_cache_->layer(static_cast<int64_t>(l));
    LOOM_RETURN_IF_ERROR(cpu::WriteKv(attention.cache, k_.data(), v_.data(), batch.slots.data(), T));
    LOOM_RETURN_IF_ERROR(cpu::PagedAttention(attention, *pool_));
    if (observer_) observer_(static_cast<int64_t>(l), LinearInput::kAttnOutput, attn_.data(), T);
    LOOM_RETURN_IF_ERROR(
        cpu::Matmul({attn_.data(), &layer.attn_output, nullptr, proj_.data(), T, precision},
                    *pool_));
    LOOM_RETURN_IF_ERROR(all_reduce(proj_));
    if (progress_ != nullptr) progress_->Advance();
    cpu::AddRmsNorm(residual_.data(), proj_.data(), layer.ffn_norm.data(), eps, T, H,
                    normed_.data());
    if (observer_) observer_(static_cast<int64_t>(l), LinearInput::kGateUp, normed_.data(), T);
    LOOM_RETURN_IF_ERROR(
        cpu::Matmul({normed_.data(), &layer.gate_up, nullptr, gate_up_.data(), T, precision},
                    *pool_));
    cpu::SiluMul(gate_up_.data(), T, ffn, act_.data(), *pool_);
    if (observer_) observer_(static_cast<int64_t>(l), LinearInput::kDown, act_.data(), T);
    LOOM_RETURN_IF_ERROR(cpu::Matmul({act_.data(), &layer.down, nullptr, proj_.data(), T, precision}, *pool_));
    LOOM_RETURN_IF_ERROR(all_reduce(proj_));
    if (progress_ != nullptr) progress_->Advance();
  }

  // Final norm and LM head only for the rows whose logits are wanted.
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
  if (communicator_ == nullptr) {
    return cpu::Matmul({sampled_.data(), &weights_->lm_head(), nullptr, logits.data(), S, precision},
                       *pool_);
  }
  // Vocabulary-parallel LM head: each rank's slice of the logits (padded to the common
  // stride), gathered and put back in vocabulary order.
  const int64_t stride = shard.vocab_stride;
  local_logits_.assign(S * stride, 0.0f);
  gathered_logits_.resize(shard.size * S * stride);
  if (shard.vocab > 0) {
    std::vector<float>& rows = gathered_logits_;  // scratch before the gather overwrites it
    LOOM_RETURN_IF_ERROR(
        cpu::Matmul({sampled_.data(), &weights_->lm_head(), nullptr, rows.data(), S, precision},
                    *pool_));
    for (int64_t i = 0; i < S; ++i) {
      std::memcpy(local_logits_.data() + i * stride, rows.data() + i * shard.vocab,
                  shard.vocab * sizeof(float));
    }
  }
  LOOM_RETURN_IF_ERROR(communicator_->AllGather(local_logits_, absl::MakeSpan(gathered_logits_)));
  for (int r = 0; r < shard.size; ++r) {
    const int64_t vocab0 = std::min<int64_t>(c.vocab_size, r * stride);
    const int64_t count = std::min<int64_t>(c.vocab_size, vocab0 + stride) - vocab0;
    for (int64_t i = 0; i < S; ++i) {
      std::memcpy(logits.data() + i * c.vocab_size + vocab0,
                  gathered_logits_.data() + (r * S + i) * stride, count * sizeof(float));
    }
  }
  return absl::OkStatus();
}

}  // namespace loom::worker
