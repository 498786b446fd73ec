#include "cli/up_command.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#ifndef SYS_close_range
#define SYS_close_range 436  // the same number on every architecture Loom builds for
#endif
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "api/coordinator_server.h"
#include "cli/command_line.h"
#include "cli/serve_command.h"
#include "cli/serve_flags.h"
#include "common/cluster_secret.h"
#include "kernels/cuda_device.h"

namespace loom::cli {
namespace {

// The loom-worker next to this binary (build tree: ../worker/loom-worker; installed:
// same directory), else LOOM_WORKER_BIN, else PATH.
std::string FindWorkerBinary() {
  if (const char* env = std::getenv("LOOM_WORKER_BIN"); env != nullptr && *env) return env;
  char self[4096];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (len > 0) {
    self[len] = '\0';
    std::string dir(self);
    dir = dir.substr(0, dir.rfind('/'));
    for (const std::string& candidate : {dir + "/../worker/loom-worker", dir + "/loom-worker"}) {
      if (access(candidate.c_str(), X_OK) == 0) return candidate;
    }
  }
  return "loom-worker";
}

pid_t SpawnWorker(const std::string& binary, const std::vector<std::string>& args) {
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(binary.c_str()));
  for (const std::string& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  // `loom up` read the config file and passes its worker flags on the command line; the
  // file's other keys (serve flags) are no worker flags: the worker's environment goes
  // without LOOM_CONFIG, made here (the child of a threaded process may only exec).
  std::vector<char*> envp;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    if (std::strncmp(*entry, "LOOM_CONFIG=", 12) != 0) envp.push_back(*entry);
  }
  envp.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    // The child: default signal mask (the coordinator blocks SIGTERM/SIGINT for
    // sigtimedwait), and die with the parent so no worker outlives `loom up`.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);
    // None of the coordinator's descriptors (its HTTP and gRPC listening sockets, client
    // connections) may live on in the worker: a worker outliving a crashed coordinator
    // would hold its ports. close_range where the kernel has it (5.9), else one by one.
    // Without close_range (a kernel before 5.9, a seccomp profile refusing it), the first
    // 64 Ki descriptors one by one: the coordinator raised its limit to the hard one, which
    // can be 2^20 or more.
    if (syscall(SYS_close_range, 3U, ~0U, 0U) != 0) {
      for (int fd = 3; fd < 65536; ++fd) close(fd);
    }
    execvpe(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  return pid;
}

void StopWorkers(std::vector<pid_t>& pids) {
  for (pid_t pid : pids) kill(pid, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (pid_t pid : pids) {
    while (true) {
      const pid_t done = waitpid(pid, nullptr, WNOHANG);
      if (done == pid || done < 0) break;
      if (std::chrono::steady_clock::now() > deadline) {
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  pids.clear();
}

}  // namespace

const char* const kUpOwnedWorkerFlags[] = {
    "model",         "coordinator", "replica-id",      "rank",      "world-size",
    "rendezvous-id", "threads",     "drain-timeout-s", "gpu-index", "pipeline-parallel-size",
    "role",          nullptr};

std::optional<int> ParseUpCommandLine(int argc, const char* const* argv, UpOptions& options) {
  cli::CommandLine command_line(
      "loom up", "loom up MODEL: a coordinator and its workers on this machine (every serve and "
                 "worker flag applies)");
  CLI::App& app = command_line.app();
  cli::AddServeFlags(app, options.serve);
  cli::AddInt(app, "--data-parallel-size,--replicas", options.replicas, 1, 256,
              "data-parallel replicas, each its own worker processes");
  cli::AddInt(app, "--prefill-replicas", options.prefill_replicas, 0, 256,
              "disaggregated serving: replicas that prefill long prompts (loom-worker --role "
              "prefill) and hand them to the decode replicas with their KV; with "
              "--decode-replicas and without --replicas, no mixed replica is started");
  cli::AddInt(app, "--decode-replicas", options.decode_replicas, 0, 256,
              "disaggregated serving: replicas that decode (--role decode), the hand-offs and "
              "prompts too short to hand off");
  cli::AddInt(app, "--prefill-tensor-parallel-size", options.prefill_workers, 0, 256,
              "ranks per prefill replica (0: --tensor-parallel-size); the KV heads are mapped "
              "between the sizes when a request is handed to a decode replica");
  cli::AddInt(app, "--tensor-parallel-size,--tensor-parallel,--workers", options.workers, 1, 256,
              "ranks (worker processes) per replica, joined by gloo on the CPU or NCCL on "
              "CUDA, one GPU each (also -tp)");
  command_line.AddArgumentAlias("-tp", "--tensor-parallel-size");
  cli::AddInt(app, "--pipeline-parallel-size", options.stages, 1, 256,
              "pipeline stages per replica (CPU), each a contiguous range of layers on "
              "--tensor-parallel-size ranks; the residual stream passes stage to stage over "
              "gloo (also -pp)");
  command_line.AddArgumentAlias("-pp", "--pipeline-parallel-size");
  cli::AddInt(app, "--threads", options.threads, 0, 1024,
              "CPU threads per worker (0: cores / workers)");
  cli::AddString(app, "--worker-binary", options.worker_binary,
                 "the loom-worker to start (default: next to loom, else LOOM_WORKER_BIN, else "
                 "PATH)");
  app.add_flag("--print-worker-commands", options.print_worker_commands,
               "tests: print each worker's command line and exit (default: off)");
  std::set<std::string> owned;
  for (const char* const* name = kUpOwnedWorkerFlags; *name != nullptr; ++name) {
    owned.insert(*name);
  }
  const std::vector<std::string> worker_names =
      AddWorkerFlags(app, options.worker, owned);
  if (std::optional<int> exit_code = command_line.Parse(argc, argv)) return exit_code;
  if (options.serve.model_path.empty()) {
    return command_line.Fail("the model is required (MODEL or --model)");
  }
  // Forward by declaration: every worker flag given any way reaches the workers.
  for (const std::string& name : worker_names) {
    if (owned.count(name) > 0) continue;
    const CLI::Option* option = app.get_option_no_throw("--" + name);
    if (option == nullptr || option->count() == 0) continue;
    options.worker_flags.push_back("--" + name + "=" + option->as<std::string>());
  }
  const CLI::Option* replicas = app.get_option_no_throw("--replicas");
  if (options.prefill_replicas + options.decode_replicas > 0 && replicas != nullptr &&
      replicas->count() == 0) {
    options.replicas = 0;
  }
  if (options.threads == 0) {
    int processes = 0;
    for (const UpReplica& replica : UpReplicas(options)) processes += replica.workers;
    const int cores = static_cast<int>(std::thread::hardware_concurrency());
    options.threads = std::max(1, cores / std::max(1, processes * options.stages));
  }
  if (options.worker_binary.empty()) options.worker_binary = FindWorkerBinary();
  return std::nullopt;
}

std::vector<UpReplica> UpReplicas(const UpOptions& options) {
  std::vector<UpReplica> replicas;
  for (int r = 0; r < options.replicas; ++r) {
    replicas.push_back({absl::StrFormat("replica-%d", r), "mixed", options.workers});
  }
  for (int r = 0; r < options.prefill_replicas; ++r) {
    replicas.push_back({absl::StrFormat("prefill-%d", r), "prefill",
                        options.prefill_workers > 0 ? options.prefill_workers : options.workers});
  }
  for (int r = 0; r < options.decode_replicas; ++r) {
    replicas.push_back({absl::StrFormat("decode-%d", r), "decode", options.workers});
  }
  return replicas;
}

int UpGpuIndex(int workers_before, int rank, int cuda_device_count) {
  return (workers_before + rank) % cuda_device_count;
}

namespace {

// Whether the workers will run on CUDA: they resolve --device the same way.
bool WorkersRunOnCuda(const UpOptions& options, int cuda_device_count) {
  absl::StatusOr<std::string> device =
      ResolveDevice(options.worker.device, options.worker.kv_dtype,
                    options.workers * options.stages, cuda_device_count);
  return options.worker.step_backend == "model" && device.ok() && *device == "cuda";
}

}  // namespace

absl::Status CheckUpGpus(const UpOptions& options, int cuda_device_count) {
  if (!WorkersRunOnCuda(options, cuda_device_count)) return absl::OkStatus();
  // Every stage's ranks count for the memory split; a tensor-parallel group (one stage's
  // ranks, consecutive GPU indices) needs as many GPUs.
  int total = 0;
  int most_workers = options.workers;
  for (const UpReplica& replica : UpReplicas(options)) {
    total += replica.workers * options.stages;
    most_workers = std::max(most_workers, replica.workers);
  }
  if (most_workers > cuda_device_count) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "--tensor-parallel-size %d on CUDA needs %d GPUs (NCCL runs one rank per GPU); this "
        "machine shows %d (CUDA_VISIBLE_DEVICES counts)",
        most_workers, most_workers, cuda_device_count));
  }
  // Replicas beyond the GPUs share them. Each worker would otherwise size its KV pool from
  // the memory free when it starts (0.9 of it): the first takes the GPU and the next fails
  // or starves. Sharing needs the memory split explicitly.
  const int per_gpu = (total + cuda_device_count - 1) / cuda_device_count;
  if (per_gpu <= 1 || options.worker.kv_cache_bytes.has_value()) return absl::OkStatus();
  const std::optional<double>& share = options.worker.gpu_memory_utilization;
  if (share.has_value() && *share * per_gpu <= 1.0 + 1e-9) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrFormat(
      "%d workers (%d replicas) on %d GPU%s put %d on one GPU, and each would take "
      "the memory free when it starts%s: split it with --gpu-memory-utilization %.2f or less "
      "(each worker's share of the GPU) or --kv-cache-memory, or use fewer replicas",
      total, options.total_replicas(), cuda_device_count, cuda_device_count == 1 ? "" : "s",
      per_gpu,
      share.has_value()
          ? absl::StrFormat(" (--gpu-memory-utilization %.2f x %d is over 1)", *share, per_gpu)
          : "",
      std::floor(100.0 / per_gpu) / 100.0));
}

std::vector<std::vector<std::string>> WorkerCommands(const UpOptions& options,
                                                     const std::string& coordinator,
                                                     const std::string& rendezvous_id,
                                                     int cuda_device_count) {
  // On CUDA each worker gets its own GPU.
  const bool cuda = WorkersRunOnCuda(options, cuda_device_count);
  std::vector<std::vector<std::string>> commands;
  // A replica's ranks stage by stage: rank = stage * T + tensor-parallel rank.
  int workers_before = 0;
  for (const UpReplica& replica : UpReplicas(options)) {
    const int ranks = replica.workers * options.stages;
    for (int rank = 0; rank < ranks; ++rank) {
      // No drain of their own: `loom up` drains its coordinator before it stops them (their
      // Drain call found its port closed).
      std::vector<std::string> args = {"--model",           options.serve.model_path,
                                       "--coordinator",     coordinator,
                                       "--replica-id",      replica.id,
                                       "--threads",         std::to_string(options.threads),
                                       "--drain-timeout-s", "0"};
      if (replica.role != "mixed") args.insert(args.end(), {"--role", replica.role});
      if (ranks > 1) {
        args.insert(args.end(), {"--world-size", std::to_string(ranks), "--rank",
                                 std::to_string(rank), "--rendezvous-id", rendezvous_id});
      }
      if (options.stages > 1) {
        args.insert(args.end(), {"--pipeline-parallel-size", std::to_string(options.stages)});
      }
      if (cuda) {
        args.insert(
            args.end(),
            {"--gpu-index", std::to_string(UpGpuIndex(workers_before, rank, cuda_device_count))});
        // The runner reserves activations for the coordinator's largest step (forwarded
        // below when given).
        if (absl::c_none_of(options.worker_flags, [](const std::string& flag) {
              return absl::StartsWith(flag, "--max-num-batched-tokens=");
            })) {
          args.insert(args.end(),
                      {"--max-num-batched-tokens",
                       std::to_string(options.serve.cluster.replica.max_num_batched_tokens)});
        }
      }
      args.insert(args.end(), options.worker_flags.begin(), options.worker_flags.end());
      commands.push_back(std::move(args));
    }
    workers_before += ranks;
  }
  return commands;
}

int RunUpCommand(int argc, char** argv) {
  // Before anything may start a thread (the CUDA driver's first call, e.g. counting GPUs
  // below, may): every thread inherits the mask, and only the server's wait sees SIGTERM.
  api::CoordinatorServer::BlockShutdownSignals();
  UpOptions options;
  if (std::optional<int> exit_code = ParseUpCommandLine(argc, argv, options)) return *exit_code;
  // The processes of one `loom up` share a cluster secret: the user's (--cluster-secret-file,
  // forwarded to the workers like every worker flag, or LOOM_CLUSTER_SECRET, inherited),
  // else a new one passed to the workers in their environment, never on a command line.
  // Set before any thread starts (setenv is not thread-safe).
  if (absl::Status secret = common::LoadClusterSecret(
          options.serve.cluster_secret_file, std::getenv(common::kClusterSecretEnvironment));
      !secret.ok()) {
    std::fprintf(stderr, "loom up: %s\n", std::string(secret.message()).c_str());
    return 2;
  }
  if (!common::ClusterSecretEnabled()) {
    const std::string secret = common::NewClusterSecret();
    if (secret.empty()) {
      std::fprintf(stderr,
                   "loom up: the system's random generator failed: no cluster secret "
                   "can be made (give one with --cluster-secret-file)\n");
      return 1;
    }
    common::SetClusterSecret(secret);
    setenv(common::kClusterSecretEnvironment, secret.c_str(), 1);
  }
  if (options.print_worker_commands) {
    for (const std::vector<std::string>& command :
         WorkerCommands(options, "COORDINATOR", "RENDEZVOUS", kernels::CudaDeviceCount())) {
      std::printf("%s %s\n", options.worker_binary.c_str(), absl::StrJoin(command, " ").c_str());
    }
    return 0;
  }
  if (absl::Status gpus = CheckUpGpus(options, kernels::CudaDeviceCount()); !gpus.ok()) {
    std::fprintf(stderr, "loom up: %s\n", std::string(gpus.message()).c_str());
    return 1;
  }
  auto server = api::CoordinatorServer::Start(options.serve);
  if (!server.ok()) {
    std::fprintf(stderr, "loom up: %s\n", server.status().ToString().c_str());
    return 1;
  }
  PrintServingAddresses(**server);

  std::vector<pid_t> workers;
  const std::string coordinator = absl::StrFormat("127.0.0.1:%d", (*server)->port());
  // The ranks of one start share a rendezvous id, so a later start never meets the
  // addresses an earlier one left in the coordinator's store.
  const std::string rendezvous_id = absl::StrFormat("%d-%d", getpid(), (*server)->port());
  for (const std::vector<std::string>& args :
       WorkerCommands(options, coordinator, rendezvous_id, kernels::CudaDeviceCount())) {
    const pid_t pid = SpawnWorker(options.worker_binary, args);
    if (pid < 0) {
      std::fprintf(stderr, "loom up: cannot start %s\n", options.worker_binary.c_str());
      StopWorkers(workers);
      return 1;
    }
    workers.push_back(pid);
  }

  bool announced = false;
  int exited = 0;
  const int signal = (*server)->WaitForShutdownSignal([&] {
    if (!announced && (*server)->cluster().num_healthy() == options.total_replicas()) {
      announced = true;
      std::printf("loom: ready (%d replicas)\n", options.total_replicas());
      std::fflush(stdout);
    }
    // Reap workers that exited on their own (the coordinator keeps serving with the rest).
    for (pid_t& pid : workers) {
      int status = 0;
      if (pid > 0 && waitpid(pid, &status, WNOHANG) == pid) {
        std::fprintf(stderr, "loom up: worker %d exited (%s %d)\n", pid,
                     WIFEXITED(status) ? "status" : "signal",
                     WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
        pid = -1;
        ++exited;
      }
    }
  });
  std::fprintf(stderr, "loom up: %s: draining, then stopping %zu workers\n",
               signal == SIGINT ? "SIGINT" : "SIGTERM", workers.size() - exited);
  (*server)->DrainAndStop();
  std::erase_if(workers, [](pid_t pid) { return pid <= 0; });
  StopWorkers(workers);
  return 0;
}

}  // namespace loom::cli
