#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/gguf_file.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/paged_attention.h"
#include "kernels/cpu/thread_pool.h"
#include "worker/communicator.h"
#include "worker/forward_pass.h"
#include "worker/kv_cache.h"
#include "worker/model_weights.h"
#include "worker/step_batch.h"
#include "worker/step_progress.h"

namespace loom::worker {

struct ModelRunnerOptions {
  int num_threads = 2;
  int64_t num_kv_blocks = 1024;  // pool size; the coordinator sizes it from a memory budget
  int64_t block_size = 16;
  kernels::cpu::KvDtype kv_dtype = kernels::cpu::KvDtype::kF16;
  // How linear layers over INT8/INT4 weights (the LM head included) meet their input:
  // exact F32, or quantized to int8 per 32 values with integer dot products (VNNI where the
  // CPU has it; llama.cpp's CPU scheme). Float weights always use F32. Either choice is
  // applied to every step alike, so a sequence's logits never depend on its batch.
  kernels::cpu::ActivationPrecision activations = kernels::cpu::ActivationPrecision::kF32;
  // Tensor parallelism: this runner holds rank tp_rank's slice of the model and joins
  // the others through `communicator` (not owned; required when tp_size > 1). Every
  // rank runs every step with the same batch; all of them return the full logits.
  int tp_rank = 0;
  int tp_size = 1;
  Communicator* communicator = nullptr;
  // The thread pool to run on, shared with another runner that never steps at the same
  // time (a draft model beside its target, so the two do not keep two sets of spinning
  // threads); null: a pool of its own with num_threads threads.
  std::shared_ptr<kernels::cpu::ThreadPool> thread_pool;
  // Advanced twice per layer of every Step (after attention, after the FFN) so the worker's
  // heartbeat can show a long step progressing (not owned; null: not reported).
  StepProgress* progress = nullptr;
};

/// Which linear layer's input an ActivationObserver sees.
enum class LinearInput {
  kQkv,         // the attention RMSNorm's output, [T, hidden]
  kAttnOutput,  // the attention output, [T, local heads * head_dim]
  kGateUp,      // the FFN RMSNorm's output, [T, hidden]
  kDown,        // SiLU(gate) * up, [T, local ffn]
};

/// Called during Step with (layer index, which input, the input activations
/// [num_tokens, in_features] row-major, num_tokens): calibration for `loom quantize`.
/// `x` is valid only during the call.
using ActivationObserver =
    std::function<void(int64_t layer, LinearInput input, const float* x, int64_t num_tokens)>;

/// The llama-family forward pass on the CPU backend, written once against the kernel
/// launch functions: embedding → [RMSNorm → QKV → RoPE → paged-KV write → paged
/// attention → O → RMSNorm → gate/up → SiLU·mul → down] × L → final norm → LM head,
/// over one flattened batch per step. Owns the weights, the KV pool and scratch
/// buffers. Not thread-safe: one step at a time.
class ModelRunner : public ForwardPass {
 public:
  static absl::StatusOr<std::unique_ptr<ModelRunner>> Create(const common::GgufFile& gguf,
                                                             const ModelRunnerOptions& options);

  /// Runs one step: writes the batch's K/V into its slots and returns the logits of
  /// `batch.sample_rows`, [sample_rows.size(), vocab] into `logits`. InvalidArgument
  /// (nothing computed, nothing written) for a batch ValidateStepBatch rejects.
  absl::Status Step(const StepBatch& batch, std::vector<float>& logits) override;

  const common::ModelConfig& config() const override { return weights_->config; }
  const ModelWeights& weights() const { return *weights_; }
  const KvCache& kv_cache() const { return *kv_cache_; }
  int64_t block_size() const override { return kv_cache_->block_size(); }
  int64_t num_kv_blocks() const override { return kv_cache_->num_blocks(); }
  int num_threads() const { return pool_->num_threads(); }
  /// The pool Step runs on (to share with a draft model's runner, see ModelRunnerOptions).
  const std::shared_ptr<kernels::cpu::ThreadPool>& thread_pool() const { return pool_; }
  /// Installs (or, with nullptr, removes) an observer of every linear layer's input;
  /// none by default, and then Step pays nothing for it.
  void SetActivationObserver(ActivationObserver observer) { observer_ = std::move(observer); }

 private:
  ModelRunner() = default;

  std::unique_ptr<ModelWeights> weights_;
  std::unique_ptr<KvCache> kv_cache_;
  std::shared_ptr<kernels::cpu::ThreadPool> pool_;
  Communicator* communicator_ = nullptr;  // tensor parallel only
  ActivationObserver observer_;            // empty unless calibrating
  StepProgress* progress_ = nullptr;       // ModelRunnerOptions::progress
  kernels::cpu::ActivationPrecision activations_ = kernels::cpu::ActivationPrecision::kF32;

  // Scratch, grown to the largest step seen. Shapes for a step of T tokens:
  std::vector<float> residual_;  // [T, hidden]
  std::vector<float> normed_;    // [T, hidden]
  std::vector<float> qkv_;       // [T, (heads + 2 kv_heads) * head_dim]
  std::vector<float> q_, k_, v_; // [T, heads|kv_heads, head_dim]
  std::vector<float> attn_;      // [T, heads * head_dim]
  std::vector<float> proj_;      // [T, hidden]
  std::vector<float> gate_up_;   // [T, 2 * ffn]
  std::vector<float> act_;       // [T, ffn]
  std::vector<float> sampled_;   // [S, hidden]
  std::vector<float> local_logits_;     // tensor parallel: [S, vocab_stride]
  std::vector<float> gathered_logits_;  // tensor parallel: [tp_size, S, vocab_stride]
};

}  // namespace loom::worker
