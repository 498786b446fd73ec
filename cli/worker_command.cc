#include "cli/worker_command.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_format.h"
#include "common/formats/gguf_file.h"
#include "common/grammar/grammar_matcher_factory.h"
#include "common/formats/hf_model.h"
#include "common/formats/model_config.h"
#include "common/formats/model_fingerprint.h"
#include "common/process_metrics.h"
#include "common/tokenizer/tokenizer.h"
#include "prometheus/exposer.h"
#include "kernels/cuda_device.h"
#include "model/cpu_kv_cache.h"
#include "model/kv_cache_budget.h"
#include "model/tensor_parallel.h"
#include "worker/coordinator_store.h"
#include "worker/cuda_forward_pass.h"
#include "worker/draft_proposer.h"
#include "worker/gloo_communicator.h"
#include "worker/nccl_communicator.h"
#include "worker/health_service.h"
#include "quant/model_quantizer.h"
#include "worker/cpu_forward_pass.h"
#include "worker/step_backend_factory.h"
#include "worker/registration.h"
#include "worker/step_executor.h"
#include "worker/step_progress.h"
#include "cli/command_line.h"
#include "cli/worker_options.h"
#include "worker/worker_service.h"

#ifndef LOOM_VERSION
#define LOOM_VERSION "dev"
#endif

namespace loom::worker {
namespace {

constexpr int kShutdownGraceMs = 2000;

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "loom-worker: %s\n", status.ToString().c_str());
  return 1;
}

int UsageError(const std::string& message) {
  std::fprintf(stderr, "loom-worker: error: %s (usage: loom-worker --help)\n", message.c_str());
  return 2;
}

// The host to register when --advertise-address is not given: the listen host, or this
// machine's name when listening on every interface.
std::string AdvertiseHost(const std::string& listen_host) {
  if (listen_host != "0.0.0.0" && listen_host != "[::]" && listen_host != "::") {
    return listen_host;
  }
  char name[HOST_NAME_MAX + 1] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "127.0.0.1";
  return name;
}

sigset_t ShutdownSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}

// The CPU runner's options from the worker's flags (threads, KV pool, activations): the
// target model's (which adds tensor parallelism) and the draft model's alike.
CpuForwardPassOptions CpuRunnerOptions(const WorkerOptions& options, int64_t num_blocks,
                                    std::shared_ptr<kernels::cpu::ThreadPool> thread_pool,
                                    StepProgress* progress) {
  CpuForwardPassOptions runner_options;
  runner_options.num_threads = options.num_threads;
  runner_options.num_kv_blocks = num_blocks;
  runner_options.block_size = options.block_size;
  runner_options.kv_dtype = options.kv_dtype;
  runner_options.activations = options.activations;
  runner_options.thread_pool = std::move(thread_pool);
  runner_options.progress = progress;
  return runner_options;
}

// Builds the backend (CreateStepBackend) from the worker's flags: the model runner on
// `device` ("cpu" or "cuda"; weights loaded, KV pool allocated) or noop, and prints its load
// log (on CUDA device `gpu_index`). `num_blocks` sizes the CPU pool; on CUDA it is used when positive, else the pool
// takes a fraction of free device memory. The CPU runner runs on `thread_pool` when given
// (shared with a draft model) and counts its layers into `progress`.
absl::StatusOr<std::unique_ptr<StepBackend>> CreateBackend(
    const WorkerOptions& options, const std::string& device, const common::GgufFile& gguf,
    const common::ModelConfig& config, int64_t num_blocks, int gpu_index,
    model::Communicator* communicator, std::shared_ptr<kernels::cpu::ThreadPool> thread_pool,
    StepProgress* progress) {
  StepBackendOptions backend_options;
  backend_options.backend = options.backend;
  backend_options.device = device;
  backend_options.gpu_index = gpu_index;
  backend_options.num_kv_blocks = num_blocks;
  backend_options.block_size = options.block_size;
  backend_options.kv_memory_fraction =
      options.kv_cache_fraction.value_or(model::kDefaultDeviceKvFraction);
  backend_options.gpu_memory_utilization = options.gpu_memory_utilization.value_or(0.0);
  backend_options.num_threads = options.num_threads;
  backend_options.kv_dtype = options.kv_dtype;
  backend_options.activations = options.activations;
  backend_options.cuda_graphs = options.cuda_graphs;
  backend_options.tp_rank = options.rank;
  backend_options.tp_size = options.world_size;
  backend_options.communicator = communicator;
  backend_options.thread_pool = std::move(thread_pool);
  backend_options.progress = progress;
  std::string load_log;
  absl::StatusOr<std::unique_ptr<StepBackend>> backend =
      CreateStepBackend(backend_options, gguf, config, &load_log);
  if (!backend.ok() || options.backend == "noop") return backend;
  if (device == "cuda") {
    std::fprintf(stderr, "%s", load_log.c_str());
  } else {
    std::fprintf(stderr, "%sCPU backend: matmul ISA %s, %s activations into INT8/INT4 layers\n",
                 load_log.c_str(), kernels::cpu::MatmulIsa(),
                 kernels::cpu::ActivationPrecisionName(options.activations));
  }
  return backend;
}

}  // namespace

int RunWorkerCommand(int argc, char** argv) {
  WorkerOptions options;
  cli::CommandLine command_line(
      "loom-worker", "loom-worker: one worker process (a model runner and its KV pool), "
                     "registered with a coordinator");
  AddWorkerFlags(command_line.app(), options);
  if (std::optional<int> exit_code = command_line.Parse(argc, argv)) return *exit_code;
  if (absl::Status status = CheckWorkerOptions(options); !status.ok()) {
    return UsageError(std::string(status.message()));
  }
  if (options.world_size > 1 && options.backend != "cpu") {
    return UsageError(absl::StrFormat("--world-size %d needs --backend cpu", options.world_size));
  }
  if (options.rank < 0 || options.rank >= options.world_size) {
    return UsageError(
        absl::StrFormat("--rank %d is outside [0, %d)", options.rank, options.world_size));
  }
  if (options.num_threads == 0) {
    options.num_threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  }
  // Where the model runs, decided before anything is loaded: --device cuda on a machine
  // without a usable GPU fails here with the reason.
  std::string device = "cpu";
  if (options.backend == "cpu") {
    absl::StatusOr<std::string> resolved = ResolveDevice(options.device, options.kv_dtype,
                                                             options.world_size,
                                                             kernels::CudaDeviceCount());
    if (!resolved.ok()) {
      if (resolved.status().code() == absl::StatusCode::kInvalidArgument) {
        return UsageError(std::string(resolved.status().message()));
      }
      return Fail(resolved.status());
    }
    device = *resolved;
  }
  // The GPU of a CUDA worker: --gpu-index, else the rank modulo the visible devices.
  int gpu_index = 0;
  if (device == "cuda") {
    absl::StatusOr<int> gpu =
        ResolveGpuIndex(options.gpu_index, options.rank, kernels::CudaDeviceCount());
    if (!gpu.ok()) return Fail(gpu.status());
    gpu_index = *gpu;
  }
  if (options.gpu_memory_utilization.has_value() && device != "cuda" &&
      options.backend == "cpu") {
    return UsageError(
        "--gpu-memory-utilization sizes a CUDA device's memory; this worker runs on the cpu "
        "(use --kv-cache-memory or --kv-cache-fraction)");
  }

  if (!options.draft_model_path.empty()) {
    // The draft runs on the CPU model runner beside one whole copy of the target.
    if (options.backend != "cpu" || device != "cpu" || options.world_size > 1) {
      return UsageError(absl::StrFormat(
          "--draft-model needs the CPU model runner on one rank (--backend cpu --device cpu "
          "--world-size 1), got --backend %s on %s with --world-size %d",
          options.backend, device, options.world_size));
    }
  }

  // Before any thread starts, so every thread inherits the mask and only sigtimedwait
  // below sees these signals.
  const sigset_t signals = ShutdownSignals();
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  absl::StatusOr<std::unique_ptr<common::GgufFile>> gguf =
      common::OpenModelFile(options.model_path);
  if (!gguf.ok()) return Fail(gguf.status());
  absl::StatusOr<common::ModelConfig> config = common::ModelConfigFromGguf(**gguf);
  if (!config.ok()) return Fail(config.status());
  const std::string fingerprint = common::ModelFingerprint(**gguf);
  // The fingerprint names the model source, so the coordinator (which reads the same
  // source unquantized) still recognizes the worker.
  if (!options.quantization.empty()) {
    absl::StatusOr<std::unique_ptr<common::GgufFile>> quantized = QuantizeInMemory(
        **gguf, options.quantization == "int8" ? QuantizeFormat::kInt8 : QuantizeFormat::kInt4);
    if (!quantized.ok()) return Fail(quantized.status());
    *gguf = std::move(*quantized);
  }

  // A tensor-parallel rank keeps only its KV heads: its blocks are smaller. What does not
  // divide is refused here, before meeting the other ranks.
  const bool cuda = device == "cuda";
  absl::StatusOr<model::KvBlockSpec> block = model::ShardKvBlock(
      *config, options.rank, options.world_size, options.block_size,
      cuda ? kernels::cuda::ElementBytes(kernels::cuda::DataType::kF16)
           : model::CpuKvCache::ElementBytes(options.kv_dtype),
      options.kv_dtype == kernels::cpu::KvDtype::kF16 ? "f16" : "f32");
  if (!block.ok()) return UsageError(std::string(block.status().message()));
  const int64_t block_bytes = block->bytes;
  // The pool's blocks from the KV budget in bytes; on CUDA without --kv-cache-memory the
  // runner sizes the pool from free device memory (num_blocks 0).
  int64_t num_blocks = 0;
  if (!cuda || options.kv_cache_bytes.has_value()) {
    absl::StatusOr<int64_t> budget = KvCacheBudgetBytes(options);
    if (!budget.ok()) return Fail(budget.status());
    absl::StatusOr<int64_t> blocks = model::KvBlocksFromBudget(*budget, *block);
    if (!blocks.ok()) return UsageError(std::string(blocks.status().message()));
    num_blocks = *blocks;
  }
  std::fprintf(
      stderr, "loom-worker: model %s (%s, vocab %lld, context %lld) from %s, fingerprint %s\n",
      config->name.c_str(), config->architecture.c_str(),
      static_cast<long long>(config->vocab_size), static_cast<long long>(config->context_length),
      options.model_path.c_str(), fingerprint.c_str());

  // Tensor parallelism: meet the replica's other ranks through the coordinator's
  // rendezvous store, then load only this rank's shard.
  // On CUDA the ranks are joined by NCCL (its unique id through the same store), on the CPU
  // by gloo; either way the collective timeout is --rendezvous-timeout-ms.
  std::unique_ptr<model::Communicator> communicator;
  if (options.world_size > 1) {
    const std::string listen_host = SplitHostPort(options.listen_address)->first;
    auto store = std::make_shared<CoordinatorStore>(
        grpc::CreateChannel(options.coordinator_address, grpc::InsecureChannelCredentials()),
        absl::StrFormat("tp/%s/%s/", options.replica_id, options.rendezvous_id),
        std::chrono::milliseconds(options.rendezvous_timeout_ms));
    std::fprintf(stderr, "loom-worker: rank %d of %d%s: meeting the other ranks through %s\n",
                 options.rank, options.world_size,
                 cuda ? absl::StrFormat(" on GPU %d (NCCL)", gpu_index).c_str() : "",
                 options.coordinator_address.c_str());
    if (cuda) {
      absl::StatusOr<std::unique_ptr<NcclCommunicator>> connected = NcclCommunicator::Connect(
          store, options.rank, options.world_size, gpu_index,
          std::chrono::milliseconds(options.rendezvous_timeout_ms));
      if (!connected.ok()) return Fail(connected.status());
      communicator = *std::move(connected);
    } else {
      GlooOptions gloo;
      gloo.hostname = AdvertiseHost(listen_host);
      gloo.timeout = std::chrono::milliseconds(options.rendezvous_timeout_ms);
      absl::StatusOr<std::unique_ptr<GlooCommunicator>> connected =
          GlooCommunicator::Connect(store, options.rank, options.world_size, gloo);
      if (!connected.ok()) return Fail(connected.status());
      communicator = *std::move(connected);
    }
  }
  // With a draft model, the target and the draft step one after the other on one pool.
  std::shared_ptr<kernels::cpu::ThreadPool> thread_pool;
  if (!options.draft_model_path.empty()) {
    thread_pool = std::make_shared<kernels::cpu::ThreadPool>(options.num_threads);
  }
  // Written by the step executor and the forward pass, read by the heartbeat thread. A
  // step counts its start and end, plus two units per layer on the CPU runner.
  StepProgress progress;
  progress.set_units_per_step(
      static_cast<uint32_t>(2 + (options.backend == "cpu" && !cuda ? 2 * config->num_layers : 0)));
  absl::StatusOr<std::unique_ptr<StepBackend>> backend = CreateBackend(
      options, device, **gguf, *config, num_blocks, gpu_index, communicator.get(), thread_pool,
      &progress);
  if (!backend.ok()) return Fail(backend.status());
  num_blocks = (*backend)->num_kv_blocks();  // the CUDA runner may have sized it
  if (options.max_model_len > 0 && num_blocks * options.block_size < options.max_model_len) {
    return Fail(absl::ResourceExhaustedError(absl::StrFormat(
        "--max-model-len %d needs %d KV blocks of %d tokens for one sequence, but the KV pool "
        "holds %d (%d tokens): give the pool more memory (--kv-cache-memory, "
        "--kv-cache-fraction, --gpu-memory-utilization) or lower --max-model-len",
        options.max_model_len,
        (options.max_model_len + options.block_size - 1) / options.block_size,
        options.block_size, num_blocks, num_blocks * options.block_size)));
  }
  std::fprintf(stderr,
               "loom-worker: backend %s, %d threads, KV pool %lld blocks x %lld tokens "
               "(%s, %.1f MiB%s)\n",
               std::string((*backend)->name()).c_str(),
               options.backend == "noop" || cuda ? 0 : options.num_threads,
               static_cast<long long>(num_blocks), static_cast<long long>(options.block_size),
               options.kv_dtype == kernels::cpu::KvDtype::kF16 ? "f16" : "f32",
               static_cast<double>(num_blocks * block_bytes) / (1 << 20),
               options.backend == "noop" ? ", not allocated" : "");

  // Draft-model speculation: the draft's pool mirrors the target's (same block ids and
  // block size), so the coordinator's block tables address both.
  std::unique_ptr<common::GgufFile> draft_gguf;
  std::unique_ptr<DraftProposer> draft_proposer;
  if (!options.draft_model_path.empty()) {
    absl::StatusOr<std::unique_ptr<common::GgufFile>> opened =
        common::OpenModelFile(options.draft_model_path);
    if (!opened.ok()) return Fail(opened.status());
    draft_gguf = *std::move(opened);
    if (absl::Status same = CheckSameVocabulary(**gguf, *draft_gguf); !same.ok()) {
      return Fail(absl::InvalidArgumentError(absl::StrFormat(
          "--draft-model %s cannot draft for --model %s: %s", options.draft_model_path,
          options.model_path, same.message())));
    }
    absl::StatusOr<std::unique_ptr<CpuForwardPass>> draft_runner =
        CpuForwardPass::Create(*draft_gguf,
                            CpuRunnerOptions(options, num_blocks, thread_pool, &progress));
    if (!draft_runner.ok()) return Fail(draft_runner.status());
    const common::ModelConfig& draft_config = (*draft_runner)->config();
    const int64_t draft_kv_bytes = (*draft_runner)->kv_cache().bytes();
    std::fprintf(stderr,
                 "loom-worker: draft model %s (%s, %lld layers, hidden %lld) from %s, KV pool "
                 "%lld blocks (%.1f MiB)\n",
                 draft_config.name.c_str(), draft_config.architecture.c_str(),
                 static_cast<long long>(draft_config.num_layers),
                 static_cast<long long>(draft_config.hidden_size),
                 options.draft_model_path.c_str(), static_cast<long long>(num_blocks),
                 static_cast<double>(draft_kv_bytes) / (1 << 20));
    absl::StatusOr<std::unique_ptr<DraftProposer>> proposer = DraftProposer::Create(
        *std::move(draft_runner), config->vocab_size, num_blocks, options.block_size);
    if (!proposer.ok()) return Fail(proposer.status());
    draft_proposer = *std::move(proposer);
  }

  // Structured output: the vocabulary's bytes, for the grammar masks of constrained
  // sequences. A model without a tokenizer the worker can read serves unconstrained ones.
  std::unique_ptr<common::GrammarMatcherFactory> grammars;
  if (absl::StatusOr<std::unique_ptr<common::Tokenizer>> tokenizer =
          common::Tokenizer::FromGguf(**gguf);
      tokenizer.ok()) {
    grammars = std::make_unique<common::GrammarMatcherFactory>(
        common::TokenTrie::FromTokenizer(**tokenizer));
  } else {
    std::fprintf(stderr, "loom-worker: no grammar support (%s)\n",
                 std::string(tokenizer.status().message()).c_str());
  }

  StepExecutorOptions executor_options;
  executor_options.draft_proposer = draft_proposer.get();
  executor_options.progress = &progress;
  executor_options.debug_step_delay_ms = options.debug_step_delay_ms;
  executor_options.debug_hang_at_step = options.debug_hang_at_step;
  executor_options.grammars = grammars.get();
  StepExecutor executor(**backend, executor_options);
  WorkerMetrics metrics(options.replica_id, options.rank, std::string((*backend)->name()),
                        num_blocks);
  WorkerService service(executor, &metrics);
  // grpc.health.v1 from a synchronous service, not gRPC's built-in callback one: see
  // HealthService for why (no callback pollers competing for the step stream).
  HealthService health("loom.v1.Worker");
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options.listen_address, grpc::InsecureServerCredentials(), &port);
  // A plan that adds many long prompts at once can pass gRPC's 4 MiB default.
  builder.SetMaxReceiveMessageSize(256 << 20);
  builder.RegisterService(&service);
  builder.RegisterService(&health);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return Fail(
        absl::UnavailableError(absl::StrFormat("cannot listen on %s", options.listen_address)));
  }
  const std::string listen_host = SplitHostPort(options.listen_address)->first;
  std::printf("loom-worker: listening on %s:%d\n", listen_host.c_str(), port);
  std::unique_ptr<prometheus::Exposer> exposer;
  // The exposer holds collectables weakly: this lives as long as it.
  auto process_metrics = std::make_shared<common::ProcessCollector>();
  if (options.metrics_port >= 0) {
    try {
      exposer = std::make_unique<prometheus::Exposer>(
          absl::StrFormat("%s:%d", listen_host, options.metrics_port));
    } catch (const std::exception& error) {
      return Fail(absl::UnavailableError(absl::StrFormat(
          "cannot serve metrics on %s:%d: %s", listen_host, options.metrics_port, error.what())));
    }
    exposer->RegisterCollectable(metrics.registry());
    exposer->RegisterCollectable(process_metrics);
    std::printf("loom-worker: metrics on http://%s:%d/metrics\n", listen_host.c_str(),
                exposer->GetListeningPorts().front());
  }
  std::fflush(stdout);

  RegistrationOptions registration_options;
  registration_options.coordinator_address = options.coordinator_address;
  loom::v1::RegisterRequest& request = registration_options.request;
  request.set_worker_address(options.advertise_address.empty()
                                 ? absl::StrFormat("%s:%d", AdvertiseHost(listen_host), port)
                                 : options.advertise_address);
  request.set_replica_id(options.replica_id);
  request.set_rank(options.rank);
  request.set_world_size(options.world_size);
  loom::v1::ModelInfo* model = request.mutable_model();
  model->set_name(config->name);
  model->set_path(options.model_path);
  model->set_architecture(config->architecture);
  model->set_vocab_size(config->vocab_size);
  model->set_context_length(config->context_length);
  model->set_fingerprint(fingerprint);
  request.set_backend(std::string((*backend)->name()));
  request.set_num_kv_blocks(num_blocks);
  request.set_block_size(static_cast<int32_t>(options.block_size));
  request.set_kv_dtype(cuda || options.kv_dtype == kernels::cpu::KvDtype::kF16 ? "f16" : "f32");
  request.set_version(LOOM_VERSION);
  std::fprintf(stderr, "loom-worker: registering %s (replica %s, rank %d) with %s\n",
               request.worker_address().c_str(), options.replica_id.c_str(), options.rank,
               options.coordinator_address.c_str());
  // The heartbeat thread reads the executor's progress and sequence count without ever
  // waiting for the step that runs.
  WorkerRegistration registration(std::move(registration_options),
                                  [&service, &progress](loom::v1::HeartbeatRequest& heartbeat) {
                                    heartbeat.set_num_sequences(service.num_sequences());
                                    *heartbeat.mutable_progress() = progress.Snapshot();
                                  });
  registration.Start();

  int exit_code = 0;
  const timespec period{0, 200 * 1000 * 1000};
  while (true) {
    const int signal = sigtimedwait(&signals, nullptr, &period);
    if (signal == SIGTERM || signal == SIGINT) {
      std::fprintf(stderr, "loom-worker: %s, shutting down\n",
                   signal == SIGTERM ? "SIGTERM" : "SIGINT");
      break;
    }
    if (!registration.fatal_status().ok()) {
      exit_code = 1;
      break;
    }
  }
  if (exit_code == 0 && options.drain_timeout_s > 0) {
    // Scale-in: the coordinator stops placing on this replica and its requests finish
    // while the step stream keeps serving; then the worker goes.
    std::fprintf(stderr, "loom-worker: draining (up to %d s)\n", options.drain_timeout_s);
    absl::StatusOr<int64_t> left = registration.Drain(absl::Seconds(options.drain_timeout_s));
    if (!left.ok()) {
      std::fprintf(stderr, "loom-worker: drain: %s\n", left.status().ToString().c_str());
    } else {
      std::fprintf(stderr, "loom-worker: %s\n",
                   *left == 0 ? "drained"
                              : absl::StrFormat("drain timed out with %d requests left", *left)
                                    .c_str());
    }
  }
  registration.Stop();
  executor.ReleaseDebugHang();
  health.Shutdown();
  service.BeginShutdown();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(kShutdownGraceMs));
  server->Wait();
  std::fprintf(stderr, "loom-worker: stopped after %lld steps\n",
               static_cast<long long>(service.num_steps()));
  return exit_code;
}

}  // namespace loom::worker
