#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "common/formats/gguf_file.h"
#include "common/formats/model_config.h"
#include "kernels/cuda/kv_cache.h"
#include "kernels/cuda/types.h"
#include "model/communicator.h"
#include "model/kv_cache_budget.h"
#include "worker/decode_batch_shape.h"
#include "worker/device_startup_lock.h"
#include "worker/forward_pass.h"
#include "worker/pipeline_link.h"
#include "worker/step_batch.h"

namespace loom::worker {

struct CudaForwardPassOptions {
  int device = 0;  // CUDA device index (after CUDA_VISIBLE_DEVICES)
  // KV pool size in blocks; 0: kv_memory_fraction of the device memory still free once
  // the weights, activations and workspaces are allocated.
  int64_t num_kv_blocks = 0;
  double kv_memory_fraction = model::kDefaultDeviceKvFraction;  // in (0, 1]; num_kv_blocks 0
  // In (0, 1] when set: used instead of kv_memory_fraction, the pool takes what is left of
  // this fraction of the device's TOTAL memory once this forward pass's own weights, activations
  // and workspaces are in (vLLM's --gpu-memory-utilization; what other processes on the
  // GPU hold does not count against it, so workers can split a GPU); 0: unset.
  double gpu_memory_utilization = 0;
  int64_t block_size = 16;          // tokens per KV block, in [1, 1024]
  // Weights and GEMM inputs: F16 or BF16 (activations between operations are F32, F32
  // accumulation in every GEMM and kernel).
  kernels::cuda::DataType dtype = kernels::cuda::DataType::kF16;
  // KV pool: F16 or BF16, equal to dtype (with kv_quant the type its codes dequantize to).
  kernels::cuda::DataType kv_dtype = kernels::cuda::DataType::kF16;
  // 8-bit KV (--kv-cache-dtype int8|fp8_e4m3): codes and a BF16 scale per token and KV
  // head, as the CPU pool stores them (kernels/cuda/kv_cache.h); head_dim 64 or 128.
  kernels::cuda::KvQuant kv_quant = kernels::cuda::KvQuant::kNone;
  // Quantized layer weights stay quantized in device memory (model::CudaDevice's
  // keep_quantized): INT4 (GGUF Q4_0/Q4_1, Q4_K/Q3_K/Q2_K with their scales rounded to F16,
  // `loom quantize --format int4`) through the W4A16 GEMM (kernels/cuda/quantized_gemm),
  // INT8 (Q8_0, IQ4_NL, Q6_K, Q5_K, Q5_0/Q5_1 as INT8, per channel) through the W8A16 GEMM,
  // and an untied LM head where that holds its values exactly; false, or odd shapes:
  // dequantized to dtype at load for cuBLAS.
  bool quantized_weights = true;
  // --quantization fp8: linear layers quantized at load to FP8 E4M3 with per-channel scales
  // and run on the FP8 tensor cores (model::CudaDeviceOptions::fp8_weights; compute
  // capability 8.9+, refused below).
  bool fp8_weights = false;
  // The model is an FP8 checkpoint whose layers carry their row scales (common::
  // HasFp8RowScales): they run the FP8 GEMM with the checkpoint's codes where the device has
  // FP8 tensor cores (as fp8_weights), else as F16 (never refused).
  bool fp8_checkpoint = false;
  // Capture decode steps (every sequence one query token, at most 256 sequences) as CUDA
  // graphs per batch-size bucket and replay them; off: every step runs eagerly.
  bool cuda_graphs = true;
  // Activations are allocated for this many tokens per step before the KV pool takes its
  // share of free memory; a larger step grows them (and may then run out of memory).
  int64_t max_num_tokens = 2048;
  // A draft model's forward pass on this device, loaded first with a one-block pool
  // (worker/draft_model): the bytes each of its KV blocks takes and the device memory it
  // holds. A pool sized from memory leaves room for the draft's pool of as many blocks
  // (model::DeviceKvBudget's companion). 0: no draft.
  int64_t draft_kv_bytes_per_block = 0;
  int64_t draft_device_bytes = 0;
  // The caller holds this device's start-up lock (AcquireStartupLock) across several
  // forward passes (a draft, its target, the draft's resize): Create takes none itself.
  bool startup_lock_held = false;
  // Tensor parallelism: this forward pass holds rank tp_rank's slice of the model (ShardPlan)
  // and joins the others through `communicator` (not owned; required when tp_size > 1,
  // optional at 1), which goes to the CUDA device (model::CudaDeviceOptions). Every rank
  // runs every step with the same batch. CUDA graphs are off with tp_size > 1.
  int tp_rank = 0;
  int tp_size = 1;
  model::Communicator* communicator = nullptr;
  // Pipeline parallelism: this forward pass holds stage pp_stage's layers of pp_size and
  // passes the residual stream through `link` (not owned; required when pp_size > 1),
  // staged through host memory (the link is gloo over TCP, as between CPU stages); only
  // the last stage returns logits. CUDA graphs are off on stages (a step waits for its
  // neighbours on the host).
  int pp_stage = 0;
  int pp_size = 1;
  std::vector<int64_t> pp_layers;  // layers per stage (model::Parallelism::stage_layers)
  PipelineLink* link = nullptr;
  // Tests only: every CUDA graph capture fails, as a driver refusal would (the eager
  // fallback's path).
  bool debug_fail_graph_captures = false;
};

/// The CUDA worker's forward pass: the model graph (model::LlamaGraph, the same code the
/// CPU forward pass runs) on the CUDA device (model::CudaDevice: F16/BF16 weights in device
/// memory, cuBLAS and the kernels of kernels/cuda, one stream), behind ForwardPass. What
/// is CUDA-forward pass specific lives here: validation, KV pool sizing from free memory,
/// decode steps padded to batch-size buckets and replayed as CUDA graphs per (batch
/// bucket, context bucket) (model::CudaGraphCache), on-device sampling, and the guard below.
///
/// Quantized layer weights (INT4, INT5, INT8) stay quantized for the W4A16/W8A16 GEMM
/// (options.quantized_weights); other weights are dequantized on the host at load. Steps
/// with multi-token sequences run eagerly, attention through the paged prefill kernel.
///
/// Every CUDA error is a Status naming the call; after one (other than a rejected batch
/// or an allocation that did not fit) the forward pass refuses every later step rather than
/// risk wrong results. Not thread-safe: one step at a time (from any thread).
class CudaForwardPass : public ForwardPass {
 public:
  /// Loads the weights onto options.device, allocates activations and the KV pool.
  /// FailedPrecondition when Loom was built without CUDA or there is no such device;
  /// InvalidArgument for options or a model the CUDA kernels cannot run (head dims other
  /// than 64 and 128, a tensor-parallel rank without a matching communicator, ...).
  static absl::StatusOr<std::unique_ptr<CudaForwardPass>> Create(
      const common::GgufFile& gguf, const CudaForwardPassOptions& options);

  /// A forward pass for `config` with random weights generated on the device (no host copy:
  /// for benchmarks of full-size models; model::LlamaGraph::CreateRandom): every matrix
  /// dense in options.dtype (INT4 is not used), uniform in +-1/sqrt(fan_in) from a hash of
  /// (seed, element), RMSNorm weights 1. The same seed gives the same weights. Errors as
  /// Create's, plus InvalidArgument for an inconsistent config or tp_size > 1.
  static absl::StatusOr<std::unique_ptr<CudaForwardPass>> CreateRandom(
      const common::ModelConfig& config, const CudaForwardPassOptions& options, uint64_t seed);

  /// The start-up lock of CUDA device `device` (worker/device_startup_lock: other workers on
  /// the GPU wait while this process measures and allocates), for a caller that creates
  /// several forward passes under it (CudaForwardPassOptions::startup_lock_held); null
  /// without CUDA.
  static std::unique_ptr<DeviceStartupLock> AcquireStartupLock(int device);

  /// Bytes one KV block takes in the pool (K and V of every layer; for a tensor-parallel
  /// rank pass its model::LocalConfig).
  static int64_t KvBytesPerBlock(const common::ModelConfig& config, int64_t block_size,
                                 kernels::cuda::DataType kv_dtype,
                                 kernels::cuda::KvQuant kv_quant = kernels::cuda::KvQuant::kNone);

  ~CudaForwardPass() override;

  /// Runs one step (see ForwardPass::Step); logits come back as F32. InvalidArgument (nothing
  /// touched) for a batch ValidateStepBatch rejects; FailedPrecondition once an earlier
  /// device error made the forward pass unusable.
  absl::Status Step(const StepBatch& batch, std::vector<float>& logits) override;
  bool returns_logits() const override;
  void SkipStep(uint64_t step_id, const absl::Status& why) override;
  /// Step, then the sample rows' tokens picked on the device (kernels/cuda/sampling):
  /// only token ids and their logprobs are copied back, not [rows, vocab] logits (except
  /// the rows.logits_rows the host samples). Greedy rows pick exactly the CPU sampler's
  /// argmax; sampled rows draw from the same distribution with the device's own random
  /// stream keyed by (seed, position).
  bool samples_on_device() const override { return true; }
  absl::Status StepAndSample(const StepBatch& batch, const DeviceSampleRows& rows,
                             std::vector<int32_t>& tokens, std::vector<float>& logprobs,
                             std::vector<float>& logits) override;

  const common::ModelConfig& config() const override { return config_; }
  int64_t num_kv_blocks() const override { return num_kv_blocks_; }
  int64_t block_size() const override { return block_size_; }
  const model::KvCache* kv_pool() const override;

  /// The device memory this forward pass took (weights, activations, workspaces, KV pool),
  /// measured when it was created.
  int64_t device_bytes() const;
  /// Replaces the KV pool by an empty one of `num_blocks` blocks (+1 scratch block): a
  /// draft model's pool, made to mirror its target's once that one is sized. Only before
  /// the first step (FailedPrecondition after: captured graphs hold the old pool);
  /// ResourceExhausted when it does not fit, leaving the forward pass without a pool.
  absl::Status ResizeKvPool(int64_t num_blocks);
  /// One line per weight conversion, then the device, memory and graph settings.
  const std::string& load_log() const { return load_log_; }

  /// How steps ran so far (for tests and logs).
  using Stats = ForwardPassStats;
  Stats stats() const override;

 private:
  struct State;  // the graph, its device, graphs and sampling buffers (CUDA builds only)
  explicit CudaForwardPass(std::unique_ptr<State> state);
  // The tail Create and CreateRandom share once the graph's weights are on the device:
  // activations and the device's buffers reserved, the KV pool sized from the memory
  // left, the load log's device line.
  static absl::StatusOr<std::unique_ptr<CudaForwardPass>> Finish(
      std::unique_ptr<State> state, const CudaForwardPassOptions& options, std::string load_log);
  // What Step and StepAndSample share around `run`: refusing once the forward pass is broken,
  // validating `batch`, selecting the device, and marking the forward pass broken when `run`
  // fails in a way that may have left the device half-written (anything but
  // ResourceExhausted, nothing enqueued, and InvalidArgument, inputs refused).
  absl::Status Guarded(const StepBatch& batch, absl::FunctionRef<absl::Status()> run);

  std::unique_ptr<State> state_;
  common::ModelConfig config_;
  int64_t num_kv_blocks_ = 0;  // blocks the coordinator may use (the pool has one more)
  int64_t block_size_ = 0;
  std::string load_log_;
};

}  // namespace loom::worker
