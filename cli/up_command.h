#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "cli/worker_options.h"
#include "api/coordinator_server.h"

namespace loom::cli {

/// `loom up`'s command line: the serve flags, its own, and the worker's flags (declared by
/// AddWorkerFlags, so a new worker flag is accepted and forwarded without edits).
struct UpOptions {
  api::ServeOptions serve;
  int replicas = 1;  // --data-parallel-size, --replicas: mixed ones (0 with the two below)
  // Disaggregated serving: replicas started with --role prefill and --role decode
  // (--prefill-replicas, --decode-replicas); the prefill ones with their own tensor-parallel
  // size (--prefill-tensor-parallel-size; 0: `workers`).
  int prefill_replicas = 0;
  int decode_replicas = 0;
  int prefill_workers = 0;
  int workers = 1;   // --tensor-parallel-size, -tp, --tensor-parallel, --workers
  int stages = 1;    // --pipeline-parallel-size, -pp: stages of `workers` ranks each
  int threads = 0;   // per worker; 0: cores / workers
  std::string worker_binary;
  WorkerOptions worker;  // the worker flags' values (forwarded as given, not from here)
  // Every worker flag set (command line, environment or --config) as `--name=value`,
  // passed to every worker.
  std::vector<std::string> worker_flags;
  bool print_worker_commands = false;  // tests: print the workers' argv and exit

  int total_replicas() const { return replicas + prefill_replicas + decode_replicas; }
};

/// One replica `loom up` starts: its id, role and tensor-parallel ranks.
struct UpReplica {
  std::string id;    // replica-N (mixed), prefill-N, decode-N
  std::string role;  // loom-worker --role
  int workers = 1;
};
/// The replicas of `options`: mixed, then prefill, then decode ones.
std::vector<UpReplica> UpReplicas(const UpOptions& options);

/// The worker flags `loom up` sets per worker itself (not accepted from its command line).
extern const char* const kUpOwnedWorkerFlags[];

/// Parses `loom up`'s argv (argv[0] is "up"). Returns nullopt to go on, or the exit code
/// after printing help (0) or one error line (2).
std::optional<int> ParseUpCommandLine(int argc, const char* const* argv, UpOptions& options);

/// The GPU `loom up` gives rank `rank` of a replica whose first rank is the
/// `workers_before`-th worker it starts (replica-major) on a machine with
/// `cuda_device_count` visible devices: (workers_before + rank) modulo the count, so the
/// ranks of a replica, and the replicas, take distinct GPUs while there are enough.
int UpGpuIndex(int workers_before, int rank, int cuda_device_count);

/// FailedPrecondition when the workers will run on CUDA with more ranks per replica than
/// the machine's `cuda_device_count` GPUs (NCCL refuses two ranks of a group on one GPU);
/// replicas beyond the GPUs may share them. OK otherwise.
absl::Status CheckUpGpus(const UpOptions& options, int cuda_device_count);

/// The argv (without the binary) of each worker process, replica-major. When the workers
/// will run on CUDA (their --device resolves to cuda on a machine with
/// `cuda_device_count` devices), each gets --gpu-index UpGpuIndex(...).
std::vector<std::vector<std::string>> WorkerCommands(const UpOptions& options,
                                                     const std::string& coordinator,
                                                     const std::string& rendezvous_id,
                                                     int cuda_device_count = 0);

/// `loom up MODEL [--data-parallel-size R] [--tensor-parallel-size T] [serve and worker
/// flags]`: a coordinator and its workers on this machine (R x P x T `loom-worker`
/// processes). Ctrl-C / SIGTERM drains, then stops the workers.
int RunUpCommand(int argc, char** argv);

}  // namespace loom::cli
