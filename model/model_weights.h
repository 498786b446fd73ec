#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/formats/gguf_file.h"
#include "common/formats/model_config.h"
#include "common/rope_frequencies.h"
#include "kernels/cpu/weights.h"
#include "model/tensor_parallel.h"

namespace loom::model {

/// One transformer block's weights in backend formats. Q/K/V and gate/up are fused
/// into one matrix each (one matmul instead of three or two).
struct LayerWeights {
  std::vector<float> attn_norm;       // [hidden], or empty: no pre-norms (OLMo 2)
  kernels::cpu::PackedWeight qkv;     // [(num_heads + 2 * num_kv_heads) * head_dim, hidden]
  std::vector<float> qkv_bias;        // same rows as qkv, or empty (no bias)
  // RMSNorm of q and k: [head_dim] per head (Qwen3), or [num_heads * head_dim] and
  // [num_kv_heads * head_dim] over all heads (OLMo 2, ModelConfig::qk_norm_full); or empty.
  std::vector<float> q_norm;
  std::vector<float> k_norm;               // empty iff q_norm is
  kernels::cpu::PackedWeight attn_output;  // [hidden, num_heads * head_dim]
  // gpt-oss: the attention output's bias [hidden], held by tensor-parallel rank 0 only (the
  // partial products are summed across ranks; the bias joins once), else empty; and the
  // attention sink of each of this rank's query heads [local heads], or empty.
  std::vector<float> attn_output_bias;
  std::vector<float> attn_sinks;
  std::vector<float> ffn_norm;  // [hidden], or empty as attn_norm
  // Gemma: RMSNorm of the attention output and of the FFN output ([hidden] each), or empty.
  std::vector<float> post_attention_norm;
  std::vector<float> post_ffw_norm;
  kernels::cpu::PackedWeight gate_up;      // [2 * intermediate, hidden]: gate rows, then up
  kernels::cpu::PackedWeight down;         // [hidden, intermediate]
  // A mixture of experts (config.num_experts > 0; gate_up and down then hold its shared
  // expert, [2 * shared, hidden] and [hidden, shared] of this rank's shared channels, or are
  // empty): the router [num_experts, hidden], whole on every rank, and each expert's
  // gate/up and down, shaped and sliced as a dense layer's (intermediate = the expert's
  // width); the shared expert's sigmoid gate [1, hidden] (F32, whole on every rank), or
  // empty.
  kernels::cpu::PackedWeight shared_expert_gate;
  kernels::cpu::PackedWeight router;
  std::vector<float> expert_selection_bias;  // GLM-4.5's [num_experts] (exp_probs_b), or empty
  std::vector<kernels::cpu::PackedWeight> expert_gate_up;  // [num_experts]
  std::vector<kernels::cpu::PackedWeight> expert_down;     // [num_experts]
  // gpt-oss's biases, or empty: the router's [num_experts]; each expert's gate/up
  // [2 * local intermediate] (this rank's gate rows, then up rows, as expert_gate_up) and
  // down [hidden] (rank 0 only, as attn_output_bias).
  std::vector<float> router_bias;
  std::vector<std::vector<float>> expert_gate_up_bias;
  std::vector<std::vector<float>> expert_down_bias;
  // Multi-head latent attention (ModelConfig::mla), absorbed: `qkv` holds the query rows only
  // [local heads * (rope_dim + mla_nope_dim), hidden or q_lora], each head's rope_dim rotary
  // rows first (the checkpoints put them last), from the hidden state or (mla_q_a not empty)
  // from the normalized query latent mla_q_a [q_lora, hidden] · x; mla_kv_a
  // [kv_lora + rope_dim, hidden]: the key-value latent, then the rotary key part shared by
  // every head; mla_kv_a_norm [kv_lora] normalizes the latent; per local head (F32),
  // mla_k_up [kv_lora, mla_nope_dim] takes its non-rotary query part into the latent space
  // (the key decompression transposed) and mla_v_up [mla_value_dim, kv_lora] its attention
  // output over the latent out of it (the value decompression). attn_output is the model's,
  // mla_value_dim columns per head.
  kernels::cpu::PackedWeight mla_q_a;
  std::vector<float> mla_q_a_norm;
  kernels::cpu::PackedWeight mla_kv_a;
  std::vector<float> mla_kv_a_norm;
  std::vector<kernels::cpu::PackedWeight> mla_k_up;
  std::vector<kernels::cpu::PackedWeight> mla_v_up;
};

/// All weights of a llama-family model (or one tensor-parallel rank's slice of them: the
/// matrices then have the local row/column counts of `shard`), converted from GGUF at
/// load.
struct ModelWeights {
  common::ModelConfig config;  // the whole model's
  ShardPlan shard;             // what this rank holds (size 1: everything)
  kernels::cpu::PackedWeight token_embedding;  // [vocab, hidden]
  std::vector<LayerWeights> layers;
  std::vector<float> output_norm;              // [hidden]
  /// [vocab, hidden]; nullptr-equivalent when tied: lm_head() returns the embedding.
  std::unique_ptr<kernels::cpu::PackedWeight> output;
  std::vector<float> rope_inv_freq;            // [rope_dim / 2], scaling applied
  std::vector<float> local_rope_inv_freq;      // local layers' (Gemma 3), or empty: as above
  std::string load_log;                        // one line per distinct conversion

  const kernels::cpu::PackedWeight& lm_head() const {
    return output ? *output : token_embedding;
  }
  /// Bytes of weights one decode step reads (every matrix once, plus one embedding row).
  int64_t BytesPerDecodeStep() const;
};

/// Reads and converts every weight of the slice `parallel` places the worker on (a
/// tensor-parallel rank's rows and columns, a pipeline stage's layers, the embedding on
/// the first stage and the LM head on the last: only those bytes of the file are read;
/// `layers` then holds the stage's layers and `token_embedding` is empty where no stage
/// part needs it); InvalidArgument naming the tensor for a missing tensor or a shape
/// that does not match the config, or naming what does not divide. Matrices in Loom's
/// own INT8/INT4 encoding (`loom quantize`, model/quantized_gguf.h) are packed without loss;
/// `pack` chooses between packings of the same values (kernels/cpu/weights.h).
/// With `sink`, each layer goes to it as soon as it is read, in order, instead of into
/// `layers` (which stays empty): a device that holds copies uploads it and drops the host
/// form, so the host holds one layer at a time (LlamaGraph::CreateFromFile). An error from
/// the sink stops the load and is returned.
using LayerSink = std::function<absl::Status(LayerWeights layer)>;
absl::StatusOr<std::unique_ptr<ModelWeights>> LoadModelWeights(
    const common::GgufFile& gguf, const Parallelism& parallel = {},
    const kernels::cpu::PackOptions& pack = {}, const LayerSink& sink = nullptr);

/// RoPE's inverse frequencies (linear, llama3 or yarn scaling applied) live in common/.
using common::RopeInverseFrequencies;

}  // namespace loom::model
