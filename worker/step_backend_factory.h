#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/formats/gguf_file.h"
#include "common/formats/model_config.h"
#include "kernels/cpu/kv_dtype.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/paged_attention.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cuda/types.h"
#include "model/communicator.h"
#include "model/kv_cache_budget.h"
#include "worker/cpu_forward_pass.h"
#include "worker/cuda_forward_pass.h"
#include "worker/pipeline_link.h"
#include "worker/step_backend.h"
#include "worker/step_progress.h"

namespace loom::worker {

/// What CreateStepBackend builds: the model on a device, or the noop backend. The one
/// place that turns a model file and these choices into a StepBackend, for `loom-worker`
/// and the in-process engine of `loom generate`, `loom perplexity` and the benchmarks.
struct StepBackendOptions {
  std::string kind = "model";  // "model" (the model runs) or "noop" (no math)
  std::string device = "cpu";  // kind model: "cpu" or "cuda" (ResolveDevice's answer)
  // KV pool in blocks of block_size tokens. CUDA: when 0, kv_memory_fraction of the device
  // memory left after the weights.
  int64_t num_kv_blocks = 0;
  int64_t block_size = 16;
  double kv_memory_fraction = model::kDefaultDeviceKvFraction;
  // CUDA: when > 0, the KV pool takes what brings the device's use to this fraction of its
  // total memory (vLLM's --gpu-memory-utilization) instead of kv_memory_fraction.
  double gpu_memory_utilization = 0;
  // CPU forward pass: threads, KV element type, how INT8/INT4 layers take their input.
  int num_threads = 2;
  kernels::cpu::KvDtype kv_dtype = kernels::cpu::KvDtype::kF16;
  kernels::cpu::ActivationPrecision activations = kernels::cpu::ActivationPrecision::kF32;
  // --kv-pool-shared-memory: the CPU pool lives in a memory file other workers of this
  // machine copy blocks out of (worker/kv_pool_transfer; CUDA pools share through IPC).
  bool share_kv_pool = false;
  // --quantization fp8: FP8 E4M3 weights on the GPU's FP8 tensor cores (CUDA only: the CPU
  // refuses it).
  bool fp8_weights = false;
  // An FP8 checkpoint (per-tensor or per-channel scales) served as stored (no --quantization):
  // on a CUDA device with FP8 tensor cores its layers run the FP8 GEMM with the checkpoint's own
  // codes and scales; elsewhere their values dequantized to F16, as without it.
  bool fp8_checkpoints = false;
  bool cuda_graphs = true;  // CUDA: capture decode steps as graphs
  // CUDA: the most tokens one step computes (the coordinator's --max-num-batched-tokens):
  // the runner reserves activations for them before sizing the KV pool.
  int64_t max_num_tokens = 2048;
  int gpu_index = 0;        // CUDA: the device (an index after CUDA_VISIBLE_DEVICES)
  // CUDA: a draft model loaded on the device first (CudaForwardPassOptions' fields of the
  // same names): its KV block bytes and device memory, set aside when the pool is sized.
  int64_t draft_kv_bytes_per_block = 0;
  int64_t draft_device_bytes = 0;
  bool startup_lock_held = false;  // CUDA: the caller holds the device's start-up lock
  // Tensor parallelism: this rank of tp_size, joined through `communicator` (not owned;
  // required when tp_size > 1): gloo on the CPU, NCCL (worker/nccl_communicator) on CUDA.
  int tp_rank = 0;
  int tp_size = 1;
  model::Communicator* communicator = nullptr;
  // Pipeline parallelism (CPU): stage pp_stage of pp_size, its residual stream through
  // `link` (not owned; required when pp_size > 1).
  int pp_stage = 0;
  int pp_size = 1;
  std::vector<int64_t> pp_layers;  // layers per stage; empty: as even as possible
  PipelineLink* link = nullptr;
  // The CPU forward pass's thread pool when shared (with a draft model); null: its own.
  std::shared_ptr<kernels::cpu::ThreadPool> thread_pool;
  // Where the CPU forward pass counts its layers (not owned; null: nowhere).
  StepProgress* progress = nullptr;
};

/// The type the CUDA forward pass computes in for `gguf`: BF16 when the checkpoint stores any of
/// its matrices in BF16 (its activations may exceed F16's 65504) or is a Gemma model (whose
/// activations do, whatever its weights' format), else F16 (F16, F32 and quantized
/// checkpoints), as vLLM's `--dtype auto`.
kernels::cuda::DataType CudaComputeDtype(const common::GgufFile& gguf);

/// The CPU forward pass's options for `options` (threads, KV pool, activations,
/// parallelism): the target model's and a draft model's alike.
CpuForwardPassOptions CpuForwardPassOptionsOf(const StepBackendOptions& options);

/// The CUDA forward pass's options for `options` over `gguf` (the compute and KV types from
/// the checkpoint and --kv-dtype): the target model's and a draft model's alike.
/// InvalidArgument for a KV dtype the CUDA kernels do not read (f32).
absl::StatusOr<CudaForwardPassOptions> CudaForwardPassOptionsOf(const StepBackendOptions& options,
                                                                const common::GgufFile& gguf);

/// vLLM's `auto` KV type (`kv_dtype_auto`: neither --kv-dtype nor --kv-cache-dtype given, or
/// --kv-cache-dtype auto), the compute type's: on the cpu bf16 under --activations bf16 (what
/// its AMX attention reads without converting, rounded once where F16 KV rounds twice, and
/// F32's range), else f16; on cuda f16, which the backend keeps in BF16 for a BF16 model
/// (KvPoolDtypeName). `kv_dtype` as it is otherwise.
kernels::cpu::KvDtype ResolveKvDtype(kernels::cpu::KvDtype kv_dtype, bool kv_dtype_auto,
                                     std::string_view device,
                                     kernels::cpu::ActivationPrecision activations);

/// What the KV pool of `backend_name` ("cuda", "cpu", "noop") over `gguf` holds, by name
/// (RegisterRequest.kv_dtype: replicas move KV between each other only when it agrees):
/// kv_dtype's name, except that a CUDA pool of 16-bit rows is BF16 where the model computes
/// in BF16 (the CPU's 16-bit pool is what its type says: F16 or BF16, the same size, other bits).
std::string KvPoolDtypeName(std::string_view backend_name, kernels::cpu::KvDtype kv_dtype,
                            const common::GgufFile& gguf);

/// Builds the backend `options` names over `gguf` (whose config is `config`): weights
/// loaded and KV pool allocated, or the noop backend (config only). `load_log`, when not
/// null, receives what loading did to the weights (one line per tensor format), for the
/// caller to print. The error of the forward pass's Create otherwise.
absl::StatusOr<std::unique_ptr<StepBackend>> CreateStepBackend(const StepBackendOptions& options,
                                                               const common::GgufFile& gguf,
                                                               const common::ModelConfig& config,
                                                               std::string* load_log = nullptr);

}  // namespace loom::worker
