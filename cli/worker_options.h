#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/paged_attention.h"
#include "model/kv_cache_budget.h"

namespace loom::common {
class GgufFile;
}
namespace loom::worker {
struct StepBackendOptions;
}

namespace loom::cli {

/// The `loom-worker` command line.
struct WorkerOptions {
  std::string model_path;                      // --model (required)
  std::string coordinator_address;             // --coordinator HOST:PORT (required)
  // --cluster-secret-file: the coordinator's (common/cluster_secret.h); empty:
  // LOOM_CLUSTER_SECRET, else none.
  std::string cluster_secret_file;
  std::string listen_address = "127.0.0.1:0";  // --listen HOST:PORT; port 0: any free port
  std::string advertise_address;               // --advertise-address; empty: listen host:bound port
  std::string replica_id = "replica-0";        // --replica-id
  // --role mixed|prefill|decode: what the coordinator places on this worker's replica
  // (disaggregated prefill and decode; every rank of a replica passes the same role).
  std::string role = "mixed";
  int32_t rank = 0;                            // --rank, in [0, world_size)
  int32_t world_size = 1;                      // --world-size: the replica's ranks
  // --pipeline-parallel-size: stages of world_size / P tensor-parallel ranks each; rank r
  // is tensor-parallel rank r % (world_size / P) of stage r / (world_size / P).
  int32_t pipeline_parallel_size = 1;
  // --pipeline-layer-partition L0,L1,...: layers per stage (vLLM's VLLM_PP_LAYER_PARTITION);
  // empty: as even as possible. Every stage of a replica must pass the same list.
  std::vector<int64_t> pipeline_layer_partition;
  // --rendezvous-id: namespaces the ranks' rendezvous keys on the coordinator; every rank
  // of one replica incarnation passes the same id, a restarted group a new one.
  std::string rendezvous_id = "0";
  int rendezvous_timeout_ms = 300000;          // --rendezvous-timeout-ms, also collectives
  std::string step_backend = "model";          // --step-backend model|noop (--noop-engine)
  // --device cuda|cpu|auto: where the model runs (backend cpu); auto picks cuda when a
  // CUDA device is present and the options allow it (ResolveDevice).
  std::string device = "auto";
  bool cuda_graphs = true;                     // --[no-]cuda-graphs (CUDA decode steps)
  // --max-num-batched-tokens: the most tokens one plan computes (the coordinator's flag),
  // for which the CUDA runner reserves its activations before sizing the KV pool.
  int64_t max_num_batched_tokens = 2048;
  // --gpu-index N (cuda): the CUDA device this worker runs on, an index among the visible
  // ones (after CUDA_VISIBLE_DEVICES); -1: its rank modulo the visible device count.
  int gpu_index = -1;
  int num_threads = 0;                         // --threads; 0: hardware concurrency
  std::optional<int64_t> kv_cache_bytes;       // --kv-cache-memory SIZE
  std::optional<double> kv_cache_fraction;     // --kv-cache-fraction F, of MemAvailable
  int64_t kv_offload_bytes = 0;                // --kv-offload-memory SIZE: the host KV tier
  // --[no-]kv-shared-memory: other workers of this machine may map the host tier (KV
  // hand-offs pushed into it or pulled from it); off: they go over TCP.
  bool kv_shared_memory = true;
  // --kv-pool-shared-memory (cpu): the KV pool lives in a memory file other workers of this
  // machine copy blocks straight out of (pool-to-pool transfers; CUDA pools share by IPC).
  bool kv_pool_shared_memory = false;
  // --gpu-memory-utilization U (cuda): the share of the device's total memory the worker
  // may use, weights included (vLLM's meaning); the KV pool gets what is left of it.
  std::optional<double> gpu_memory_utilization;
  // --max-model-len: the worker refuses to start unless its KV pool holds one sequence of
  // this many tokens; 0: no such check.
  int64_t max_model_len = 0;
  int64_t block_size = 16;                     // --block-size, tokens per KV block
  kernels::cpu::KvDtype kv_dtype = kernels::cpu::KvDtype::kF16;  // --kv-dtype / --kv-cache-dtype
  // Neither flag given, or --kv-dtype / --kv-cache-dtype auto: kv_dtype becomes
  // worker::ResolveKvDtype's once the device is known.
  bool kv_dtype_auto = true;
  // --quantization int8|int4: the linear layers quantized at load (loom quantize's
  // round-to-nearest, default group sizes); fp8: quantized to FP8 E4M3 on upload to a CUDA
  // device with FP8 tensor cores (StepBackendOptions::fp8_weights); "" serves the weights
  // as stored (an FP8 checkpoint's per-tensor or per-channel layers on the FP8 GEMM where the
  // GPU has one: StepBackendOptions::fp8_checkpoints).
  std::string quantization;
  // --activations f32|int8: how the CPU backend's INT8/INT4 layers take their input.
  kernels::cpu::ActivationPrecision activations = kernels::cpu::ActivationPrecision::kF32;
  // --drain-timeout-s: on SIGTERM, how long the worker waits for the coordinator to drain
  // its replica (requests in flight finish; none is placed on it) before it stops.
  int drain_timeout_s = 30;
  int metrics_port = -1;  // --metrics-port; -1: no metrics endpoint, 0: any free port
  // --draft-model: a GGUF with the target's vocabulary that proposes speculative drafts
  // (DraftProposer); empty: n-gram prompt lookup.
  std::string draft_model_path;
  // Test-only hooks of the step executor (StepExecutorOptions): --debug-step-delay-ms
  // sleeps in every step while reporting progress; --debug-hang-at-step N (1-based, 0: off)
  // stops the Nth step's progress for good.
  int64_t debug_step_delay_ms = 0;
  int64_t debug_hang_at_step = 0;
  // Test-only: --debug-kv-pool-unreadable refuses every pool-to-pool transfer into this worker
  // as one that cannot open the source's pool would (no GPU peer access, say).
  bool debug_kv_pool_unreadable = false;
};

/// Declares the worker's flags on `app`, bound to `options` (`loom-worker` declares them
/// all; `loom up` declares them too and forwards those set, so a flag added here reaches
/// `loom up` without edits). A flag whose name `app` already has is left to that
/// declaration, and so is one named in `skip` (without dashes). Returns every worker
/// flag's name (without dashes), declared here or not.
std::vector<std::string> AddWorkerFlags(CLI::App& app, WorkerOptions& options,
                                        const std::set<std::string>& skip = {});

/// `--kv-dtype auto|f16|bf16|f32|int8|fp8_e4m3` (with vLLM's `--kv-cache-dtype` beside it) and
/// `--activations f32|int8|bf16`, one declaration each for every command that runs the engine
/// (loom-worker, loom generate, loom perplexity). `kv_dtype_auto` turns false when a type
/// other than `auto` is given.
CLI::Option* AddKvDtypeFlag(CLI::App& app, kernels::cpu::KvDtype& kv_dtype, bool& kv_dtype_auto);
CLI::Option* AddActivationsFlag(CLI::App& app, kernels::cpu::ActivationPrecision& activations);

/// The checks across flags: --model and --coordinator given, one KV budget at most.
absl::Status CheckWorkerOptions(const WorkerOptions& options);

/// Parses argv[1..argc) into options (no printing); InvalidArgument with the one-line
/// message for an unknown flag, a malformed value, or a missing required flag.
absl::StatusOr<WorkerOptions> ParseWorkerFlags(int argc, const char* const* argv);

/// Bytes from "536870912", "512MiB", "1.5G", "64K"...: suffixes B, K/KB/KiB, M/MB/MiB,
/// G/GB/GiB, T/TB/TiB (case-insensitive), all powers of 1024. InvalidArgument when
/// malformed, negative or above 2^62.
absl::StatusOr<int64_t> ParseByteSize(absl::string_view text);

/// Splits "host:port" or "[v6]:port" at the last colon; InvalidArgument without a
/// numeric port in [0, 65535] or with an empty host.
absl::StatusOr<std::pair<std::string, int>> SplitHostPort(absl::string_view address);

/// MemAvailable from /proc/meminfo, in bytes (model/kv_cache_budget.h).
using model::MemAvailableBytes;

/// The device a --device value (cuda|cpu|auto) means on a machine with
/// `cuda_device_count` CUDA devices: "cuda" or "cpu". auto is cuda when a device is present,
/// the KV dtype is f16 (the CUDA forward pass has no f32 KV) and `world_size` is 1, else cpu:
/// tensor parallelism on CUDA (ranks joined by NCCL) is asked for with --device cuda.
/// FailedPrecondition naming the reason for cuda on a machine without a usable device;
/// InvalidArgument for cuda with options the CUDA forward pass does not support, or an unknown
/// value. Used by `loom-worker`, `loom up` and `loom generate`.
absl::StatusOr<std::string> ResolveDevice(absl::string_view device, kernels::cpu::KvDtype kv_dtype,
                                          int world_size, int cuda_device_count);

/// The CUDA device (an index among the `cuda_device_count` visible ones) rank `rank` of a
/// tensor-parallel group runs on: `gpu_index` when not -1 (FailedPrecondition when there is
/// no such device), else `rank` modulo the device count. Two ranks of one group on one GPU
/// (more ranks than devices) is allowed here; NCCL may refuse it at connect time.
absl::StatusOr<int> ResolveGpuIndex(int gpu_index, int rank, int cuda_device_count);

/// What --quantization does to a loaded model, for `loom-worker` and `loom perplexity` alike:
/// int8/int4 give `gguf` quantized in memory (quant::QuantizeInMemory, round to nearest);
/// fp8 (quantized as the GPU uploads it) and "" (as stored) give it back unchanged.
absl::StatusOr<std::unique_ptr<common::GgufFile>> QuantizeAsFlagged(
    absl::string_view quantization, std::unique_ptr<common::GgufFile> gguf);
/// --quantization's part in the backend: fp8 asks for FP8 weights; "" serves an FP8
/// checkpoint's layers as stored (on the FP8 GEMM where the GPU has one).
void SetFp8Weights(absl::string_view quantization, worker::StepBackendOptions& backend);

/// The CPU KV pool's byte budget: --kv-cache-memory, else --kv-cache-fraction of
/// MemAvailable, else 512 MiB (model::HostKvBudgetBytes). On CUDA the fraction is of the
/// device's free memory (model::DeviceKvBlocks).
absl::StatusOr<int64_t> KvCacheBudgetBytes(const WorkerOptions& options);

}  // namespace loom::cli
