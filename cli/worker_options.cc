#include "cli/worker_options.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "cli/command_line.h"
#include "common/formats/gguf_file.h"
#include "kernels/cuda_device.h"
#include "model/kv_cache_budget.h"
#include "quant/model_quantizer.h"
#include "worker/step_backend_factory.h"

namespace loom::cli {

using cli::AddBool;
using cli::AddInt;
using cli::AddNumber;
using cli::AddString;
using cli::AnyDeclared;
using cli::CommandLine;
using cli::HostPort;
using cli::OneOf;

absl::StatusOr<int64_t> ParseByteSize(absl::string_view text) {
  const absl::string_view trimmed = absl::StripAsciiWhitespace(text);
  size_t number_end = 0;
  while (number_end < trimmed.size() &&
         (std::isdigit(static_cast<unsigned char>(trimmed[number_end])) ||
          trimmed[number_end] == '.')) {
    ++number_end;
  }
  double number = 0;
  if (number_end == 0 || !absl::SimpleAtod(trimmed.substr(0, number_end), &number)) {
    return absl::InvalidArgumentError(absl::StrFormat("'%s' is not a byte size", text));
  }
  const std::string suffix = absl::AsciiStrToLower(trimmed.substr(number_end));
  double scale = 0;
  if (suffix.empty() || suffix == "b") {
    scale = 1;
  } else if (suffix == "k" || suffix == "kb" || suffix == "kib") {
    scale = 1024.0;
  } else if (suffix == "m" || suffix == "mb" || suffix == "mib") {
    scale = 1024.0 * 1024;
  } else if (suffix == "g" || suffix == "gb" || suffix == "gib") {
    scale = 1024.0 * 1024 * 1024;
  } else if (suffix == "t" || suffix == "tb" || suffix == "tib") {
    scale = 1024.0 * 1024 * 1024 * 1024;
  } else {
    return absl::InvalidArgumentError(absl::StrFormat(
        "'%s': unknown size suffix '%s' (use B, KiB, MiB, GiB or TiB)", text, suffix));
  }
  const double bytes = number * scale;
  if (!std::isfinite(bytes) || bytes > 4.611686018427388e18) {
    return absl::InvalidArgumentError(absl::StrFormat("'%s' is too large", text));
  }
  return static_cast<int64_t>(bytes);
}

absl::StatusOr<std::pair<std::string, int>> SplitHostPort(absl::string_view address) {
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) {
    return absl::InvalidArgumentError(absl::StrFormat("'%s' is not HOST:PORT", address));
  }
  int port = 0;
  if (!absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrFormat("'%s': the port must be a number in [0, 65535]", address));
  }
  return std::make_pair(std::string(address.substr(0, colon)), port);
}

absl::StatusOr<int64_t> KvCacheBudgetBytes(const WorkerOptions& options) {
  return model::HostKvBudgetBytes(options.kv_cache_bytes, options.kv_cache_fraction);
}

absl::StatusOr<std::string> ResolveDevice(absl::string_view device, kernels::cpu::KvDtype kv_dtype,
                                          int world_size, int cuda_device_count) {
  if (device == "cpu") return std::string("cpu");
  const bool cpu_only_kv = kv_dtype == kernels::cpu::KvDtype::kF32;
  if (device == "auto") {
    return std::string(cuda_device_count > 0 && !cpu_only_kv && world_size == 1 ? "cuda" : "cpu");
  }
  if (device != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrFormat("--device: bad value '%s' (cuda, cpu or auto)", device));
  }
  if (cuda_device_count == 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "--device cuda: no usable CUDA device (%s); use --device cpu or auto",
        kernels::CudaDeviceDescription(0)));
  }
  if (cpu_only_kv) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--device cuda: --kv-dtype %s is CPU-only (the CUDA kernels read f16, "
                        "int8 or fp8_e4m3 KV)",
                        kernels::cpu::KvDtypeName(kv_dtype)));
  }
  return std::string("cuda");
}

absl::StatusOr<std::unique_ptr<common::GgufFile>> QuantizeAsFlagged(
    absl::string_view quantization, std::unique_ptr<common::GgufFile> gguf) {
  if (quantization != "int8" && quantization != "int4") return gguf;
  return quant::QuantizeInMemory(
      *gguf, quantization == "int8" ? quant::QuantizeFormat::kInt8 : quant::QuantizeFormat::kInt4);
}

void SetFp8Weights(absl::string_view quantization, worker::StepBackendOptions& backend) {
  backend.fp8_weights = quantization == "fp8";
  backend.fp8_checkpoints = quantization.empty();
}

absl::StatusOr<int> ResolveGpuIndex(int gpu_index, int rank, int cuda_device_count) {
  if (cuda_device_count <= 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "no usable CUDA device (%s)", kernels::CudaDeviceDescription(0)));
  }
  if (gpu_index < 0) return rank % cuda_device_count;
  if (gpu_index >= cuda_device_count) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "--gpu-index %d: this machine shows %d CUDA device(s) (indices 0 to %d, after "
        "CUDA_VISIBLE_DEVICES)",
        gpu_index, cuda_device_count, cuda_device_count - 1));
  }
  return gpu_index;
}

namespace {

// The KV type named `name` (one of the flags' checked values; f16 otherwise).
kernels::cpu::KvDtype KvDtypeOf(const std::string& name) {
  return kernels::cpu::KvDtypeFromName(name).value_or(kernels::cpu::KvDtype::kF16);
}

}  // namespace

CLI::Option* AddKvDtypeFlag(CLI::App& app, kernels::cpu::KvDtype& kv_dtype, bool& kv_dtype_auto) {
  using kernels::cpu::KvDtype;
  CLI::Option* option =
      app.add_option_function<std::string>(
             "--kv-dtype",
             [&kv_dtype, &kv_dtype_auto](const std::string& text) {
               kv_dtype = KvDtypeOf(text);
               kv_dtype_auto = text == "auto";
             },
             "the KV cache's element type: f16, bf16 (f32's range in f16's bytes; what "
             "--activations bf16's AMX attention reads as it is; on CUDA for BF16 models, whose "
             "KV is bf16 anyway), f32, or int8 / fp8_e4m3 (8-bit codes and a scale per token "
             "and KV head: a block takes 52% of f16's bytes at head dim 64, so the pool holds "
             "1.9x the tokens; CPU and CUDA); f32 is CPU-only; auto: bf16 on the CPU under "
             "--activations bf16, else f16")
          ->check(OneOf({"auto", "f16", "bf16", "f32", "int8", "fp8_e4m3"}))
          ->default_str("auto");
  app.add_option_function<std::string>(
         "--kv-cache-dtype",
         [&kv_dtype, &kv_dtype_auto](const std::string& text) {
           kv_dtype = KvDtypeOf(text == "auto"       ? "f16"
                                : text == "fp8"      ? "fp8_e4m3"
                                : text == "bfloat16" ? "bf16"
                                                     : text);
           kv_dtype_auto = text == "auto";
         },
         "vLLM's name for --kv-dtype: auto (the compute type's: bf16 on the CPU under "
         "--activations bf16, else f16, which CUDA keeps in bf16 for a BF16 model), bfloat16 "
         "(= bf16), fp8 (= fp8_e4m3), fp8_e4m3 or int8")
      ->check(OneOf({"auto", "bfloat16", "fp8", "fp8_e4m3", "int8"}))
      ->default_str("auto")
      ->excludes(option);
  return option;
}

CLI::Option* AddActivationsFlag(CLI::App& app, kernels::cpu::ActivationPrecision& activations) {
  return app
      .add_option_function<std::string>(
          "--activations",
          [&activations](const std::string& text) {
            activations = *kernels::cpu::ParseActivationPrecision(text);
          },
          "CPU backend: f32 keeps each layer's input exact; int8 quantizes it per 32 values for "
          "integer dot products with INT8/INT4 weights (faster decode; near-tied greedy choices "
          "can flip); bf16 rounds inputs and weights of every format to BF16 for Intel AMX "
          "tiles (Sapphire Rapids or later: several times f32's prefill speed)")
      ->check(OneOf({"f32", "int8", "bf16"}))
      ->default_str("f32");
}

namespace {

// Whether to declare a flag (see AddWorkerFlags); records its name either way.
using DeclareIfFresh = absl::FunctionRef<bool(const std::string& flag_names)>;

// The model and where the worker sits: coordinator, addresses, replica, rank.
void AddClusterFlags(CLI::App& app, WorkerOptions& options, DeclareIfFresh fresh) {
  if (fresh("--model")) AddString(app, "--model", options.model_path, "the model (GGUF file or HF directory); required");
  if (fresh("--coordinator")) {
    AddString(app, "--coordinator", options.coordinator_address,
              "the coordinator's gRPC endpoint HOST:PORT, or several (HOST:PORT,HOST:PORT: "
              "coordinators sharing a --leader-lock; the worker registers with the leader and "
              "follows it when another takes over); required")
        ->check(HostPortList());
  }
  if (fresh("--cluster-secret-file")) {
    AddString(app, "--cluster-secret-file", options.cluster_secret_file,
              "a file whose first line is the coordinator's cluster secret, presented on every "
              "internal call and required of every caller of this worker (default: "
              "LOOM_CLUSTER_SECRET, else none)");
  }
  if (fresh("--listen")) {
    AddString(app, "--listen", options.listen_address,
              "where the Worker service listens (port 0: any free port)")
        ->check(HostPort());
  }
  if (fresh("--advertise-address")) {
    AddString(app, "--advertise-address", options.advertise_address,
              "the address registered with the coordinator (default: the listen host with the "
              "bound port)")
        ->check(HostPort());
  }
  if (fresh("--replica-id")) {
    AddString(app, "--replica-id", options.replica_id, "this worker's replica")
        ->check(CLI::Validator([](std::string& v) { return v.empty() ? std::string("needs a non-empty id") : std::string(); }, "ID"));
  }
  if (fresh("--role")) {
    AddString(app, "--role", options.role,
              "disaggregated serving: mixed (every request), prefill (long prompts, handed to a "
              "decode replica with their KV after the first token) or decode (the hand-offs "
              "and short prompts); prefill and decode get a host KV tier as large as the pool "
              "unless --kv-offload-memory says otherwise")
        ->check(CLI::IsMember({"mixed", "prefill", "decode"}));
  }
  if (fresh("--rank")) {
    AddInt(app, "--rank", options.rank, 0, 1 << 20,
           "tensor/pipeline parallelism: this worker is rank R of --world-size ranks of its "
           "replica");
  }
  if (fresh("--world-size")) {
    AddInt(app, "--world-size", options.world_size, 1, 1 << 20,
           "ranks of this replica (tensor x pipeline parallel); they meet through the "
           "coordinator and each loads its shard");
  }
  if (fresh("--pipeline-parallel-size")) {
    AddInt(app, "--pipeline-parallel-size", options.pipeline_parallel_size, 1, 1 << 10,
           "pipeline stages of the replica (CPU): each holds a contiguous range of layers on "
           "--world-size / P tensor-parallel ranks; rank R is in stage R / (world size / P)");
  }
  if (fresh("--pipeline-layer-partition")) {
    app.add_option_function<std::string>(
           "--pipeline-layer-partition",
           [&options](const std::string& value) {
             options.pipeline_layer_partition.clear();
             for (absl::string_view part : absl::StrSplit(value, ',')) {
               int64_t layers = 0;
               if (!absl::SimpleAtoi(part, &layers)) {
                 throw CLI::ValidationError("--pipeline-layer-partition",
                                            "a comma-separated list of layer counts");
               }
               options.pipeline_layer_partition.push_back(layers);
             }
           },
           "layers per pipeline stage, in order (e.g. 18,12: the last stage also computes the LM "
           "head); the same on every stage (default: as even as possible)")
        ->type_name("L0,L1,...");
  }
  if (fresh("--rendezvous-id")) {
    AddString(app, "--rendezvous-id", options.rendezvous_id,
              "the same for every rank of one start of a replica");
  }
  if (fresh("--rendezvous-timeout-ms")) {
    AddInt(app, "--rendezvous-timeout-ms", options.rendezvous_timeout_ms, 1, 86400000,
           "how long the ranks wait for each other (rendezvous and collectives)");
  }
}

// What runs the steps and where: step backend, device, GPU, graphs, threads.
void AddExecutionFlags(CLI::App& app, WorkerOptions& options, DeclareIfFresh fresh) {
  if (fresh("--step-backend")) {
    AddString(app, "--step-backend", options.step_backend,
              "what executes the coordinator's batch plans: model (the model runner on "
              "--device) or noop (no model math: placeholder tokens, for benchmarking the "
              "coordinator)",
              {"model", "noop"});
  }
  if (fresh("--noop-engine")) {
    app.add_flag_callback(
           "--noop-engine", [&options] { options.step_backend = "noop"; },
           "short for --step-backend noop (default: off)")
        ->envname("LOOM_NOOP_ENGINE");
  }
  if (fresh("--backend")) {
    // Deprecated: "backend" also names the forward pass's device and the bench's API.
    app.add_option_function<std::string>(
           "--backend",
           [&options](const std::string& value) {
             options.step_backend = value == "cpu" ? "model" : value;
             std::fprintf(stderr, "loom-worker: --backend is deprecated: use --step-backend %s\n",
                          options.step_backend.c_str());
           },
           "deprecated name of --step-backend, cpu meaning model (default: not given)")
        ->check(CLI::IsMember({"cpu", "noop"}));
  }
  if (fresh("--device")) {
    AddString(app, "--device", options.device,
              "where the model runner runs: cuda, cpu or auto (cuda when a CUDA device is "
              "present, --kv-dtype is not f32 and --world-size is 1; tensor parallelism on "
              "CUDA, over NCCL, needs --device cuda)",
              {"cuda", "cpu", "auto"});
  }
  if (fresh("--gpu-index")) {
    AddInt(app, "--gpu-index", options.gpu_index, -1, 1 << 16,
           "cuda: the GPU this worker runs on, among the visible ones (CUDA_VISIBLE_DEVICES); "
           "-1: its --rank modulo the GPU count");
  }
  if (fresh("--cuda-graphs")) {
    AddBool(app, "--cuda-graphs", options.cuda_graphs, "replay decode steps from CUDA graphs");
  }
  if (fresh("--max-num-batched-tokens")) {
    AddInt(app, "--max-num-batched-tokens", options.max_num_batched_tokens, 1, 1 << 20,
           "cuda: the most tokens one step computes, as the coordinator's flag of this name "
           "(loom up passes it): activations for them are reserved before the KV pool takes "
           "the rest; a larger step grows them later, dropping captured graphs");
  }
  if (fresh("--threads")) {
    AddInt(app, "--threads", options.num_threads, 1, 1024,
           "CPU threads (default 0: the hardware concurrency)");
  }
}

// Accepts what ParseByteSize parses, naming the problem otherwise.
CLI::Validator ByteSizeValidator() {
  return CLI::Validator(
      [](std::string& text) {
        absl::StatusOr<int64_t> bytes = ParseByteSize(text);
        return bytes.ok() ? std::string() : std::string(bytes.status().message());
      },
      "SIZE");
}

// The KV pool and the weights' form: budgets, block size, dtypes, quantization.
void AddKvFlags(CLI::App& app, WorkerOptions& options, DeclareIfFresh fresh) {
  if (fresh("--kv-cache-memory")) {
    app.add_option_function<std::string>(
           "--kv-cache-memory",
           [&options](const std::string& text) { options.kv_cache_bytes = *ParseByteSize(text); },
           "KV pool budget in bytes, suffixes KiB/MiB/GiB (default 512MiB on cpu)")
        ->check(ByteSizeValidator())
        ->default_str("none");
  }
  if (fresh("--kv-offload-memory")) {
    app.add_option_function<std::string>(
           "--kv-offload-memory",
           [&options](const std::string& text) { options.kv_offload_bytes = *ParseByteSize(text); },
           "host-memory KV tier in bytes, suffixes KiB/MiB/GiB: cached blocks the pool "
           "evicts are kept there and reloaded on a prefix hit (0: none; the memory is "
           "committed from start-up on, in the background)")
        ->check(ByteSizeValidator())
        ->default_str("0");
  }
  if (fresh("--kv-offloading-size")) {
    app.add_option_function<double>(
           "--kv-offloading-size",
           [&options](double gib) {
             options.kv_offload_bytes = static_cast<int64_t>(gib * 1024.0 * 1024.0 * 1024.0);
           },
           "the host KV tier in GiB (vLLM's flag; --kv-offload-memory in bytes)")
        ->check(CLI::Range(0.0, 1048576.0))
        ->default_str("0");
  }
  if (fresh("--kv-shared-memory")) {
    AddBool(app, "--kv-shared-memory", options.kv_shared_memory,
            "other workers of this machine map the host KV tier: disaggregated hand-offs are "
            "pushed into it and pulled from it through shared memory; off: over TCP, as "
            "between machines");
  }
  if (fresh("--kv-pool-shared-memory")) {
    AddBool(app, "--kv-pool-shared-memory", options.kv_pool_shared_memory,
            "cpu: the KV pool lives in a memory file that other workers of this machine copy "
            "blocks straight out of (pool-to-pool transfers; a CUDA pool is shared through IPC)");
  }
  if (fresh("--kv-cache-fraction")) {
    AddNumber(app, "--kv-cache-fraction", options.kv_cache_fraction, 1e-6, 1.0,
              "KV pool budget as a fraction of MemAvailable (cpu) or of the GPU memory free "
              "after loading the weights (cuda; 0.9 there by default)");
  }
  if (fresh("--gpu-memory-utilization")) {
    AddNumber(app, "--gpu-memory-utilization", options.gpu_memory_utilization, 1e-6, 1.0,
              "cuda: the fraction of the GPU's TOTAL memory this worker may use (weights, "
              "activations and KV, as in vLLM); the KV pool gets what the weights leave of it");
  }
  if (fresh("--block-size")) {
    AddInt(app, "--block-size", options.block_size, 1, 1024, "tokens per KV block");
  }
  if (fresh("--max-model-len")) {
    AddInt(app, "--max-model-len", options.max_model_len, 0, int64_t{1} << 30,
           "refuse to start unless the KV pool holds one sequence of this many tokens (0: off)");
  }
  if (fresh("--kv-dtype")) {
    AddKvDtypeFlag(app, options.kv_dtype, options.kv_dtype_auto);
  }
  fresh("--kv-cache-dtype");  // declared with --kv-dtype; recorded so that loom up forwards it
  if (fresh("--quantization")) {
    AddString(app, "--quantization", options.quantization,
              "quantize the linear layers at load (round-to-nearest; int8/int4 in Loom's "
              "group-wise formats; fp8: E4M3 with a scale per output channel on FP8 tensor "
              "cores, CUDA compute capability 8.9+ only; \"\": as stored, an FP8 checkpoint's "
              "per-tensor or per-channel layers on the FP8 GEMM where the GPU has one)",
              {"", "int8", "int4", "fp8"});
  }
  if (fresh("--activations")) {
    AddActivationsFlag(app, options.activations);
  }
}

// Draining, metrics, the draft model and the tests' fault injection.
void AddOperationFlags(CLI::App& app, WorkerOptions& options, DeclareIfFresh fresh) {
  if (fresh("--drain-timeout-s")) {
    AddInt(app, "--drain-timeout-s", options.drain_timeout_s, 0, 86400,
           "on SIGTERM, ask the coordinator to drain this worker's replica and wait up to S "
           "seconds before stopping (0: stop at once)");
  }
  if (fresh("--metrics-port")) {
    AddInt(app, "--metrics-port", options.metrics_port, -1, 65535,
           "serve Prometheus metrics on the listen host at this port (0: any free port; -1: off)");
  }
  if (fresh("--draft-model")) {
    AddString(app, "--draft-model", options.draft_model_path,
              "speculative decoding proposes with this GGUF (the target's vocabulary) instead "
              "of n-gram lookup; the coordinator's --speculative-tokens turns speculation on")
        ->check(CLI::Validator(
            [](std::string& v) { return v.empty() ? std::string("needs a GGUF path") : ""; },
            "PATH"));
  }
  if (fresh("--debug-step-delay-ms")) {
    AddInt(app, "--debug-step-delay-ms", options.debug_step_delay_ms, 0, 3600000,
           "tests only: every step first sleeps MS, reporting progress");
  }
  if (fresh("--debug-hang-at-step")) {
    AddInt(app, "--debug-hang-at-step", options.debug_hang_at_step, 0, int64_t{1} << 40,
           "tests only: the Nth step stops making progress (0: off)");
  }
  if (fresh("--debug-kv-pool-unreadable")) {
    AddBool(app, "--debug-kv-pool-unreadable", options.debug_kv_pool_unreadable,
            "tests only: refuse pool-to-pool KV transfers into this worker, as a worker that "
            "cannot open the source's pool does");
  }
}

}  // namespace

std::vector<std::string> AddWorkerFlags(CLI::App& app, WorkerOptions& options,
                                        const std::set<std::string>& skip) {
  std::vector<std::string> names;
  // A flag is declared unless one of its names is already an option of `app` (loom up
  // declares --model, --threads, --max-model-len... itself); records the flag's name.
  auto fresh = [&](const std::string& flag_names) {
    const std::string first = flag_names.substr(0, flag_names.find(','));
    names.push_back(first.substr(2));
    return skip.count(first.substr(2)) == 0 && !AnyDeclared(app, flag_names);
  };
  AddClusterFlags(app, options, fresh);
  AddExecutionFlags(app, options, fresh);
  AddKvFlags(app, options, fresh);
  AddOperationFlags(app, options, fresh);
  return names;
}

absl::Status CheckWorkerOptions(const WorkerOptions& options) {
  if (options.model_path.empty()) return absl::InvalidArgumentError("--model is required");
  if (options.coordinator_address.empty()) {
    return absl::InvalidArgumentError("--coordinator is required");
  }
  const int budgets = options.kv_cache_bytes.has_value() + options.kv_cache_fraction.has_value() +
                      options.gpu_memory_utilization.has_value();
  if (budgets > 1) {
    return absl::InvalidArgumentError(
        "give one of --kv-cache-memory, --kv-cache-fraction and --gpu-memory-utilization");
  }
  return absl::OkStatus();
}

absl::StatusOr<WorkerOptions> ParseWorkerFlags(int argc, const char* const* argv) {
  WorkerOptions options;
  CommandLine command_line("loom-worker", "one Loom worker process");
  AddWorkerFlags(command_line.app(), options);
  std::vector<std::string> args(argv + 1, argv + argc);
  absl::StatusOr<bool> help = command_line.TryParse(std::move(args));
  if (!help.ok()) return help.status();
  if (absl::Status status = CheckWorkerOptions(options); !status.ok()) return status;
  return options;
}

}  // namespace loom::cli
