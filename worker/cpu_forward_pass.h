#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/formats/gguf_file.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/paged_attention.h"
#include "kernels/cpu/thread_pool.h"
#include "model/communicator.h"
#include "model/cpu_device.h"
#include "model/llama_graph.h"
#include "model/model_weights.h"
#include "worker/forward_pass.h"
#include "worker/pipeline_link.h"
#include "worker/step_batch.h"
#include "worker/step_progress.h"

namespace loom::worker {

struct CpuForwardPassOptions {
  int num_threads = 2;
  int64_t num_kv_blocks = 1024;  // pool size; the coordinator sizes it from a memory budget
  int64_t block_size = 16;
  kernels::cpu::KvDtype kv_dtype = kernels::cpu::KvDtype::kF16;
  bool share_kv_pool = false;  // the pool in a memory file (model::CpuKvCache::Create)
  // How linear layers over INT8/INT4 weights (the LM head included) meet their input:
  // exact F32, or quantized to int8 per 32 values with integer dot products (VNNI where the
  // CPU has it; llama.cpp's CPU scheme). Float weights always use F32. Either choice is
  // applied to every step alike, so a sequence's logits never depend on its batch.
  kernels::cpu::ActivationPrecision activations = kernels::cpu::ActivationPrecision::kF32;
  // Tensor parallelism: this forward pass holds rank tp_rank's slice of the model and joins
  // the others through `communicator` (not owned; required when tp_size > 1). Every
  // rank runs every step with the same batch; all of them return the full logits.
  int tp_rank = 0;
  int tp_size = 1;
  model::Communicator* communicator = nullptr;
  // Pipeline parallelism: this forward pass holds stage pp_stage's layers of pp_size and
  // passes the residual stream through `link` (not owned; required when pp_size > 1). Only
  // the last stage returns logits.
  int pp_stage = 0;
  int pp_size = 1;
  std::vector<int64_t> pp_layers;  // layers per stage (model::Parallelism::stage_layers)
  PipelineLink* link = nullptr;
  // The thread pool to run on, shared with another forward pass that never steps at the same
  // time (a draft model beside its target, so the two do not keep two sets of spinning
  // threads); null: a pool of its own with num_threads threads.
  std::shared_ptr<kernels::cpu::ThreadPool> thread_pool;
  // Advanced twice per layer of every Step (after attention, after the FFN) so the worker's
  // heartbeat can show a long step progressing (not owned; null: not reported).
  StepProgress* progress = nullptr;
};

/// The CPU worker's forward pass: the model graph (model::LlamaGraph) on the CPU device
/// (model::CpuDevice), behind ForwardPass: validates each step, hands it to the graph and
/// returns the sample rows' logits. Owns the graph (weights, KV pool, scratch). Not
/// thread-safe: one step at a time.
class CpuForwardPass : public ForwardPass {
 public:
  static absl::StatusOr<std::unique_ptr<CpuForwardPass>> Create(const common::GgufFile& gguf,
                                                             const CpuForwardPassOptions& options);

  /// Runs one step: writes the batch's K/V into its slots and returns the logits of
  /// `batch.sample_rows`, [sample_rows.size(), vocab] into `logits`. InvalidArgument
  /// (nothing computed, nothing written) for a batch ValidateStepBatch rejects.
  absl::Status Step(const StepBatch& batch, std::vector<float>& logits) override;
  bool returns_hidden() const override { return true; }
  absl::Status StepWithHidden(const StepBatch& batch, std::vector<float>& logits,
                              std::vector<float>& hidden) override;
  bool returns_logits() const override { return graph_->shard().last_stage(); }
  void SkipStep(uint64_t step_id, const absl::Status& why) override;
  bool SetHalfLayerObserver(std::function<void()> observer) override {
    half_layer_observer_ = std::move(observer);
    return true;
  }
  ForwardPassStats stats() const override {
    ForwardPassStats stats;
    if (link_ != nullptr) stats.pipeline_wait_seconds = link_->wait_seconds();
    return stats;
  }

  const common::ModelConfig& config() const override { return graph_->config(); }
  /// The host weights the CPU device computes on.
  const model::ModelWeights& weights() const { return *graph_->host_weights(); }
  const model::KvCache& kv_cache() const { return graph_->kv_cache(); }
  const model::KvCache* kv_pool() const override { return &graph_->kv_cache(); }
  int64_t block_size() const override { return graph_->kv_cache().block_size(); }
  int64_t num_kv_blocks() const override { return graph_->kv_cache().num_blocks(); }
  int num_threads() const { return device_->thread_pool()->num_threads(); }
  /// The pool Step runs on (to share with a draft model's forward pass, see CpuForwardPassOptions).
  const std::shared_ptr<kernels::cpu::ThreadPool>& thread_pool() const {
    return device_->thread_pool();
  }
  /// Installs (or, with nullptr, removes) an observer of every linear layer's input;
  /// none by default, and then Step pays nothing for it.
  void SetActivationObserver(model::ActivationObserver observer) {
    device_->SetActivationObserver(std::move(observer));
  }

 private:
  CpuForwardPass() = default;
  // RunStep for the step `batch` names, a failure passed on to the pipeline's neighbours.
  absl::Status TrackedStep(const StepBatch& batch, std::vector<float>& logits,
                           std::vector<float>* hidden);
  // `hidden`, when not null, receives the sample rows' final hidden states.
  absl::Status RunStep(const StepBatch& batch, std::vector<float>& logits,
                       std::vector<float>* hidden);
  // A failed step of a pipeline stage: takes the predecessor's message if the step did not,
  // and passes the failure on if it sent nothing (PipelineLink's contract).
  void FinishFailedStep(uint64_t step_id, const absl::Status& why);

  std::unique_ptr<model::LlamaGraph> graph_;
  std::function<void()> half_layer_observer_;  // SetHalfLayerObserver's; empty: none
  model::CpuDevice* device_ = nullptr;  // the graph's
  PipelineLink* link_ = nullptr;        // pipeline parallelism; null: one stage
  // The step being run, and whether it took its predecessor's message and sent its own.
  uint64_t step_id_ = 0;
  bool received_ = false;
  bool sent_ = false;
};

}  // namespace loom::worker
