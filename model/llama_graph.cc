#include "model/llama_graph.h"

#include <cmath>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace loom::model {

absl::StatusOr<std::unique_ptr<LlamaGraph>> LlamaGraph::Create(
    std::unique_ptr<ModelWeights> weights, std::unique_ptr<Device> device,
    const LlamaGraphOptions& options) {
  if (device->world_size() != weights->shard.size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "tensor parallel rank %d of %d needs a device whose group has %d ranks, not %d",
        weights->shard.rank, weights->shard.size, weights->shard.size, device->world_size()));
  }
  std::unique_ptr<LlamaGraph> graph(new LlamaGraph());
  graph->config_ = weights->config;
  graph->shard_ = weights->shard;
  graph->on_half_layer_ = options.on_half_layer;
  Device& d = *device;
  const ModelWeights& w = *weights;
  LOOM_ASSIGN_OR_RETURN(graph->token_embedding_, d.UploadLinear(w.token_embedding, nullptr));
  LOOM_ASSIGN_OR_RETURN(graph->lm_head_, d.UploadLinear(w.lm_head(), nullptr));
  LOOM_ASSIGN_OR_RETURN(graph->output_norm_, d.UploadF32(w.output_norm));
  LOOM_ASSIGN_OR_RETURN(graph->rope_inv_freq_, d.UploadF32(w.rope_inv_freq));
  for (const LayerWeights& host : w.layers) {
    Layer layer;
    LOOM_ASSIGN_OR_RETURN(layer.attn_norm, d.UploadF32(host.attn_norm));
    LOOM_ASSIGN_OR_RETURN(layer.qkv, d.UploadLinear(host.qkv, &host.qkv_bias));
    if (!host.q_norm.empty()) {
      LOOM_ASSIGN_OR_RETURN(layer.q_norm, d.UploadF32(host.q_norm));
      LOOM_ASSIGN_OR_RETURN(layer.k_norm, d.UploadF32(host.k_norm));
    }
    LOOM_ASSIGN_OR_RETURN(layer.attn_output, d.UploadLinear(host.attn_output, nullptr));
    LOOM_ASSIGN_OR_RETURN(layer.ffn_norm, d.UploadF32(host.ffn_norm));
    LOOM_ASSIGN_OR_RETURN(layer.gate_up, d.UploadLinear(host.gate_up, nullptr));
    LOOM_ASSIGN_OR_RETURN(layer.down, d.UploadLinear(host.down, nullptr));
    graph->layers_.push_back(std::move(layer));
  }
  // The KV pool holds this rank's KV heads only.
  LOOM_ASSIGN_OR_RETURN(graph->kv_cache_,
                        d.CreateKvCache(LocalConfig(graph->config_, graph->shard_),
                                        options.num_kv_blocks, options.block_size));
  // The CPU computes on the host weights in place; other devices hold copies.
  if (d.type() == DeviceType::kCpu) graph->host_weights_ = std::move(weights);
  graph->device_ = std::move(device);
  return graph;
}

Tensor LlamaGraph::Vector(const Buffer& buffer, int64_t size) const {
  return Tensor::Of(buffer.data(), DType::kF32, device_->type(), {size});
}

absl::Status LlamaGraph::Ensure(Scratch& scratch, std::initializer_list<int64_t> shape) {
  int64_t bytes = static_cast<int64_t>(sizeof(float));
  for (int64_t d : shape) bytes *= d;
  if (scratch.buffer == nullptr || scratch.buffer->bytes() < bytes) {
    LOOM_ASSIGN_OR_RETURN(scratch.buffer, device_->Allocate(bytes));
  }
  scratch.view = Tensor::Of(scratch.buffer->data(), DType::kF32, device_->type(), shape);
  return absl::OkStatus();
}

absl::Status LlamaGraph::Forward(const StepTensors& step, Tensor logits) {
  Device& d = *device_;
  const common::ModelConfig& c = config_;
  const int64_t T = step.num_tokens;
  const int64_t R = step.num_sample_rows;
  const int64_t H = c.hidden_size;
  const int64_t hd = c.head_dim;
  // This rank's heads and FFN channels (all of them without tensor parallelism).
  const int64_t heads = shard_.num_heads, kv_heads = shard_.num_kv_heads;
  const int64_t q_dim = heads * hd, kv_dim = kv_heads * hd;
  const int64_t ffn = shard_.ffn;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const bool parallel = d.world_size() > 1;

  LOOM_RETURN_IF_ERROR(Ensure(residual_, {T, H}));
  LOOM_RETURN_IF_ERROR(Ensure(normed_, {T, H}));
  LOOM_RETURN_IF_ERROR(Ensure(qkv_, {T, q_dim + 2 * kv_dim}));
  LOOM_RETURN_IF_ERROR(Ensure(q_, {T, heads, hd}));
  LOOM_RETURN_IF_ERROR(Ensure(k_, {T, kv_heads, hd}));
  LOOM_RETURN_IF_ERROR(Ensure(v_, {T, kv_heads, hd}));
  LOOM_RETURN_IF_ERROR(Ensure(attn_, {T, q_dim}));
  LOOM_RETURN_IF_ERROR(Ensure(proj_, {T, H}));
  LOOM_RETURN_IF_ERROR(Ensure(gate_up_, {T, 2 * ffn}));
  LOOM_RETURN_IF_ERROR(Ensure(act_, {T, ffn}));
  const Tensor residual = residual_.view, normed = normed_.view, proj = proj_.view;
  const Tensor q = q_.view, k = k_.view, v = v_.view;

  // Tensor parallel: a rank embeds the ids of its vocabulary slice (zeros elsewhere), and
  // the partial sums of the embedding and of the row-parallel layers add up across ranks.
  LOOM_RETURN_IF_ERROR(d.Embedding(*token_embedding_, step.token_ids, shard_.vocab0, residual));
  if (parallel) LOOM_RETURN_IF_ERROR(d.AllReduceSum(residual));

  RopeSpec rope;
  rope.inv_freq = Vector(*rope_inv_freq_, c.rope_dim / 2);
  rope.head_dim = hd;
  rope.rope_dim = c.rope_dim;
  rope.neox = c.rope_neox;
  rope.attention_factor = static_cast<float>(c.rope_attention_factor);
  AttentionSpec attention;
  attention.num_heads = heads;
  attention.group = c.num_heads / c.num_kv_heads;
  attention.head0 = shard_.head0;
  attention.kv_head0 = shard_.kv_head0;
  attention.head_dim = hd;
  attention.scale = 1.0f / std::sqrt(static_cast<float>(hd));

  for (size_t i = 0; i < layers_.size(); ++i) {
    const Layer& layer = layers_[i];
    const int64_t l = static_cast<int64_t>(i);
    const Tensor attn_norm = Vector(*layer.attn_norm, H);
    if (l == 0) {
      LOOM_RETURN_IF_ERROR(d.RmsNorm(residual, attn_norm, eps, normed));
    } else {
      // The previous layer's MLP output joins the residual stream here.
      LOOM_RETURN_IF_ERROR(d.AddRmsNorm(residual, proj, attn_norm, eps, normed));
    }
    LOOM_RETURN_IF_ERROR(d.Linear(normed, *layer.qkv, qkv_.view, {l, LinearInput::kQkv}));
    const Tensor parts[] = {Tensor::Of(q.data, DType::kF32, q.device, {T, q_dim}),
                            Tensor::Of(k.data, DType::kF32, k.device, {T, kv_dim}),
                            Tensor::Of(v.data, DType::kF32, v.device, {T, kv_dim})};
    LOOM_RETURN_IF_ERROR(d.SplitColumns(qkv_.view, parts));
    if (layer.q_norm != nullptr) {
      // Qwen3's QK-norm: each head of q and k is RMS-normalized before RoPE.
      const Tensor q_heads = Tensor::Of(q.data, DType::kF32, q.device, {T * heads, hd});
      const Tensor k_heads = Tensor::Of(k.data, DType::kF32, k.device, {T * kv_heads, hd});
      LOOM_RETURN_IF_ERROR(d.RmsNorm(q_heads, Vector(*layer.q_norm, hd), eps, q_heads));
      LOOM_RETURN_IF_ERROR(d.RmsNorm(k_heads, Vector(*layer.k_norm, hd), eps, k_heads));
    }
    LOOM_RETURN_IF_ERROR(d.Rope(q, k, step.positions, rope));
    LOOM_RETURN_IF_ERROR(d.WriteKv(*kv_cache_, l, k, v, step.slots));
    LOOM_RETURN_IF_ERROR(d.PagedAttention(*kv_cache_, l, q, step, attention, attn_.view));
    LOOM_RETURN_IF_ERROR(
        d.Linear(attn_.view, *layer.attn_output, proj, {l, LinearInput::kAttnOutput}));
    if (parallel) LOOM_RETURN_IF_ERROR(d.AllReduceSum(proj));
    if (on_half_layer_) on_half_layer_();
    LOOM_RETURN_IF_ERROR(d.AddRmsNorm(residual, proj, Vector(*layer.ffn_norm, H), eps, normed));
    LOOM_RETURN_IF_ERROR(d.Linear(normed, *layer.gate_up, gate_up_.view, {l, LinearInput::kGateUp}));
    LOOM_RETURN_IF_ERROR(d.SiluMul(gate_up_.view, act_.view));
    LOOM_RETURN_IF_ERROR(d.Linear(act_.view, *layer.down, proj, {l, LinearInput::kDown}));
    if (parallel) LOOM_RETURN_IF_ERROR(d.AllReduceSum(proj));
    if (on_half_layer_) on_half_layer_();
  }

  // Final norm and LM head only for the rows whose logits are wanted.
  if (R == 0) return absl::OkStatus();
  LOOM_RETURN_IF_ERROR(Ensure(sampled_, {R, H}));
  LOOM_RETURN_IF_ERROR(d.GatherRows(residual, proj, step.sample_rows, sampled_.view));
  LOOM_RETURN_IF_ERROR(
      d.RmsNorm(sampled_.view, Vector(*output_norm_, H), eps, sampled_.view));
  if (!parallel) return d.Linear(sampled_.view, *lm_head_, logits);
  // Vocabulary-parallel LM head: this rank's slice of the logits, gathered in order.
  LOOM_RETURN_IF_ERROR(Ensure(local_logits_, {R, shard_.vocab}));
  if (shard_.vocab > 0) {
    LOOM_RETURN_IF_ERROR(d.Linear(sampled_.view, *lm_head_, local_logits_.view));
  }
  return d.AllGatherColumns(local_logits_.view, logits);
}

}  // namespace loom::model
