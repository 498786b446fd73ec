#include "cli/worker_command.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/strings/str_format.h"
#include "cli/command_line.h"
#include "cli/worker_options.h"
#include "common/cluster_secret.h"
#include "common/formats/gguf_file.h"
#include "common/formats/hf_model.h"
#include "common/formats/model_config.h"
#include "common/formats/model_fingerprint.h"
#include "common/grammar/grammar_matcher_factory.h"
#include "common/status_macros.h"
#include "common/tokenizer/tokenizer.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cuda_device.h"
#include "model/cpu_kv_cache.h"
#include "model/kv_cache_budget.h"
#include "model/kv_layout.h"
#include "worker/communicator_factory.h"
#include "worker/cpu_forward_pass.h"
#include "worker/draft_model.h"
#include "worker/kv_pool_transfer.h"
#include "worker/kv_transfer.h"
#include "worker/pipeline_link.h"
#include "worker/registration.h"
#include "worker/step_backend_factory.h"
#include "worker/step_executor.h"
#include "worker/step_progress.h"
#include "worker/worker_metrics.h"
#include "worker/worker_server.h"

#ifndef LOOM_VERSION
#define LOOM_VERSION "dev"
#endif

namespace loom::cli {

using worker::KvHostTier;
using worker::StepProgress;

using worker::AdvertiseHost;
using worker::CommunicatorOptions;
using worker::ConnectCommunicator;
using worker::CreateStepBackend;
using worker::CudaDraft;
using worker::DraftModel;
using worker::FinishCudaDraft;
using worker::LoadCudaDraft;
using worker::LoadDraftModel;
using worker::PipelineLink;
using worker::RegistrationOptions;
using worker::StepBackend;
using worker::StepBackendOptions;
using worker::StepExecutor;
using worker::StepExecutorOptions;
using worker::WorkerMetrics;
using worker::WorkerServer;
namespace {

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "loom-worker: %s\n", status.ToString().c_str());
  return 1;
}

int UsageError(const std::string& message) {
  std::fprintf(stderr, "loom-worker: error: %s (usage: loom-worker --help)\n", message.c_str());
  return 2;
}

// A refusal before the worker starts: a command line that cannot work (InvalidArgument) is
// a usage error, anything else (no usable GPU, no MemAvailable) a failure.
int Refuse(const absl::Status& status) {
  if (status.code() == absl::StatusCode::kInvalidArgument) {
    return UsageError(std::string(status.message()));
  }
  return Fail(status);
}

sigset_t ShutdownSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}

// The checks across flags that need nothing loaded (InvalidArgument); fills in the default
// thread count.
absl::Status CheckCommandLine(WorkerOptions& options) {
  LOOM_RETURN_IF_ERROR(CheckWorkerOptions(options));
  if (options.world_size > 1 && options.step_backend != "model") {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--world-size %d needs --step-backend model", options.world_size));
  }
  if (options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--rank %d is outside [0, %d)", options.rank, options.world_size));
  }
  if (options.world_size % options.pipeline_parallel_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--world-size %d is not a multiple of --pipeline-parallel-size %d",
                        options.world_size, options.pipeline_parallel_size));
  }
  if (options.pipeline_parallel_size > 1 && options.step_backend != "model") {
    return absl::InvalidArgumentError("--pipeline-parallel-size needs --step-backend model");
  }
  if (options.num_threads == 0) {
    options.num_threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  }
  return absl::OkStatus();
}

// Where the worker sits in its replica's tensor x pipeline grid.
model::Parallelism ParallelismOf(const WorkerOptions& options) {
  const int tp_size = options.world_size / options.pipeline_parallel_size;
  return {options.rank % tp_size, tp_size, options.rank / tp_size, options.pipeline_parallel_size,
          options.pipeline_layer_partition};
}

// Where the model runs, decided before anything is loaded.
struct Placement {
  std::string device = "cpu";  // "cpu" or "cuda"
  int gpu_index = 0;           // cuda: the device, an index among the visible ones
  bool cuda() const { return device == "cuda"; }
};

// The device of --device (cuda on a machine without a usable GPU fails here with the
// reason) and the GPU of a CUDA worker: --gpu-index, else the rank modulo the visible
// devices. InvalidArgument for flags the placement cannot take.
absl::StatusOr<Placement> PlaceWorker(const WorkerOptions& options) {
  Placement placement;
  if (options.step_backend == "model") {
    LOOM_ASSIGN_OR_RETURN(placement.device,
                          ResolveDevice(options.device, options.kv_dtype, options.world_size,
                                        kernels::CudaDeviceCount()));
  }
  if (placement.cuda()) {
    LOOM_ASSIGN_OR_RETURN(placement.gpu_index, ResolveGpuIndex(options.gpu_index, options.rank,
                                                               kernels::CudaDeviceCount()));
  }
  if (options.gpu_memory_utilization.has_value() && !placement.cuda() &&
      options.step_backend == "model") {
    return absl::InvalidArgumentError(
        "--gpu-memory-utilization sizes a CUDA device's memory; this worker runs on the cpu "
        "(use --kv-cache-memory or --kv-cache-fraction)");
  }
  // The draft runs on the target's device beside one whole copy of the target.
  if (!options.draft_model_path.empty() &&
      (options.step_backend != "model" || options.world_size > 1)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--draft-model needs the model runner on one rank (--step-backend model --world-size "
        "1), got --step-backend %s on %s with --world-size %d",
        options.step_backend, placement.device, options.world_size));
  }
  return placement;
}

// The model as served.
struct ServedModel {
  std::unique_ptr<common::GgufFile> gguf;  // quantized in memory with --quantization
  common::ModelConfig config;
  // Of the model source, so the coordinator (which reads the same source unquantized)
  // still recognizes the worker.
  std::string fingerprint;
};

absl::StatusOr<ServedModel> LoadModel(const WorkerOptions& options) {
  ServedModel model;
  LOOM_ASSIGN_OR_RETURN(model.gguf, common::OpenModelFile(options.model_path));
  LOOM_ASSIGN_OR_RETURN(model.config, common::ModelConfigFromGguf(*model.gguf));
  model.fingerprint = common::ModelFingerprint(*model.gguf);
  LOOM_ASSIGN_OR_RETURN(model.gguf, QuantizeAsFlagged(options.quantization, std::move(model.gguf)));
  return model;
}

void PrintModel(const WorkerOptions& options, const ServedModel& model) {
  std::fprintf(stderr,
               "loom-worker: model %s (%s, vocab %lld, context %lld) from %s, fingerprint %s\n",
               model.config.name.c_str(), model.config.architecture.c_str(),
               static_cast<long long>(model.config.vocab_size),
               static_cast<long long>(model.config.context_length), options.model_path.c_str(),
               model.fingerprint.c_str());
}

// The KV pool as planned from the flags.
struct KvPool {
  model::KvBlockSpec block;
  int64_t num_blocks = 0;  // 0: the CUDA forward pass sizes the pool from free device memory
};

// A tensor-parallel rank keeps only its KV heads: its blocks are smaller. What does not
// divide is refused here (InvalidArgument), before meeting the other ranks. The KV budget
// sizes the pool, except on CUDA without --kv-cache-memory.
absl::StatusOr<KvPool> PlanKvPool(const WorkerOptions& options, const Placement& placement,
                                  const common::ModelConfig& config) {
  KvPool pool;
  LOOM_ASSIGN_OR_RETURN(pool.block,
                        model::ShardKvBlock(config, ParallelismOf(options), options.block_size,
                                            kernels::cpu::KvElementBytes(options.kv_dtype),
                                            kernels::cpu::KvDtypeName(options.kv_dtype),
                                            kernels::cpu::KvScaleBytes(options.kv_dtype)));
  if (!placement.cuda() || options.kv_cache_bytes.has_value()) {
    LOOM_ASSIGN_OR_RETURN(const int64_t budget, KvCacheBudgetBytes(options));
    LOOM_ASSIGN_OR_RETURN(pool.num_blocks, model::KvBlocksFromBudget(budget, pool.block));
  }
  return pool;
}

// The rendezvous fields every group of the replica shares.
CommunicatorOptions RendezvousOf(const WorkerOptions& options) {
  CommunicatorOptions communicator;
  // Tensor-parallel ranks meet once, at start, through the first coordinator named.
  communicator.coordinator_address =
      options.coordinator_address.substr(0, options.coordinator_address.find(','));
  communicator.replica_id = options.replica_id;
  communicator.rendezvous_id = options.rendezvous_id;
  communicator.timeout = std::chrono::milliseconds(options.rendezvous_timeout_ms);
  communicator.hostname = AdvertiseHost(SplitHostPort(options.listen_address)->first);
  return communicator;
}

// Tensor parallelism: meets the other ranks of its pipeline stage through the coordinator's
// rendezvous store, NCCL on CUDA and gloo on the CPU, the collectives' timeout
// --rendezvous-timeout-ms. Null on a single rank.
absl::StatusOr<std::unique_ptr<model::Communicator>> JoinRanks(const WorkerOptions& options,
                                                               const Placement& placement) {
  const model::Parallelism parallel = ParallelismOf(options);
  if (parallel.tp_size == 1) return std::unique_ptr<model::Communicator>();
  std::fprintf(
      stderr, "loom-worker: rank %d of %d%s: meeting the other ranks through %s\n",
      parallel.tp_rank, parallel.tp_size,
      placement.cuda() ? absl::StrFormat(" on GPU %d (NCCL)", placement.gpu_index).c_str() : "",
      options.coordinator_address.c_str());
  CommunicatorOptions communicator = RendezvousOf(options);
  // Each stage is a tensor-parallel group of its own.
  if (parallel.pp_size > 1) {
    communicator.replica_id = absl::StrFormat("%s/stage%d", options.replica_id, parallel.pp_stage);
  }
  communicator.rank = parallel.tp_rank;
  communicator.world_size = parallel.tp_size;
  communicator.cuda = placement.cuda();
  communicator.gpu_index = placement.gpu_index;
  return ConnectCommunicator(communicator);
}

// Pipeline parallelism: meets the same tensor-parallel rank of the other stages. Null
// with one stage.
absl::StatusOr<std::unique_ptr<PipelineLink>> JoinStages(const WorkerOptions& options) {
  const model::Parallelism parallel = ParallelismOf(options);
  if (parallel.pp_size == 1) return std::unique_ptr<PipelineLink>();
  std::fprintf(stderr,
               "loom-worker: pipeline stage %d of %d: meeting the other stages through %s\n",
               parallel.pp_stage, parallel.pp_size, options.coordinator_address.c_str());
  CommunicatorOptions link = RendezvousOf(options);
  link.replica_id = absl::StrFormat("%s/column%d", options.replica_id, parallel.tp_rank);
  link.rank = parallel.pp_stage;
  link.world_size = parallel.pp_size;
  return ConnectPipelineLink(link);
}

// The backend's options (CreateStepBackend) from the worker's flags: the forward pass where
// `placement` puts it (KV pool of `num_blocks`; 0 on CUDA: sized from free device memory)
// or noop. The CPU forward pass runs on `thread_pool` when given (shared with a draft model)
// and counts its layers into `progress`.
StepBackendOptions BackendOptionsOf(const WorkerOptions& options, const Placement& placement,
                                    int64_t num_blocks, model::Communicator* communicator,
                                    PipelineLink* link,
                                    std::shared_ptr<kernels::cpu::ThreadPool> thread_pool,
                                    StepProgress* progress) {
  const model::Parallelism parallel = ParallelismOf(options);
  StepBackendOptions backend_options;
  backend_options.kind = options.step_backend;
  backend_options.device = placement.device;
  backend_options.gpu_index = placement.gpu_index;
  backend_options.num_kv_blocks = num_blocks;
  backend_options.block_size = options.block_size;
  backend_options.kv_memory_fraction =
      options.kv_cache_fraction.value_or(model::kDefaultDeviceKvFraction);
  backend_options.gpu_memory_utilization = options.gpu_memory_utilization.value_or(0.0);
  backend_options.num_threads = options.num_threads;
  backend_options.kv_dtype = options.kv_dtype;
  backend_options.share_kv_pool = options.kv_pool_shared_memory;
  backend_options.activations = options.activations;
  SetFp8Weights(options.quantization, backend_options);
  backend_options.cuda_graphs = options.cuda_graphs;
  backend_options.max_num_tokens = options.max_num_batched_tokens;
  backend_options.tp_rank = parallel.tp_rank;
  backend_options.tp_size = parallel.tp_size;
  backend_options.communicator = communicator;
  backend_options.pp_stage = parallel.pp_stage;
  backend_options.pp_size = parallel.pp_size;
  backend_options.pp_layers = parallel.stage_layers;
  backend_options.link = link;
  backend_options.thread_pool = std::move(thread_pool);
  backend_options.progress = progress;
  return backend_options;
}

// The backend `backend_options` name, weights loaded and KV pool allocated; prints its load log.
absl::StatusOr<std::unique_ptr<StepBackend>> CreateBackend(
    const WorkerOptions& options, const Placement& placement, const ServedModel& model,
    const StepBackendOptions& backend_options) {
  std::string load_log;
  absl::StatusOr<std::unique_ptr<StepBackend>> backend =
      CreateStepBackend(backend_options, *model.gguf, model.config, &load_log);
  if (!backend.ok() || options.step_backend == "noop") return backend;
  if (placement.cuda()) {
    std::fprintf(stderr, "%s", load_log.c_str());
  } else {
    const bool bf16 = options.activations == kernels::cpu::ActivationPrecision::kBf16;
    std::fprintf(stderr, "%sCPU backend: matmul ISA %s, %s activations into %s layers\n",
                 load_log.c_str(), kernels::cpu::MatmulIsa(),
                 kernels::cpu::ActivationPrecisionName(options.activations),
                 bf16 ? "all (AMX-BF16)" : "INT8/INT4");
  }
  return backend;
}

// ResourceExhausted unless a pool of `num_blocks` holds one sequence of --max-model-len.
absl::Status CheckPoolHoldsMaxModelLen(const WorkerOptions& options, int64_t num_blocks) {
  if (options.max_model_len == 0 || num_blocks * options.block_size >= options.max_model_len) {
    return absl::OkStatus();
  }
  return absl::ResourceExhaustedError(absl::StrFormat(
      "--max-model-len %d needs %d KV blocks of %d tokens for one sequence, but the KV pool "
      "holds %d (%d tokens): give the pool more memory (--kv-cache-memory, "
      "--kv-cache-fraction, --gpu-memory-utilization) or lower --max-model-len",
      options.max_model_len, (options.max_model_len + options.block_size - 1) / options.block_size,
      options.block_size, num_blocks, num_blocks * options.block_size));
}

void PrintBackend(const WorkerOptions& options, const Placement& placement,
                  const StepBackend& backend, const KvPool& pool, int64_t num_blocks,
                  const common::GgufFile& gguf) {
  std::fprintf(stderr,
               "loom-worker: backend %s, %d threads, KV pool %lld blocks x %lld tokens "
               "(%s, %.1f MiB%s)\n",
               std::string(backend.name()).c_str(),
               options.step_backend == "noop" || placement.cuda() ? 0 : options.num_threads,
               static_cast<long long>(num_blocks), static_cast<long long>(options.block_size),
               worker::KvPoolDtypeName(backend.name(), options.kv_dtype, gguf).c_str(),
               static_cast<double>(num_blocks * pool.block.bytes) / (1 << 20),
               options.step_backend == "noop" ? ", not allocated" : "");
}

// Draft-model speculation: the draft's pool mirrors the target's (same block ids and
// block size), so the coordinator's block tables address both. On CUDA the draft was
// loaded first (`cuda_draft`, LoadCudaDraft) and its pool is grown to the target's here; on
// the CPU it takes the target's options (one rank: the worker refuses a draft beside more)
// with the target's block count.
absl::StatusOr<DraftModel> LoadDraft(const WorkerOptions& options, const ServedModel& target,
                                     int64_t num_blocks, std::optional<CudaDraft> cuda_draft,
                                     StepBackendOptions backend_options) {
  backend_options.num_kv_blocks = num_blocks;
  LOOM_ASSIGN_OR_RETURN(DraftModel draft,
                        cuda_draft.has_value()
                            ? FinishCudaDraft(*std::move(cuda_draft), target.config.vocab_size,
                                              num_blocks, options.block_size)
                            : LoadDraftModel(options.draft_model_path, *target.gguf,
                                             options.model_path, target.config.vocab_size,
                                             worker::CpuForwardPassOptionsOf(backend_options)));
  std::fprintf(stderr,
               "loom-worker: draft model %s (%s, %lld layers, hidden %lld) from %s, KV pool "
               "%lld blocks (%.1f MiB)\n",
               draft.config.name.c_str(), draft.config.architecture.c_str(),
               static_cast<long long>(draft.config.num_layers),
               static_cast<long long>(draft.config.hidden_size), options.draft_model_path.c_str(),
               static_cast<long long>(num_blocks), static_cast<double>(draft.kv_bytes) / (1 << 20));
  return draft;
}

// Structured output: the vocabulary's bytes, for the grammar masks of constrained
// sequences. A model without a tokenizer the worker can read serves unconstrained ones
// (null).
std::unique_ptr<common::GrammarMatcherFactory> LoadGrammars(const common::GgufFile& gguf) {
  absl::StatusOr<std::unique_ptr<common::Tokenizer>> tokenizer = common::Tokenizer::FromGguf(gguf);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "loom-worker: no grammar support (%s)\n",
                 std::string(tokenizer.status().message()).c_str());
    return nullptr;
  }
  return std::make_unique<common::GrammarMatcherFactory>(
      common::TokenTrie::FromTokenizer(**tokenizer));
}

// The host KV tier of --kv-offload-memory over the backend's pool (bookkeeping only on
// the no-op backend, whose slots are sized like an F16 pool's blocks), and the measured
// time to load one block back.
// A prefill or decode worker without --kv-offload-memory gets a tier of as many blocks as
// its pool: the hand-off of a request's KV passes through both replicas' tiers. A GPU's
// pool may be far larger than the host can pin: there, at most a quarter of the host's
// available memory, shared by the replica's ranks.
absl::StatusOr<std::unique_ptr<KvHostTier>> CreateHostTier(const WorkerOptions& options,
                                                           const common::ModelConfig& served_config,
                                                           const StepBackend& backend,
                                                           int64_t num_blocks,
                                                           double* load_seconds) {
  const common::ModelConfig& config = backend.config();
  const int64_t f16_block =
      std::max<int64_t>(model::KvBytesPerBlock(config, options.block_size, 2), 1);
  int64_t bytes =
      options.kv_offload_bytes > 0
          ? options.kv_offload_bytes
          : num_blocks *
                (backend.kv_pool() != nullptr ? backend.kv_pool()->block_bytes() : f16_block);
  if (options.kv_offload_bytes <= 0 && backend.name() == "cuda") {
    if (absl::StatusOr<int64_t> available = model::MemAvailableBytes(); available.ok()) {
      const int64_t share = *available / 4 / std::max(options.world_size, 1);
      if (share < bytes) {
        std::fprintf(stderr,
                     "loom-worker: the hand-off tier is %.1f GiB (a quarter of the host's "
                     "available memory per rank), not the pool's %.1f GiB: "
                     "--kv-offload-memory sets it\n",
                     static_cast<double>(share) / (1 << 30),
                     static_cast<double>(bytes) / (1 << 30));
        bytes = share;
      }
    }
  }
  LOOM_ASSIGN_OR_RETURN(
      std::unique_ptr<KvHostTier> tier,
      KvHostTier::Create(bytes, backend.kv_pool(), f16_block, backend.num_kv_blocks()));
  LOOM_ASSIGN_OR_RETURN(*load_seconds, tier->MeasureLoadSeconds());
  // The slot layout, for transfers that map KV heads between tensor-parallel sizes: the
  // pool's block as SaveBlocks writes it (unset when the sizes disagree, e.g. a backend
  // with another layout: such transfers are then refused).
  if (absl::StatusOr<model::ShardPlan> plan =
          model::PlanPartition(served_config, ParallelismOf(options));
      plan.ok()) {
    worker::KvSlotLayout layout;
    layout.num_layers = plan->num_layers;
    layout.block_size = options.block_size;
    layout.head_dim = served_config.head_dim;
    // CUDA pools hold F16 or BF16 (2 bytes, as the CPU's f16) or the same 8-bit rows.
    layout.element_bytes = kernels::cpu::KvElementBytes(options.kv_dtype);
    layout.scale_bytes = kernels::cpu::KvScaleBytes(options.kv_dtype);
    layout.kv_head_begin = plan->kv_head0;
    layout.num_kv_heads = plan->num_kv_heads;
    layout.pools = model::KvPoolsPerLayer(served_config);
    if (layout.slot_bytes() == tier->slot_bytes()) tier->set_layout(layout);
  }
  std::fprintf(
      stderr,
      "loom-worker: KV host tier: %lld blocks of %lld bytes (%.1f MiB), %.1f us to "
      "load a block\n",
      static_cast<long long>(tier->num_slots()), static_cast<long long>(tier->slot_bytes()),
      static_cast<double>(tier->num_slots() * tier->slot_bytes()) / (1 << 20), *load_seconds * 1e6);
  return tier;
}

// What the worker registers as; worker_address is --advertise-address, or empty until the
// server knows its port.
loom::v1::RegisterRequest RegisterRequestFor(const WorkerOptions& options,
                                             const ServedModel& served, const StepBackend& backend,
                                             int64_t num_blocks) {
  loom::v1::RegisterRequest request;
  request.set_worker_address(options.advertise_address);
  request.set_replica_id(options.replica_id);
  request.set_role(options.role);
  request.set_rank(options.rank);
  request.set_world_size(options.world_size);
  request.set_pipeline_parallel_size(options.pipeline_parallel_size);
  if (absl::StatusOr<model::ShardPlan> plan =
          model::PlanPartition(served.config, ParallelismOf(options));
      plan.ok()) {
    request.set_pipeline_first_layer(static_cast<int32_t>(plan->layer0));
    request.set_pipeline_num_layers(static_cast<int32_t>(plan->num_layers));
    request.set_kv_head_begin(static_cast<int32_t>(plan->kv_head0));
    request.set_num_kv_heads(static_cast<int32_t>(plan->num_kv_heads));
  }
  loom::v1::ModelInfo* model = request.mutable_model();
  model->set_name(served.config.name);
  model->set_path(options.model_path);
  model->set_architecture(served.config.architecture);
  model->set_vocab_size(served.config.vocab_size);
  model->set_context_length(served.config.context_length);
  model->set_fingerprint(served.fingerprint);
  request.set_backend(std::string(backend.name()));
  request.set_num_kv_blocks(num_blocks);
  request.set_block_size(static_cast<int32_t>(options.block_size));
  request.set_kv_dtype(worker::KvPoolDtypeName(backend.name(), options.kv_dtype, *served.gguf));
  request.set_version(LOOM_VERSION);
  return request;
}

// Blocks until SIGTERM or SIGINT (0) or the coordinator's refusal (1).
int WaitForShutdown(const sigset_t& signals, const WorkerServer& server) {
  const timespec period{0, 200 * 1000 * 1000};
  while (true) {
    const int signal = sigtimedwait(&signals, nullptr, &period);
    if (signal == SIGTERM || signal == SIGINT) {
      std::fprintf(stderr, "loom-worker: %s, shutting down\n",
                   signal == SIGTERM ? "SIGTERM" : "SIGINT");
      return 0;
    }
    if (!server.fatal_status().ok()) return 1;
  }
}

// Scale-in: the coordinator stops placing on this replica and its requests finish while
// the step stream keeps serving; then the worker goes.
void Drain(WorkerServer& server, int timeout_s) {
  std::fprintf(stderr, "loom-worker: draining (up to %d s)\n", timeout_s);
  absl::StatusOr<int64_t> left = server.Drain(absl::Seconds(timeout_s));
  if (!left.ok()) {
    std::fprintf(stderr, "loom-worker: drain: %s\n", left.status().ToString().c_str());
  } else {
    std::fprintf(stderr, "loom-worker: %s\n",
                 *left == 0
                     ? "drained"
                     : absl::StrFormat("drain timed out with %d requests left", *left).c_str());
  }
}

// Serves `executor` until a shutdown signal or the coordinator's refusal: the gRPC server
// (its address on stdout), the metrics endpoint, the registration carrying `request` and
// `progress`; then drains (after a signal) and stops. The exit code.
int Serve(const WorkerOptions& options, StepExecutor& executor, WorkerMetrics& metrics,
          loom::v1::RegisterRequest request, const StepProgress& progress,
          const sigset_t& signals) {
  absl::StatusOr<std::unique_ptr<WorkerServer>> server =
      WorkerServer::Start(executor, metrics, options.listen_address);
  if (!server.ok()) return Fail(server.status());
  const std::string listen_host = SplitHostPort(options.listen_address)->first;
  std::printf("loom-worker: listening on %s:%d\n", listen_host.c_str(), (*server)->port());
  if (options.metrics_port >= 0) {
    absl::StatusOr<int> metrics_port = (*server)->ServeMetrics(listen_host, options.metrics_port);
    if (!metrics_port.ok()) return Fail(metrics_port.status());
    std::printf("loom-worker: metrics on http://%s:%d/metrics\n", listen_host.c_str(),
                *metrics_port);
  }
  std::fflush(stdout);

  if (request.worker_address().empty()) {
    request.set_worker_address(
        absl::StrFormat("%s:%d", AdvertiseHost(listen_host), (*server)->port()));
  }
  std::fprintf(stderr, "loom-worker: registering %s (replica %s, rank %d) with %s\n",
               request.worker_address().c_str(), options.replica_id.c_str(), options.rank,
               options.coordinator_address.c_str());
  // Pool-to-pool transfers map KV heads between tensor-parallel sizes by the heads it registers.
  if (request.num_kv_heads() > 0) {
    (*server)->SetKvHeads(request.kv_head_begin(), request.num_kv_heads());
  }
  if (options.debug_kv_pool_unreadable) (*server)->RefusePoolTransfers();
  RegistrationOptions registration;
  registration.coordinator_address = options.coordinator_address;
  registration.request = std::move(request);
  (*server)->StartRegistration(std::move(registration), &progress);

  const int exit_code = WaitForShutdown(signals, **server);
  if (exit_code == 0 && options.drain_timeout_s > 0) Drain(**server, options.drain_timeout_s);
  (*server)->Stop();
  std::fprintf(stderr, "loom-worker: stopped after %lld steps\n",
               static_cast<long long>((*server)->num_steps()));
  return exit_code;
}

}  // namespace

int RunWorkerCommand(int argc, char** argv) {
  WorkerOptions options;
  cli::CommandLine command_line("loom-worker",
                                "loom-worker: one worker process (a model runner and its KV pool), "
                                "registered with a coordinator");
  AddWorkerFlags(command_line.app(), options);
  if (std::optional<int> exit_code = command_line.Parse(argc, argv)) return *exit_code;
  if (absl::Status status = CheckCommandLine(options); !status.ok()) return Refuse(status);
  if (absl::Status secret = common::LoadClusterSecret(
          options.cluster_secret_file, std::getenv(common::kClusterSecretEnvironment));
      !secret.ok()) {
    return Refuse(secret);
  }
  // Before any thread starts (PlaceWorker's first CUDA call may start the driver's), so
  // every thread inherits the mask and only sigtimedwait (WaitForShutdown) sees these
  // signals.
  const sigset_t signals = ShutdownSignals();
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  absl::StatusOr<Placement> placement = PlaceWorker(options);
  if (!placement.ok()) return Refuse(placement.status());
  options.kv_dtype = worker::ResolveKvDtype(options.kv_dtype, options.kv_dtype_auto,
                                            placement->device, options.activations);

  absl::StatusOr<ServedModel> served = LoadModel(options);
  if (!served.ok()) return Fail(served.status());
  absl::StatusOr<KvPool> pool = PlanKvPool(options, *placement, served->config);
  if (!pool.ok()) return Refuse(pool.status());
  PrintModel(options, *served);
  absl::StatusOr<std::unique_ptr<model::Communicator>> communicator =
      JoinRanks(options, *placement);
  if (!communicator.ok()) return Fail(communicator.status());
  absl::StatusOr<std::unique_ptr<PipelineLink>> link = JoinStages(options);
  if (!link.ok()) return Fail(link.status());

  // With a draft model, the target and the draft step one after the other on one pool.
  std::shared_ptr<kernels::cpu::ThreadPool> thread_pool;
  if (!options.draft_model_path.empty() && !placement->cuda()) {
    thread_pool = std::make_shared<kernels::cpu::ThreadPool>(options.num_threads);
  }
  // Written by the step executor and the forward pass, read by the heartbeat thread. A
  // step counts its start and end, plus two units per layer on the CPU forward pass.
  StepProgress progress;
  const int64_t stage_layers = served->config.num_layers / options.pipeline_parallel_size;
  progress.set_units_per_step(static_cast<uint32_t>(
      2 + (options.step_backend == "model" && !placement->cuda() ? 2 * stage_layers : 0)));
  StepBackendOptions backend_options =
      BackendOptionsOf(options, *placement, pool->num_blocks, communicator->get(), link->get(),
                       thread_pool, &progress);
  // A draft on the GPU goes first: the target's pool leaves room for a draft pool as large.
  std::optional<CudaDraft> cuda_draft;
  if (!options.draft_model_path.empty() && placement->cuda()) {
    absl::StatusOr<CudaDraft> loaded =
        LoadCudaDraft(options.draft_model_path, *served->gguf, options.model_path, backend_options);
    if (!loaded.ok()) return Fail(loaded.status());
    backend_options.draft_kv_bytes_per_block = loaded->kv_bytes_per_block;
    backend_options.draft_device_bytes = loaded->device_bytes;
    backend_options.startup_lock_held = true;  // the draft's, until its pool is resized
    cuda_draft = *std::move(loaded);
  }
  absl::StatusOr<std::unique_ptr<StepBackend>> backend =
      CreateBackend(options, *placement, *served, backend_options);
  if (!backend.ok()) return Fail(backend.status());
  const int64_t num_blocks =
      (*backend)->num_kv_blocks();  // the CUDA forward pass may have sized it
  if (absl::Status fits = CheckPoolHoldsMaxModelLen(options, num_blocks); !fits.ok()) {
    return Fail(fits);
  }
  PrintBackend(options, *placement, **backend, *pool, num_blocks, *served->gguf);

  DraftModel draft;  // none without --draft-model: n-gram prompt lookup
  if (!options.draft_model_path.empty()) {
    absl::StatusOr<DraftModel> loaded =
        LoadDraft(options, *served, num_blocks, std::move(cuda_draft), backend_options);
    if (!loaded.ok()) return Fail(loaded.status());
    draft = *std::move(loaded);
  }
  std::unique_ptr<common::GrammarMatcherFactory> grammars = LoadGrammars(*served->gguf);

  std::unique_ptr<KvHostTier> host_tier;
  double load_seconds = 0;
  if (options.kv_offload_bytes > 0 || options.role != "mixed") {
    absl::StatusOr<std::unique_ptr<KvHostTier>> created =
        CreateHostTier(options, served->config, **backend, num_blocks, &load_seconds);
    if (!created.ok()) return Fail(created.status());
    host_tier = *std::move(created);
  }

  StepExecutorOptions executor_options;
  executor_options.host_tier = host_tier.get();
  executor_options.draft_proposer = draft.proposer.get();
  executor_options.progress = &progress;
  executor_options.debug_step_delay_ms = options.debug_step_delay_ms;
  executor_options.debug_hang_at_step = options.debug_hang_at_step;
  executor_options.grammars = grammars.get();
  StepExecutor executor(**backend, executor_options);
  WorkerMetrics metrics(options.replica_id, options.rank, std::string((*backend)->name()),
                        num_blocks);
  loom::v1::RegisterRequest request = RegisterRequestFor(options, *served, **backend, num_blocks);
  if (const model::KvCache* pool = (*backend)->kv_pool(); pool != nullptr && pool->Share().ok()) {
    request.set_kv_pool_scope(worker::KvPoolScope());  // other workers read its blocks directly
  }
  if (host_tier != nullptr) {
    request.set_num_host_kv_blocks(host_tier->num_slots());
    request.set_kv_load_seconds_per_block(load_seconds);
    metrics.SetHostTierCapacity(host_tier->num_slots());
    if (!options.kv_shared_memory) host_tier->StopSharing();
    if (host_tier->shared_fd() >= 0) {
      // Where a prefill worker of this machine pushes hand-offs into this tier.
      loom::v1::SharedKvMemory* shared = request.mutable_host_kv_shared();
      shared->set_boot_id(worker::BootId());
      shared->set_pid(static_cast<int32_t>(getpid()));
      shared->set_fd(host_tier->shared_fd());
      shared->set_size(host_tier->mapped_bytes());
    }
  }
  return Serve(options, executor, metrics, request, progress, signals);
}

}  // namespace loom::cli
