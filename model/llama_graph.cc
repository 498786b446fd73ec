#include "model/llama_graph.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace loom::model {

absl::StatusOr<std::unique_ptr<LlamaGraph>> LlamaGraph::Begin(const ModelWeights& w, Device& d,
                                                              const LlamaGraphOptions& options) {
  if (d.world_size() != w.shard.size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "tensor parallel rank %d of %d needs a device whose group has %d ranks, not %d",
        w.shard.rank, w.shard.size, w.shard.size, d.world_size()));
  }
  std::unique_ptr<LlamaGraph> graph(new LlamaGraph());
  graph->config_ = w.config;
  graph->shard_ = w.shard;
  const ShardPlan& plan = w.shard;
  if ((!plan.first_stage() && !options.receive) || (!plan.last_stage() && !options.send)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("pipeline stage %d of %d needs the residual stream's receive and send",
                        plan.stage, plan.num_stages));
  }
  graph->on_half_layer_ = options.on_half_layer;
  graph->receive_ = options.receive;
  graph->send_ = options.send;
  graph->block_size_ = options.block_size;
  if (w.token_embedding.rows > 0) {
    LOOM_ASSIGN_OR_RETURN(graph->token_embedding_, d.UploadTable(w.token_embedding));
  }
  // A tied LM head is the embedding table itself (one copy on the device).
  if (w.output != nullptr) {
    LOOM_ASSIGN_OR_RETURN(graph->lm_head_, d.UploadLmHead(*w.output));
  }
  if (plan.last_stage()) {
    LOOM_ASSIGN_OR_RETURN(graph->output_norm_, d.UploadF32(w.output_norm));
  }
  LOOM_ASSIGN_OR_RETURN(graph->rope_inv_freq_, d.UploadF32(w.rope_inv_freq));
  if (!w.local_rope_inv_freq.empty()) {
    LOOM_ASSIGN_OR_RETURN(graph->local_rope_inv_freq_, d.UploadF32(w.local_rope_inv_freq));
  }
  return graph;
}

absl::StatusOr<LlamaGraph::Layer> LlamaGraph::UploadLayer(Device& d, const LayerWeights& host) {
  Layer layer;
  if (!host.attn_norm.empty()) {
    LOOM_ASSIGN_OR_RETURN(layer.attn_norm, d.UploadF32(host.attn_norm));
    LOOM_ASSIGN_OR_RETURN(layer.ffn_norm, d.UploadF32(host.ffn_norm));
  }
  LOOM_ASSIGN_OR_RETURN(layer.qkv, d.UploadLinear(host.qkv, &host.qkv_bias));
  if (host.mla_kv_a.rows > 0) {
    if (host.mla_q_a.rows > 0) {
      LOOM_ASSIGN_OR_RETURN(layer.mla_q_a, d.UploadLinear(host.mla_q_a, nullptr));
      LOOM_ASSIGN_OR_RETURN(layer.mla_q_a_norm, d.UploadF32(host.mla_q_a_norm));
    }
    LOOM_ASSIGN_OR_RETURN(layer.mla_kv_a, d.UploadLinear(host.mla_kv_a, nullptr));
    LOOM_ASSIGN_OR_RETURN(layer.mla_kv_a_norm, d.UploadF32(host.mla_kv_a_norm));
    for (size_t h = 0; h < host.mla_k_up.size(); ++h) {
      LOOM_ASSIGN_OR_RETURN(auto k_up, d.UploadLinear(host.mla_k_up[h], nullptr));
      LOOM_ASSIGN_OR_RETURN(auto v_up, d.UploadLinear(host.mla_v_up[h], nullptr));
      layer.mla_k_up.push_back(std::move(k_up));
      layer.mla_v_up.push_back(std::move(v_up));
    }
  }
  if (!host.q_norm.empty()) {
    LOOM_ASSIGN_OR_RETURN(layer.q_norm, d.UploadF32(host.q_norm));
    LOOM_ASSIGN_OR_RETURN(layer.k_norm, d.UploadF32(host.k_norm));
  }
  LOOM_ASSIGN_OR_RETURN(layer.attn_output,
                        d.UploadLinear(host.attn_output, &host.attn_output_bias));
  if (!host.attn_sinks.empty()) {
    LOOM_ASSIGN_OR_RETURN(layer.sinks, d.UploadF32(host.attn_sinks));
  }
  if (!host.post_attention_norm.empty()) {
    LOOM_ASSIGN_OR_RETURN(layer.post_attention_norm, d.UploadF32(host.post_attention_norm));
    LOOM_ASSIGN_OR_RETURN(layer.post_ffw_norm, d.UploadF32(host.post_ffw_norm));
  }
  // The dense FFN, or a mixture of experts' shared expert where it has one.
  if (host.expert_gate_up.empty() || host.gate_up.rows > 0) {
    LOOM_ASSIGN_OR_RETURN(layer.gate_up, d.UploadLinear(host.gate_up, nullptr));
    LOOM_ASSIGN_OR_RETURN(layer.down, d.UploadLinear(host.down, nullptr));
  }
  if (host.shared_expert_gate.rows > 0) {
    LOOM_ASSIGN_OR_RETURN(layer.shared_gate, d.UploadTable(host.shared_expert_gate));
  }
  if (!host.expert_gate_up.empty()) {
    // The router as stored (never FP8): its top-k picks the experts.
    LOOM_ASSIGN_OR_RETURN(layer.router, d.UploadTable(host.router, &host.router_bias));
    layer.selection_bias = host.expert_selection_bias;
    const bool biased = !host.expert_gate_up_bias.empty();
    for (size_t e = 0; e < host.expert_gate_up.size(); ++e) {
      LOOM_ASSIGN_OR_RETURN(
          auto gate_up,
          d.UploadLinear(host.expert_gate_up[e], biased ? &host.expert_gate_up_bias[e] : nullptr));
      LOOM_ASSIGN_OR_RETURN(
          auto down,
          d.UploadLinear(host.expert_down[e], biased ? &host.expert_down_bias[e] : nullptr));
      layer.AddExpert(std::move(gate_up), std::move(down));
    }
  }
  return layer;
}

absl::StatusOr<std::unique_ptr<LlamaGraph>> LlamaGraph::Finish(
    std::unique_ptr<LlamaGraph> graph, std::unique_ptr<ModelWeights> host_weights,
    std::unique_ptr<Device> device, const LlamaGraphOptions& options) {
  // The CPU computes on the host weights in place; other devices hold copies.
  if (device->type() == DeviceType::kCpu) graph->host_weights_ = std::move(host_weights);
  graph->device_ = std::move(device);
  if (!options.defer_kv_cache) LOOM_RETURN_IF_ERROR(graph->CreateKvCache(options.num_kv_blocks));
  return graph;
}

absl::StatusOr<std::unique_ptr<LlamaGraph>> LlamaGraph::Create(
    std::unique_ptr<ModelWeights> weights, std::unique_ptr<Device> device,
    const LlamaGraphOptions& options) {
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<LlamaGraph> graph, Begin(*weights, *device, options));
  for (const LayerWeights& host : weights->layers) {
    LOOM_ASSIGN_OR_RETURN(Layer layer, UploadLayer(*device, host));
    graph->layers_.push_back(std::move(layer));
  }
  return Finish(std::move(graph), std::move(weights), std::move(device), options);
}

absl::StatusOr<std::unique_ptr<LlamaGraph>> LlamaGraph::CreateFromFile(
    const common::GgufFile& gguf, const Parallelism& parallel, std::unique_ptr<Device> device,
    const LlamaGraphOptions& options, std::string* load_log) {
  if (device->type() == DeviceType::kCpu) {
    return absl::FailedPreconditionError(
        "the CPU device computes on the host weights: load them whole (LlamaGraph::Create)");
  }
  std::vector<Layer> layers;
  LOOM_ASSIGN_OR_RETURN(
      std::unique_ptr<ModelWeights> weights,
      LoadModelWeights(gguf, parallel, {}, [&](LayerWeights host) -> absl::Status {
        absl::StatusOr<Layer> layer = UploadLayer(*device, host);
        if (!layer.ok()) {
          return absl::Status(layer.status().code(),
                              absl::StrFormat("uploading layer %d of the stage: %s", layers.size(),
                                              layer.status().message()));
        }
        layers.push_back(*std::move(layer));
        return absl::OkStatus();  // `host` is freed here
      }));
  if (load_log != nullptr) *load_log = weights->load_log;
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<LlamaGraph> graph, Begin(*weights, *device, options));
  graph->layers_ = std::move(layers);
  return Finish(std::move(graph), nullptr, std::move(device), options);
}

absl::StatusOr<std::unique_ptr<LlamaGraph>> LlamaGraph::CreateRandom(
    const common::ModelConfig& config, std::unique_ptr<Device> device,
    const LlamaGraphOptions& options, uint64_t seed) {
  if (device->world_size() != 1) {
    return absl::InvalidArgumentError("a random model runs on one rank only");
  }
  if (config.mla()) {
    return absl::UnimplementedError("a random model with multi-head latent attention");
  }
  std::unique_ptr<LlamaGraph> graph(new LlamaGraph());
  graph->config_ = config;
  LOOM_ASSIGN_OR_RETURN(graph->shard_, PlanShards(config, 0, 1));
  graph->on_half_layer_ = options.on_half_layer;
  graph->block_size_ = options.block_size;
  Device& d = *device;
  const int64_t hidden = config.hidden_size, hd = config.head_dim;
  const int64_t q_dim = config.num_heads * hd, kv_dim = config.num_kv_heads * hd;
  const int64_t ffn = config.intermediate_size;
  // Every tensor draws from its own stream: the seed advanced by a large odd constant.
  uint64_t tensor_seed = seed;
  auto next_seed = [&] { return tensor_seed += 0x632BE59BD9B4E019ull; };
  auto scale = [](int64_t fan_in) {
    return static_cast<float>(1.0 / std::sqrt(static_cast<double>(fan_in)));
  };
  auto matrix = [&](int64_t rows, int64_t cols) {
    return d.RandomLinear(rows, cols, next_seed(), scale(cols));
  };
  const std::vector<float> ones(static_cast<size_t>(std::max(hidden, hd)), 1.0f);
  const std::vector<float> hidden_ones(ones.begin(), ones.begin() + hidden);
  const std::vector<float> head_ones(ones.begin(), ones.begin() + hd);
  LOOM_ASSIGN_OR_RETURN(graph->token_embedding_, matrix(config.vocab_size, hidden));
  if (!config.tied_embeddings) {
    LOOM_ASSIGN_OR_RETURN(graph->lm_head_, matrix(config.vocab_size, hidden));
  }
  LOOM_ASSIGN_OR_RETURN(graph->output_norm_, d.UploadF32(hidden_ones));
  LOOM_ASSIGN_OR_RETURN(graph->rope_inv_freq_, d.UploadF32(RopeInverseFrequencies(config, {})));
  if (config.local_rope_theta > 0.0) {
    LOOM_ASSIGN_OR_RETURN(graph->local_rope_inv_freq_,
                          d.UploadF32(common::LocalRopeInverseFrequencies(config)));
  }
  for (int64_t l = 0; l < config.num_layers; ++l) {
    Layer layer;
    if (config.pre_norms) {
      LOOM_ASSIGN_OR_RETURN(layer.attn_norm, d.UploadF32(hidden_ones));
      LOOM_ASSIGN_OR_RETURN(layer.ffn_norm, d.UploadF32(hidden_ones));
    }
    // Biases are small: drawn on the host (splitmix64 of their own seed and the index).
    std::vector<float> bias;
    if (config.attention_bias) {
      const uint64_t bias_seed = next_seed();
      bias.resize(q_dim + 2 * kv_dim);
      for (size_t i = 0; i < bias.size(); ++i) {
        uint64_t z = bias_seed + 0x9E3779B97F4A7C15ull * (i + 1);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        const double u = static_cast<double>(z >> 11) * 0x1.0p-53;  // [0, 1)
        bias[i] = static_cast<float>((2.0 * u - 1.0) * scale(hidden));
      }
    }
    LOOM_ASSIGN_OR_RETURN(
        layer.qkv, d.RandomLinear(q_dim + 2 * kv_dim, hidden, next_seed(), scale(hidden), &bias));
    if (config.qk_norm) {
      LOOM_ASSIGN_OR_RETURN(
          layer.q_norm,
          d.UploadF32(config.qk_norm_full ? std::vector<float>(q_dim, 1.0f) : head_ones));
      LOOM_ASSIGN_OR_RETURN(
          layer.k_norm,
          d.UploadF32(config.qk_norm_full ? std::vector<float>(kv_dim, 1.0f) : head_ones));
    }
    LOOM_ASSIGN_OR_RETURN(layer.attn_output, matrix(hidden, q_dim));
    if (config.post_norms) {
      LOOM_ASSIGN_OR_RETURN(layer.post_attention_norm, d.UploadF32(hidden_ones));
      LOOM_ASSIGN_OR_RETURN(layer.post_ffw_norm, d.UploadF32(hidden_ones));
    }
    if (!config.LayerHasExperts(l)) {
      const int64_t width = config.DenseFfnWidth();
      LOOM_ASSIGN_OR_RETURN(layer.gate_up, matrix(2 * width, hidden));
      LOOM_ASSIGN_OR_RETURN(layer.down, matrix(hidden, width));
    } else {
      LOOM_ASSIGN_OR_RETURN(layer.router, matrix(config.num_experts, hidden));
      for (int64_t e = 0; e < config.num_experts; ++e) {
        LOOM_ASSIGN_OR_RETURN(auto gate_up, matrix(2 * ffn, hidden));
        LOOM_ASSIGN_OR_RETURN(auto down, matrix(hidden, ffn));
        layer.AddExpert(std::move(gate_up), std::move(down));
      }
      if (const int64_t shared = config.shared_expert_intermediate_size; shared > 0) {
        LOOM_ASSIGN_OR_RETURN(layer.gate_up, matrix(2 * shared, hidden));
        LOOM_ASSIGN_OR_RETURN(layer.down, matrix(hidden, shared));
        if (config.shared_expert_gated) {
          LOOM_ASSIGN_OR_RETURN(layer.shared_gate, matrix(1, hidden));
        }
      }
    }
    graph->layers_.push_back(std::move(layer));
  }
  graph->device_ = std::move(device);
  if (!options.defer_kv_cache) LOOM_RETURN_IF_ERROR(graph->CreateKvCache(options.num_kv_blocks));
  return graph;
}

absl::Status LlamaGraph::CreateKvCache(int64_t num_blocks) {
  if (kv_cache_ != nullptr) {
    return absl::FailedPreconditionError("the graph's KV pool exists already");
  }
  // The pool holds this rank's KV heads only.
  LOOM_ASSIGN_OR_RETURN(
      kv_cache_, device_->CreateKvCache(LocalConfig(config_, shard_), num_blocks, block_size_));
  return absl::OkStatus();
}

absl::Status LlamaGraph::ReplaceKvCache(int64_t num_blocks) {
  kv_cache_.reset();
  return CreateKvCache(num_blocks);
}

absl::Status LlamaGraph::Reserve(int64_t max_tokens, int64_t max_rows) {
  const int64_t T = std::max<int64_t>(max_tokens, 1), R = std::max<int64_t>(max_rows, 1);
  const int64_t H = config_.hidden_size, hd = config_.head_dim;
  const int64_t heads = shard_.num_heads, kv_heads = shard_.num_kv_heads, ffn = DenseFfn();
  LOOM_RETURN_IF_ERROR(Ensure(residual_, {T, H}));
  LOOM_RETURN_IF_ERROR(Ensure(normed_, {T, H}));
  LOOM_RETURN_IF_ERROR(Ensure(qkv_, {T, (heads + 2 * kv_heads) * hd}));
  LOOM_RETURN_IF_ERROR(Ensure(q_, {T, heads, hd}));
  LOOM_RETURN_IF_ERROR(Ensure(k_, {T, kv_heads, hd}));
  LOOM_RETURN_IF_ERROR(Ensure(v_, {T, kv_heads, hd}));
  LOOM_RETURN_IF_ERROR(Ensure(attn_, {T, heads * hd}));
  LOOM_RETURN_IF_ERROR(Ensure(proj_, {T, H}));
  LOOM_RETURN_IF_ERROR(Ensure(gate_up_, {T, 2 * ffn}));
  LOOM_RETURN_IF_ERROR(Ensure(act_, {T, ffn}));
  if (config_.num_experts > 0)
    LOOM_RETURN_IF_ERROR(Ensure(router_logits_, {T, config_.num_experts}));
  if (shard_.shared_ffn > 0) {
    LOOM_RETURN_IF_ERROR(Ensure(shared_out_, {T, H}));
    LOOM_RETURN_IF_ERROR(Ensure(shared_gate_, {T, 1}));
  }
  if (config_.mla()) {
    const int64_t latent = config_.mla_kv_lora_rank, rope = config_.rope_dim;
    LOOM_RETURN_IF_ERROR(Ensure(mla_q_latent_, {T, std::max<int64_t>(config_.mla_q_lora_rank, 1)}));
    LOOM_RETURN_IF_ERROR(Ensure(mla_latent_, {T, latent + rope}));
    LOOM_RETURN_IF_ERROR(Ensure(mla_c_kv_, {T, latent}));
    LOOM_RETURN_IF_ERROR(Ensure(mla_k_pe_, {T, rope}));
    LOOM_RETURN_IF_ERROR(Ensure(mla_heads_, {T, heads * (rope + config_.mla_nope_dim)}));
    LOOM_RETURN_IF_ERROR(Ensure(mla_latent_heads_, {T, heads * latent}));
    LOOM_RETURN_IF_ERROR(Ensure(mla_values_, {T, heads * config_.mla_value_dim}));
    LOOM_RETURN_IF_ERROR(Ensure(mla_out_, {T, heads * config_.mla_value_dim}));
  }
  LOOM_RETURN_IF_ERROR(Ensure(sampled_, {R, H}));
  if (device_->runs_collectives() && shard_.last_stage()) {
    LOOM_RETURN_IF_ERROR(Ensure(local_logits_, {R, std::max<int64_t>(shard_.vocab, 1)}));
  }
  return absl::OkStatus();
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
  return Forward(step, logits, Tensor{});
}

absl::Status LlamaGraph::Forward(const StepTensors& step, Tensor logits, Tensor hidden) {
  if (hidden.data != nullptr &&
      (device_->type() != DeviceType::kCpu || hidden.device != DeviceType::kCpu ||
       hidden.numel() != step.num_sample_rows * config_.hidden_size)) {
    return absl::UnimplementedError(
        "hidden states (embeddings) come back from the CPU device only, one row per sample row");
  }
  if (kv_cache_ == nullptr) {
    return absl::FailedPreconditionError("the graph has no KV pool (CreateKvCache)");
  }
  Device& d = *device_;
  const common::ModelConfig& c = config_;
  const int64_t T = step.num_tokens;
  const int64_t R = step.num_sample_rows;
  const int64_t H = c.hidden_size;
  const int64_t hd = c.head_dim;
  // This rank's heads and FFN channels (all of them without tensor parallelism).
  const int64_t heads = shard_.num_heads, kv_heads = shard_.num_kv_heads;
  const int64_t q_dim = heads * hd, kv_dim = kv_heads * hd;
  const int64_t ffn = DenseFfn();
  const float eps = static_cast<float>(c.rms_norm_eps);
  const bool parallel = d.runs_collectives();

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
  if (c.num_experts > 0) LOOM_RETURN_IF_ERROR(Ensure(router_logits_, {T, c.num_experts}));
  if (shard_.shared_ffn > 0) {
    LOOM_RETURN_IF_ERROR(Ensure(shared_out_, {T, H}));
    LOOM_RETURN_IF_ERROR(Ensure(shared_gate_, {T, 1}));
  }
  const MoeSpec moe{.top_k = c.num_experts_used,
                    .normalize = c.expert_weights_norm,
                    .sigmoid = c.expert_sigmoid,
                    .selection_bias = {},
                    .scale = c.expert_weights_scale,
                    .groups = c.expert_groups,
                    .groups_used = c.expert_groups_used,
                    .swiglu_limit = c.swiglu_limit};
  const Tensor residual = residual_.view, proj = proj_.view;
  const Tensor q = q_.view;

  // Tensor parallel: a rank embeds the ids of its vocabulary slice (zeros elsewhere), and
  // the partial sums of the embedding and of the row-parallel layers add up across ranks.
  if (shard_.first_stage()) {
    LOOM_RETURN_IF_ERROR(
        d.Embedding(*token_embedding_, step.token_ids, shard_.vocab0, c.embedding_scale, residual));
    if (parallel) LOOM_RETURN_IF_ERROR(d.AllReduceSum(residual));
  } else {
    LOOM_RETURN_IF_ERROR(receive_(residual, proj));
  }

  RopeSpec rope;
  rope.inv_freq = Vector(*rope_inv_freq_, c.rope_dim / 2);
  rope.head_dim = hd;
  rope.rope_dim = c.rope_dim;
  rope.neox = c.rope_neox;
  rope.attention_factor = static_cast<float>(c.rope_attention_factor);
  RopeSpec local_rope = rope;  // local layers' (Gemma 3: their own base, no scaling)
  if (local_rope_inv_freq_ != nullptr) {
    local_rope.inv_freq = Vector(*local_rope_inv_freq_, c.rope_dim / 2);
    local_rope.attention_factor = 1.0f;
  }
  AttentionSpec attention;
  attention.num_heads = heads;
  attention.group = c.num_heads / c.num_kv_heads;
  attention.head0 = shard_.head0;
  attention.kv_head0 = shard_.kv_head0;
  attention.head_dim = hd;
  attention.scale = c.attention_scale > 0.0 ? static_cast<float>(c.attention_scale)
                                            : 1.0f / std::sqrt(static_cast<float>(hd));
  attention.softcap = c.attn_logit_softcap;

  for (size_t i = 0; i < layers_.size(); ++i) {
    const Layer& layer = layers_[i];
    // The model's layer number (windows, observers); the stage's pool holds its own layers.
    const int64_t l = shard_.layer0 + static_cast<int64_t>(i);
    const int64_t kv_layer = static_cast<int64_t>(i);
    // The previous layer's MLP output joins the residual stream here.
    LOOM_ASSIGN_OR_RETURN(const Tensor attn_in, JoinResidual(layer.attn_norm.get(), l == 0));
    attention.window = c.LayerWindow(l);
    attention.sinks = layer.sinks != nullptr ? Vector(*layer.sinks, heads) : Tensor{};
    // SmolLM3's NoPE layers keep q and k as projected.
    const RopeSpec* layer_rope = !c.LayerRotates(l)     ? nullptr
                                 : attention.window > 0 ? &local_rope
                                                        : &rope;
    LOOM_RETURN_IF_ERROR(AttentionInputs(layer, attn_in, l, kv_layer, step, layer_rope));
    const bool latent = layer.mla_kv_a != nullptr;
    LOOM_RETURN_IF_ERROR(d.PagedAttention(*kv_cache_, kv_layer, q, step, attention, attn_.view));
    Tensor attn_out = attn_.view;
    if (latent) {
      LOOM_ASSIGN_OR_RETURN(attn_out, MlaOutput(layer, attn_.view));
    }
    LOOM_RETURN_IF_ERROR(
        d.Linear(attn_out, *layer.attn_output, proj, {l, LinearInput::kAttnOutput}));
    if (parallel) LOOM_RETURN_IF_ERROR(d.AllReduceSum(proj));
    // Gemma normalizes each sub-layer's whole output before it joins the residual stream.
    if (layer.post_attention_norm != nullptr) {
      LOOM_RETURN_IF_ERROR(d.RmsNorm(proj, Vector(*layer.post_attention_norm, H), eps, proj));
    }
    // Granite scales each sub-layer's output before it joins the residual stream.
    if (c.residual_scale != 1.0f) LOOM_RETURN_IF_ERROR(d.Scale(proj, c.residual_scale));
    if (on_half_layer_) on_half_layer_();
    LOOM_ASSIGN_OR_RETURN(const Tensor ffn_in, JoinResidual(layer.ffn_norm.get(), false));
    if (layer.router != nullptr) {
      // Mixture of experts: every rank routes alike (the router is whole on each).
      LOOM_RETURN_IF_ERROR(d.Linear(ffn_in, *layer.router, router_logits_.view));
      MoeSpec routing = moe;
      routing.selection_bias = layer.selection_bias;
      LOOM_RETURN_IF_ERROR(d.MoeFeedForward(ffn_in, router_logits_.view, layer.expert_gate_up,
                                            layer.expert_down, routing, proj));
      if (layer.gate_up != nullptr) LOOM_RETURN_IF_ERROR(AddSharedExpert(layer, ffn_in, proj));
    } else {
      // A dense layer (a mixture of experts' leading ones are dense_ffn wide).
      const int64_t width = c.num_experts > 0 ? shard_.dense_ffn : ffn;
      const Tensor gate_up = Prefix(gate_up_, T, 2 * width), act = Prefix(act_, T, width);
      LOOM_RETURN_IF_ERROR(d.Linear(ffn_in, *layer.gate_up, gate_up, {l, LinearInput::kGateUp}));
      LOOM_RETURN_IF_ERROR(c.gelu ? d.GeluMul(gate_up, act) : d.SiluMul(gate_up, act));
      LOOM_RETURN_IF_ERROR(d.Linear(act, *layer.down, proj, {l, LinearInput::kDown}));
    }
    if (parallel) LOOM_RETURN_IF_ERROR(d.AllReduceSum(proj));
    if (layer.post_ffw_norm != nullptr) {
      LOOM_RETURN_IF_ERROR(d.RmsNorm(proj, Vector(*layer.post_ffw_norm, H), eps, proj));
    }
    if (c.residual_scale != 1.0f) LOOM_RETURN_IF_ERROR(d.Scale(proj, c.residual_scale));
    if (on_half_layer_) on_half_layer_();
  }

  if (!shard_.last_stage()) return send_(residual, proj);
  if (R == 0) return absl::OkStatus();
  return Head(step, logits, hidden);
}

absl::Status LlamaGraph::AttentionInputs(const Layer& layer, const Tensor& x, int64_t l,
                                         int64_t kv_layer, const StepTensors& step,
                                         const RopeSpec* rope) {
  Device& d = *device_;
  const common::ModelConfig& c = config_;
  const Tensor q = q_.view, k = k_.view, v = v_.view;
  const bool latent = layer.mla_kv_a != nullptr;
  if (latent || (layer.q_norm != nullptr && c.qk_norm_full)) {
    LOOM_RETURN_IF_ERROR(QkvProjections(layer, x, l));
    if (rope != nullptr) LOOM_RETURN_IF_ERROR(d.Rope(q, k, step.positions, *rope));
    // Latent attention's value is its key (the latent, beside the rotary part MlaOutput drops).
    return d.WriteKv(*kv_cache_, kv_layer, k, latent ? k : v, step.slots);
  }
  // The QKV product's rows straight into q and the cache: split, each head of q and k normalized
  // (Qwen3's and Gemma 3's QK-norm), rotated and written (one launch on the CUDA device).
  QkvSpec spec;
  spec.rope = rope;
  if (layer.q_norm != nullptr) {
    spec.q_norm = Vector(*layer.q_norm, c.head_dim);
    spec.k_norm = Vector(*layer.k_norm, c.head_dim);
    spec.norm_eps = static_cast<float>(c.rms_norm_eps);
  }
  LOOM_RETURN_IF_ERROR(d.Linear(x, *layer.qkv, qkv_.view, {l, LinearInput::kQkv}));
  return d.QkvToCache(qkv_.view, q, k, v, step.positions, spec, *kv_cache_, kv_layer, step.slots);
}

absl::Status LlamaGraph::QkvProjections(const Layer& layer, const Tensor& x, int64_t l) {
  Device& d = *device_;
  const common::ModelConfig& c = config_;
  const int64_t T = x.rows(), hd = c.head_dim;
  const int64_t heads = shard_.num_heads, kv_heads = shard_.num_kv_heads;
  const Tensor q = q_.view, k = k_.view, v = v_.view;
  if (layer.mla_kv_a != nullptr) return MlaProjections(layer, x, l, q, k);
  const Tensor parts[] = {Tensor::Of(q.data, DType::kF32, q.device, {T, heads * hd}),
                          Tensor::Of(k.data, DType::kF32, k.device, {T, kv_heads * hd}),
                          Tensor::Of(v.data, DType::kF32, v.device, {T, kv_heads * hd})};
  LOOM_RETURN_IF_ERROR(d.Linear(x, *layer.qkv, qkv_.view, {l, LinearInput::kQkv}));
  LOOM_RETURN_IF_ERROR(d.SplitColumns(qkv_.view, parts));
  if (layer.q_norm == nullptr) return absl::OkStatus();
  // OLMo's QK-norm: all of q's heads RMS-normalized together (and k's) before RoPE.
  LOOM_RETURN_IF_ERROR(NormAllHeads(parts[0], *layer.q_norm, c.num_heads * hd, shard_.head0 * hd));
  return NormAllHeads(parts[1], *layer.k_norm, c.num_kv_heads * hd, shard_.kv_head0 * hd);
}

absl::Status LlamaGraph::MlaProjections(const Layer& layer, const Tensor& x, int64_t l, Tensor q,
                                        Tensor k) {
  Device& d = *device_;
  const common::ModelConfig& c = config_;
  const int64_t T = x.rows(), heads = shard_.num_heads;
  const int64_t latent = c.mla_kv_lora_rank, rope = c.rope_dim, nope = c.mla_nope_dim;
  const auto eps = static_cast<float>(c.rms_norm_eps);
  auto view = [&](const Scratch& scratch, int64_t offset, int64_t cols) {
    return Slice(scratch, offset, T, cols);
  };
  // Queries: from x, or from x's query latent, normalized; each head's rotary part, then its
  // other part, apart.
  Tensor q_in = x;
  if (layer.mla_q_a != nullptr) {
    LOOM_RETURN_IF_ERROR(Ensure(mla_q_latent_, {T, c.mla_q_lora_rank}));
    q_in = mla_q_latent_.view;
    LOOM_RETURN_IF_ERROR(d.Linear(x, *layer.mla_q_a, q_in));
    LOOM_RETURN_IF_ERROR(
        d.RmsNorm(q_in, Vector(*layer.mla_q_a_norm, c.mla_q_lora_rank), eps, q_in));
  }
  const Tensor queries = Prefix(qkv_, T, heads * (rope + nope));
  LOOM_RETURN_IF_ERROR(d.Linear(q_in, *layer.qkv, queries));
  LOOM_RETURN_IF_ERROR(Ensure(mla_heads_, {T, heads * (rope + nope)}));
  LOOM_RETURN_IF_ERROR(Ensure(mla_latent_heads_, {T, heads * latent}));
  std::vector<Tensor> parts, joined;
  for (int64_t h = 0; h < heads; ++h) {
    parts.push_back(view(mla_heads_, T * h * (rope + nope), rope));
    parts.push_back(view(mla_heads_, T * (h * (rope + nope) + rope), nope));
  }
  LOOM_RETURN_IF_ERROR(d.SplitColumns(queries, parts));
  // Each head's non-rotary part into the latent space: q [T, heads, rope + latent].
  for (int64_t h = 0; h < heads; ++h) {
    const Tensor in_latent = view(mla_latent_heads_, T * h * latent, latent);
    LOOM_RETURN_IF_ERROR(d.Linear(parts[2 * h + 1], *layer.mla_k_up[h], in_latent));
    joined.push_back(parts[2 * h]);
    joined.push_back(in_latent);
  }
  LOOM_RETURN_IF_ERROR(d.ConcatColumns(
      joined, Tensor::Of(q.data, DType::kF32, q.device, {T, heads * (rope + latent)})));
  // The KV head: the rotary key part beside the normalized latent.
  LOOM_RETURN_IF_ERROR(Ensure(mla_latent_, {T, latent + rope}));
  LOOM_RETURN_IF_ERROR(Ensure(mla_c_kv_, {T, latent}));
  LOOM_RETURN_IF_ERROR(Ensure(mla_k_pe_, {T, rope}));
  const Tensor both = mla_latent_.view, c_kv = mla_c_kv_.view, k_pe = mla_k_pe_.view;
  LOOM_RETURN_IF_ERROR(d.Linear(x, *layer.mla_kv_a, both, {l, LinearInput::kQkv}));
  const Tensor split[] = {c_kv, k_pe};
  LOOM_RETURN_IF_ERROR(d.SplitColumns(both, split));
  LOOM_RETURN_IF_ERROR(d.RmsNorm(c_kv, Vector(*layer.mla_kv_a_norm, latent), eps, c_kv));
  const Tensor key[] = {k_pe, c_kv};
  return d.ConcatColumns(key, Tensor::Of(k.data, DType::kF32, k.device, {T, rope + latent}));
}

absl::StatusOr<Tensor> LlamaGraph::MlaOutput(const Layer& layer, const Tensor& attn) {
  Device& d = *device_;
  const common::ModelConfig& c = config_;
  const int64_t T = attn.rows(), heads = shard_.num_heads;
  const int64_t latent = c.mla_kv_lora_rank, rope = c.rope_dim, value_dim = c.mla_value_dim;
  LOOM_RETURN_IF_ERROR(Ensure(mla_heads_, {T, heads * rope}));
  LOOM_RETURN_IF_ERROR(Ensure(mla_latent_heads_, {T, heads * latent}));
  LOOM_RETURN_IF_ERROR(Ensure(mla_values_, {T, heads * value_dim}));
  auto view = [&](const Scratch& scratch, int64_t offset, int64_t cols) {
    return Slice(scratch, offset, T, cols);
  };
  // Each head's output: its rotary dims (the weights times the rotated key parts, no value)
  // dropped, its latent part [T, latent] out through the head's value decompression.
  std::vector<Tensor> parts, values;
  for (int64_t h = 0; h < heads; ++h) {
    parts.push_back(view(mla_heads_, T * h * rope, rope));
    parts.push_back(view(mla_latent_heads_, T * h * latent, latent));
  }
  LOOM_RETURN_IF_ERROR(d.SplitColumns(attn, parts));
  for (int64_t h = 0; h < heads; ++h) {
    values.push_back(view(mla_values_, T * h * value_dim, value_dim));
    LOOM_RETURN_IF_ERROR(d.Linear(parts[2 * h + 1], *layer.mla_v_up[h], values.back()));
  }
  // The heads' values, one after another, side by side for the output projection.
  LOOM_RETURN_IF_ERROR(Ensure(mla_out_, {T, heads * value_dim}));
  LOOM_RETURN_IF_ERROR(d.ConcatColumns(values, mla_out_.view));
  return mla_out_.view;
}

absl::Status LlamaGraph::NormAllHeads(Tensor local, const Buffer& weight, int64_t total,
                                      int64_t first) {
  Device& d = *device_;
  const auto eps = static_cast<float>(config_.rms_norm_eps);
  if (!d.runs_collectives()) return d.RmsNorm(local, Vector(weight, total), eps, local);
  const int64_t T = local.rows(), width = local.cols();
  LOOM_RETURN_IF_ERROR(Ensure(all_heads_, {T, total}));
  LOOM_RETURN_IF_ERROR(Ensure(other_heads_, {T, total}));
  const Tensor all = all_heads_.view;
  LOOM_RETURN_IF_ERROR(d.AllGatherColumns(local, all));
  LOOM_RETURN_IF_ERROR(d.RmsNorm(all, Vector(weight, total), eps, all));
  // This rank's columns back into `local`; the others' into scratch (no empty part).
  float* others = other_heads_.view.as<float>();
  std::array<Tensor, 3> parts;
  size_t count = 0;
  if (first > 0) parts[count++] = Tensor::Of(others, DType::kF32, local.device, {T, first});
  parts[count++] = local;
  if (const int64_t rest = total - first - width; rest > 0) {
    parts[count++] = Tensor::Of(others + T * first, DType::kF32, local.device, {T, rest});
  }
  return d.SplitColumns(all, absl::MakeConstSpan(parts.data(), count));
}

absl::StatusOr<Tensor> LlamaGraph::JoinResidual(const Buffer* norm, bool first) {
  Device& d = *device_;
  const Tensor residual = residual_.view, proj = proj_.view, normed = normed_.view;
  if (norm == nullptr) {
    if (!first) LOOM_RETURN_IF_ERROR(d.AddSigmoidGated(proj, Tensor{}, residual));
    return residual;
  }
  const Tensor weight = Vector(*norm, config_.hidden_size);
  const auto eps = static_cast<float>(config_.rms_norm_eps);
  if (first) {
    LOOM_RETURN_IF_ERROR(d.RmsNorm(residual, weight, eps, normed));
  } else {
    LOOM_RETURN_IF_ERROR(d.AddRmsNorm(residual, proj, weight, eps, normed));
  }
  return normed;
}

absl::Status LlamaGraph::AddSharedExpert(const Layer& layer, const Tensor& normed, Tensor proj) {
  Device& d = *device_;
  const int64_t T = normed.rows(), width = shard_.shared_ffn;
  const Tensor gate_up = Prefix(gate_up_, T, 2 * width), act = Prefix(act_, T, width);
  LOOM_RETURN_IF_ERROR(d.Linear(normed, *layer.gate_up, gate_up));
  LOOM_RETURN_IF_ERROR(d.SiluMul(gate_up, act));
  LOOM_RETURN_IF_ERROR(d.Linear(act, *layer.down, shared_out_.view));
  Tensor gate;
  if (layer.shared_gate != nullptr) {
    LOOM_RETURN_IF_ERROR(d.Linear(normed, *layer.shared_gate, shared_gate_.view));
    gate = shared_gate_.view;
  }
  return d.AddSigmoidGated(shared_out_.view, gate, proj);
}

absl::Status LlamaGraph::Head(const StepTensors& step, Tensor logits, Tensor hidden) {
  Device& d = *device_;
  const common::ModelConfig& c = config_;
  const int64_t R = step.num_sample_rows, H = c.hidden_size;
  LOOM_RETURN_IF_ERROR(Ensure(sampled_, {R, H}));
  LOOM_RETURN_IF_ERROR(d.GatherRows(residual_.view, proj_.view, step.sample_rows, sampled_.view));
  LOOM_RETURN_IF_ERROR(d.RmsNorm(sampled_.view, Vector(*output_norm_, H),
                                 static_cast<float>(c.rms_norm_eps), sampled_.view));
  if (hidden.data != nullptr) {
    std::memcpy(hidden.data, sampled_.view.data, static_cast<size_t>(hidden.bytes()));
  }
  if (!d.runs_collectives()) {
    LOOM_RETURN_IF_ERROR(d.Linear(sampled_.view, lm_head(), logits));
  } else {
    // Vocabulary-parallel LM head: this rank's slice of the logits, gathered in order.
    LOOM_RETURN_IF_ERROR(Ensure(local_logits_, {R, shard_.vocab}));
    if (shard_.vocab > 0) {
      LOOM_RETURN_IF_ERROR(d.Linear(sampled_.view, lm_head(), local_logits_.view));
    }
    LOOM_RETURN_IF_ERROR(d.AllGatherColumns(local_logits_.view, logits));
  }
  if (c.logit_scale != 1.0f) LOOM_RETURN_IF_ERROR(d.Scale(logits, 1.0f / c.logit_scale));
  if (c.final_logit_softcap > 0.0f) return d.SoftCap(logits, c.final_logit_softcap);
  return absl::OkStatus();
}

}  // namespace loom::model
