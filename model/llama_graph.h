#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/formats/gguf_file.h"
#include "common/formats/model_config.h"
#include "model/device.h"
#include "model/model_weights.h"
#include "model/tensor_parallel.h"

namespace loom::model {

struct LlamaGraphOptions {
  int64_t num_kv_blocks = 1024;  // KV pool size; the coordinator sizes it from a budget
  // No pool at Create (num_kv_blocks unused): the caller sizes it once the weights are on
  // the device (the CUDA forward pass, from the memory left) and calls CreateKvCache.
  bool defer_kv_cache = false;
  int64_t block_size = 16;       // token slots per KV block
  /// Called twice per layer of every Forward (after attention, after the FFN), so a long
  /// step can be seen progressing; empty: not called.
  std::function<void()> on_half_layer;
  /// Pipeline parallelism (a ShardPlan of a stage): the residual stream between stages is
  /// the pair (residual, proj) [T, hidden] each, as the layer loop leaves it (the next
  /// layer adds proj into residual). A stage after the first takes its step's pair from
  /// `receive` before its first layer; a stage before the last hands its pair to `send`
  /// after its last layer and computes no logits. Required where the plan needs them.
  using StageIo = std::function<absl::Status(Tensor residual, Tensor proj)>;
  StageIo receive;
  StageIo send;
};

/// The llama-family forward pass (llama, mistral, qwen2, qwen3, and the mixtures of experts
/// Mixtral and Qwen3-MoE: a router and top-k experts in place of the FFN), written once over a
/// model::Device: embedding → [RMSNorm → QKV(+bias) → (QK-norm) → RoPE → paged-KV write →
/// paged attention → O → all-reduce → RMSNorm(+residual) → gate/up → SiLU·mul → down →
/// all-reduce] × L → final norm → LM head for the sample rows only (vocabulary-parallel,
/// gathered). GQA/MQA, tied embeddings and NeoX or normal RoPE come from the config; a
/// tensor-parallel rank runs its ShardPlan's slice and the device's collectives join the
/// ranks. Adding an architecture is an edit here (and, at most, one new Device op).
/// Owns the device, the weights on it and the KV pool. Not thread-safe.
class LlamaGraph {
 public:
  /// Uploads `weights` (this rank's slice, from LoadModelWeights) to `device` and creates
  /// the KV pool. The host weights are kept while the device views them (the CPU) and
  /// released otherwise. InvalidArgument for a pool the device refuses, or a device
  /// group whose size is not the weights' shard count.
  static absl::StatusOr<std::unique_ptr<LlamaGraph>> Create(std::unique_ptr<ModelWeights> weights,
                                                            std::unique_ptr<Device> device,
                                                            const LlamaGraphOptions& options);

  /// As Create over LoadModelWeights(gguf, parallel), but each layer is uploaded as soon as
  /// it is read and its host form dropped (LoadModelWeights' LayerSink): the host holds
  /// the embedding, the LM head and one layer, not the whole model (a BF16 checkpoint's
  /// matrices are F32 on the host: 4 bytes a parameter, 32 GB for an 8B model). For
  /// devices that hold copies: FailedPrecondition on the CPU device, which computes on the
  /// host weights. `load_log`, when not null, receives LoadModelWeights' log.
  static absl::StatusOr<std::unique_ptr<LlamaGraph>> CreateFromFile(
      const common::GgufFile& gguf, const Parallelism& parallel, std::unique_ptr<Device> device,
      const LlamaGraphOptions& options, std::string* load_log = nullptr);

  /// A graph for `config` (one rank, no tensor parallelism) whose matrices are generated
  /// on `device` (Device::RandomLinear: no host copy, for benchmarks of full-size models),
  /// uniform in +-1/sqrt(fan in), norm weights 1, QKV biases (when the config has them)
  /// uniform in +-1/sqrt(hidden) from `seed`. The same seed gives the same weights.
  /// Unimplemented on a device that does not generate weights.
  static absl::StatusOr<std::unique_ptr<LlamaGraph>> CreateRandom(const common::ModelConfig& config,
                                                                  std::unique_ptr<Device> device,
                                                                  const LlamaGraphOptions& options,
                                                                  uint64_t seed);

  /// Creates the KV pool of `num_blocks` blocks (options.block_size tokens each) after a
  /// Create with defer_kv_cache; FailedPrecondition when there is one.
  absl::Status CreateKvCache(int64_t num_blocks);
  /// Replaces the KV pool by an empty one of `num_blocks` blocks (the old one is freed
  /// first). Only before any step: a step may have captured the old pool's addresses.
  absl::Status ReplaceKvCache(int64_t num_blocks);

  /// Allocates the activations for steps of up to `max_tokens` tokens and `max_rows`
  /// sample rows now, so such steps allocate nothing (a device that captures the work
  /// of a step, such as CUDA graphs, needs that). Larger steps still grow them.
  absl::Status Reserve(int64_t max_tokens, int64_t max_rows);

  /// Runs one step (validated by the caller: ids, positions, slots and the CSR batch in
  /// range): writes its K/V into the pool and `logits` [R, vocab] (device memory) <- the
  /// logits of step.sample_rows (the last pipeline stage; an earlier one sends its residual
  /// stream on and leaves `logits` alone). Every rank of a group makes the same call. Enqueues only
  /// device calls (no host reads of device memory, no synchronization outside the
  /// device's collectives), allocating only when a scratch buffer must grow.
  absl::Status Forward(const StepTensors& step, Tensor logits);
  /// Forward, and `hidden` [R, hidden] (host memory; the CPU device only) <- the sample rows'
  /// final hidden states after the final norm, the LM head's input (embeddings).
  absl::Status Forward(const StepTensors& step, Tensor logits, Tensor hidden);

  const common::ModelConfig& config() const { return config_; }
  const ShardPlan& shard() const { return shard_; }
  Device& device() { return *device_; }
  /// The KV pool (CHECK-fails before CreateKvCache when Create was given none).
  const KvCache& kv_cache() const { return *kv_cache_; }
  /// The host weights (null once a device that copies them has them).
  const ModelWeights* host_weights() const { return host_weights_.get(); }

 private:
  struct Layer {
    // attn/ffn_norm: null without pre-norms (OLMo 2); q/k_norm: with a QK-norm only.
    std::unique_ptr<Buffer> attn_norm, q_norm, k_norm, ffn_norm;
    std::unique_ptr<Buffer> post_attention_norm, post_ffw_norm;   // Gemma only
    std::unique_ptr<Buffer> sinks;  // gpt-oss's attention sinks [local heads], or null
    // gate_up/down: the dense FFN, or a mixture of experts' shared expert (or null).
    std::unique_ptr<DeviceLinear> qkv, attn_output, gate_up, down;
    // A mixture of experts: the router and every expert's gate/up and down (views of the
    // owners below, as MoeFeedForward takes them); the shared expert's sigmoid gate
    // [1, hidden], or null.
    std::unique_ptr<DeviceLinear> router, shared_gate;
    std::vector<float> selection_bias;  // GLM-4.5's per-expert bias [experts] (host), or empty
    std::vector<std::unique_ptr<DeviceLinear>> expert_weights;
    std::vector<const DeviceLinear*> expert_gate_up, expert_down;
    // Multi-head latent attention (LayerWeights' mla_*; qkv then projects the queries only).
    std::unique_ptr<DeviceLinear> mla_q_a, mla_kv_a;
    std::unique_ptr<Buffer> mla_q_a_norm, mla_kv_a_norm;
    std::vector<std::unique_ptr<DeviceLinear>> mla_k_up, mla_v_up;  // per local head

    void AddExpert(std::unique_ptr<DeviceLinear> gate_up, std::unique_ptr<DeviceLinear> down) {
      expert_gate_up.push_back(gate_up.get());
      expert_down.push_back(down.get());
      expert_weights.push_back(std::move(gate_up));
      expert_weights.push_back(std::move(down));
    }
  };
  // An activation buffer, grown to the largest step seen.
  struct Scratch {
    std::unique_ptr<Buffer> buffer;
    Tensor view;
  };

  LlamaGraph() = default;
  // What Create and CreateFromFile share: the graph for `weights`' shard with everything
  // but the layers uploaded to `device` (not yet owned), after the checks.
  static absl::StatusOr<std::unique_ptr<LlamaGraph>> Begin(const ModelWeights& weights,
                                                           Device& device,
                                                           const LlamaGraphOptions& options);
  // One layer's weights on `device`.
  static absl::StatusOr<Layer> UploadLayer(Device& device, const LayerWeights& host);
  // The graph takes `device` (and `host_weights` where the device views them) and, unless
  // deferred, creates its KV pool.
  static absl::StatusOr<std::unique_ptr<LlamaGraph>> Finish(
      std::unique_ptr<LlamaGraph> graph, std::unique_ptr<ModelWeights> host_weights,
      std::unique_ptr<Device> device, const LlamaGraphOptions& options);
  Tensor Vector(const Buffer& buffer, int64_t size) const;
  // A mixture-of-experts layer's shared expert (Qwen2-MoE): a dense FFN of every token of
  // `normed`, scaled by its gate where it has one and added to the routed sum in `proj` (a
  // rank's partial sums, like the experts'). Uses the step's scratch buffers.
  absl::Status AddSharedExpert(const Layer& layer, const Tensor& normed, Tensor proj);
  // Layer `l`'s attention inputs of `x` [T, hidden]: its queries into q_ and its keys and
  // values into layer `kv_layer` of the cache at the step's slots, rotated with `rope` (null:
  // not rotated), through Device::QkvToCache, or QkvProjections then Rope and WriteKv.
  absl::Status AttentionInputs(const Layer& layer, const Tensor& x, int64_t l, int64_t kv_layer,
                               const StepTensors& step, const RopeSpec* rope);
  // Layer `l`'s queries, keys and values of its attention input `x` [T, hidden] into q_, k_
  // and v_ where Device::QkvToCache does not make them: the fused QKV product split with
  // OLMo's QK-norm (all heads together), or MlaProjections.
  absl::Status QkvProjections(const Layer& layer, const Tensor& x, int64_t l);
  // Multi-head latent attention's projections of `x` [T, hidden] (layer `l`), absorbed: each
  // query head's rotary part beside its other part taken into the latent space into q
  // [T, heads, head_dim], and the one KV head, the rotary key part beside the normalized
  // latent, into k [T, 1, head_dim] (LayerWeights' mla_*). Uses the step's scratch buffers.
  absl::Status MlaProjections(const Layer& layer, const Tensor& x, int64_t l, Tensor q, Tensor k);
  // The attention output over the latent space, `attn` [T, heads * head_dim], out of it:
  // each head's value part through its mla_v_up, side by side [T, heads * value_dim].
  absl::StatusOr<Tensor> MlaOutput(const Layer& layer, const Tensor& attn);
  // The previous sub-layer's output (proj_) joins the residual stream unless `first`; the
  // next sub-layer's input is then the stream RMS-normalized by `norm` (in normed_), or
  // the stream itself where `norm` is null (OLMo 2 has no pre-norms).
  absl::StatusOr<Tensor> JoinResidual(const Buffer* norm, bool first);
  // OLMo's QK-norm over all heads of `local` [T, this rank's heads * head_dim], the columns
  // from `first` of the whole [T, total]: RMS-normalized by `weight` [total] in place, the
  // other ranks' columns gathered for the sum of squares (equal slices: PlanShards).
  absl::Status NormAllHeads(Tensor local, const Buffer& weight, int64_t total, int64_t first);
  // This rank's channels of the widest dense FFN the layers run: a mixture of experts'
  // shared expert or its leading dense layers (the routed experts' own activations are
  // MoeFeedForward's), else every layer's.
  int64_t DenseFfn() const {
    return config_.num_experts > 0 ? std::max(shard_.shared_ffn, shard_.dense_ffn) : shard_.ffn;
  }
  // The first `rows` x `cols` of scratch buffer `scratch` (sized for at least that many).
  Tensor Prefix(const Scratch& scratch, int64_t rows, int64_t cols) const {
    return Slice(scratch, 0, rows, cols);
  }
  // `rows` x `cols` of scratch buffer `scratch` from float `offset` on.
  Tensor Slice(const Scratch& scratch, int64_t offset, int64_t rows, int64_t cols) const {
    return Tensor::Of(scratch.view.as<float>() + offset, DType::kF32, scratch.view.device,
                      {rows, cols});
  }
  const DeviceLinear& lm_head() const { return lm_head_ ? *lm_head_ : *token_embedding_; }
  // Sizes `scratch` for `shape` (F32), reallocating only when it grows.
  absl::Status Ensure(Scratch& scratch, std::initializer_list<int64_t> shape);
  // The last stage's end of Forward: the final norm and LM head for the sample rows only
  // (the last layer's output joined to the residual stream as they are gathered), their
  // hidden states into `hidden` when asked, the logits scaled and soft-capped as the model
  // says.
  absl::Status Head(const StepTensors& step, Tensor logits, Tensor hidden);

  common::ModelConfig config_;
  ShardPlan shard_;
  std::unique_ptr<ModelWeights> host_weights_;
  std::unique_ptr<Device> device_;
  std::unique_ptr<KvCache> kv_cache_;
  std::function<void()> on_half_layer_;
  LlamaGraphOptions::StageIo receive_, send_;
  int64_t block_size_ = 0;  // the pool's (options.block_size)

  std::unique_ptr<DeviceLinear> token_embedding_;  // [local vocab, hidden]; null: not needed
  std::unique_ptr<DeviceLinear> lm_head_;          // [local vocab, hidden]; null: tied
  std::unique_ptr<Buffer> output_norm_;            // [hidden]; null before the last stage
  std::unique_ptr<Buffer> rope_inv_freq_;          // [rope_dim / 2]
  std::unique_ptr<Buffer> local_rope_inv_freq_;    // local layers' (Gemma 3), or null
  std::vector<Layer> layers_;  // the stage's: layers_[i] is layer shard_.layer0 + i

  // Shapes for a step of T tokens and R sample rows:
  Scratch residual_;      // [T, hidden]
  Scratch normed_;        // [T, hidden]
  Scratch qkv_;           // [T, (heads + 2 kv_heads) * head_dim]
  Scratch q_, k_, v_;     // [T, heads|kv_heads, head_dim]
  Scratch attn_;          // [T, heads * head_dim]
  Scratch proj_;          // [T, hidden]
  Scratch gate_up_;       // [T, 2 * ffn]
  Scratch router_logits_;  // mixture of experts: [T, experts]
  Scratch shared_out_;     // a shared expert's output [T, hidden]
  Scratch shared_gate_;    // its gate's logits [T, 1]
  Scratch act_;           // [T, ffn]
  Scratch sampled_;       // [R, hidden]
  Scratch local_logits_;  // tensor parallel: [R, local vocab]
  Scratch all_heads_, other_heads_;  // tensor parallel, OLMo's QK-norm: [T, all heads' dims]
  // Multi-head latent attention: the query latent [T, q_lora], the key-value latent with the
  // key part [T, kv_lora + rope_dim], the two apart ([T, kv_lora], [T, rope_dim]), each
  // head's parts one after another (mla_heads_: a head's query parts or attention output
  // parts, mla_latent_heads_: its query or output in the latent space), the heads' values
  // one after another (mla_values_) and side by side (mla_out_) [T, heads * value_dim].
  Scratch mla_q_latent_, mla_latent_, mla_c_kv_, mla_k_pe_;
  Scratch mla_heads_, mla_latent_heads_, mla_values_, mla_out_;
};

}  // namespace loom::model
