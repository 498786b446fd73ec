#include "cli/up_command.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "coordinator/coordinator_server.h"

namespace loom::coordinator {
namespace {

constexpr char kUsage[] =
    "usage: loom up --model PATH [--replicas R] [--tensor-parallel T] [--threads N]\n"
    "               [--backend cpu|noop] [--kv-cache-memory SIZE] [--kv-dtype f16|f32]\n"
    "               [--activations f32|int8] [--draft-model PATH]\n"
    "               [--worker-binary PATH] [serve flags]\n"
    "  --replicas R        data-parallel replicas, one worker process each (default 1)\n"
    "  --tensor-parallel T ranks (worker processes) per replica, joined by gloo (default 1;\n"
    "                      --workers is the same)\n"
    "  --threads N         CPU threads per worker (default: cores / workers)\n"
    "serve flags:\n";

struct UpOptions {
  ServeOptions serve;
  int replicas = 1;
  int workers = 1;
  int threads = 0;
  std::vector<std::string> worker_flags;  // passed through to every worker
  std::string worker_binary;
};

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
    execvp(argv[0], argv.data());
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

int RunUpCommand(int argc, char** argv) {
  UpOptions options;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help") {
      std::fprintf(stderr, "%s%s", kUsage, kServeFlagsHelp);
      return 0;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "loom up: %s needs a value\n%s", flag.c_str(), kUsage);
      return 2;
    }
    const std::string value = argv[++i];
    std::string error;
    int number = 0;
    if (ParseServeFlag(flag, value, options.serve, error)) {
      if (!error.empty()) {
        std::fprintf(stderr, "loom up: %s\n", error.c_str());
        return 2;
      }
    } else if (flag == "--replicas" || flag == "--workers" || flag == "--tensor-parallel" ||
               flag == "--threads") {
      if (!absl::SimpleAtoi(value, &number) || number < 1 || number > 256) {
        std::fprintf(stderr, "loom up: %s needs an integer in [1, 256], got '%s'\n",
                     flag.c_str(), value.c_str());
        return 2;
      }
      (flag == "--replicas"  ? options.replicas
       : flag == "--threads" ? options.threads
                             : options.workers) = number;
    } else if (flag == "--backend" || flag == "--kv-cache-memory" ||
               flag == "--kv-cache-fraction" || flag == "--kv-dtype" ||
               flag == "--block-size" || flag == "--activations" || flag == "--draft-model") {
      options.worker_flags.push_back(flag);
      options.worker_flags.push_back(value);
    } else if (flag == "--worker-binary") {
      options.worker_binary = value;
    } else {
      std::fprintf(stderr, "loom up: unknown flag %s\n%s", flag.c_str(), kUsage);
      return 2;
    }
  }
  if (options.serve.model_path.empty()) {
    std::fprintf(stderr, "loom up: --model is required\n%s", kUsage);
    return 2;
  }
  if (options.threads == 0) {
    const int cores = static_cast<int>(std::thread::hardware_concurrency());
    options.threads = std::max(1, cores / (options.replicas * options.workers));
  }
  if (options.worker_binary.empty()) options.worker_binary = FindWorkerBinary();

  CoordinatorServer::BlockShutdownSignals();
  auto server = CoordinatorServer::Start(options.serve);
  if (!server.ok()) {
    std::fprintf(stderr, "loom up: %s\n", server.status().ToString().c_str());
    return 1;
  }
  std::printf("loom: coordinator listening on %s\n", (*server)->address().c_str());
  if ((*server)->http_port() > 0) {
    std::printf("loom: OpenAI-compatible HTTP API on http://%s:%d\n",
                (*server)->options().host.c_str(), (*server)->http_port());
  }
  std::fflush(stdout);

  std::vector<pid_t> workers;
  const std::string coordinator = absl::StrFormat("127.0.0.1:%d", (*server)->port());
  // The ranks of one start share a rendezvous id, so a later start never meets the
  // addresses an earlier one left in the coordinator's store.
  const std::string rendezvous_id = absl::StrFormat("%d-%d", getpid(), (*server)->port());
  for (int r = 0; r < options.replicas; ++r) {
    for (int rank = 0; rank < options.workers; ++rank) {
      std::vector<std::string> args = {"--model",       options.serve.model_path,
                                       "--coordinator", coordinator,
                                       "--replica-id",  absl::StrFormat("replica-%d", r),
                                       "--threads",     std::to_string(options.threads)};
      if (options.workers > 1) {
        args.insert(args.end(), {"--world-size", std::to_string(options.workers), "--rank",
                                 std::to_string(rank), "--rendezvous-id", rendezvous_id});
      }
      args.insert(args.end(), options.worker_flags.begin(), options.worker_flags.end());
      const pid_t pid = SpawnWorker(options.worker_binary, args);
      if (pid < 0) {
        std::fprintf(stderr, "loom up: cannot start %s\n", options.worker_binary.c_str());
        StopWorkers(workers);
        return 1;
      }
      workers.push_back(pid);
    }
  }

  bool announced = false;
  int exited = 0;
  const int signal = (*server)->WaitForShutdownSignal([&] {
    if (!announced && (*server)->cluster().num_healthy() == options.replicas) {
      announced = true;
      std::printf("loom: ready (%d replicas)\n", options.replicas);
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

}  // namespace loom::coordinator
