#include "cli/status_command.h"

#include <cstdio>
#include <string>

#include "client/client.h"
#include "cli/client_flags.h"

namespace loom::cli {

int RunStatusCommand(int argc, char** argv) {
  client::ClientOptions options;
  if (std::optional<int> exit_code =
          ParseClientFlagsOnly(argc, argv, "status", "loom status: show a running cluster's replicas, KV blocks and queues", options)) {
    return *exit_code;
  }
  absl::StatusOr<std::unique_ptr<client::Client>> client = client::Client::Create(options);
  absl::StatusOr<client::ClusterState> state =
      client.ok() ? (*client)->GetClusterState() : client.status();
  if (!state.ok()) {
    std::fprintf(stderr, "loom status: %s\n", state.status().ToString().c_str());
    return 1;
  }
  std::printf("model: %s%s\nreplicas: %d healthy of %zu; running: %d; waiting: %d\n",
              state->model.c_str(), state->draining ? " (draining)" : "",
              state->num_healthy_replicas, state->replicas.size(), state->num_running,
              state->num_waiting);
  std::printf("%-16s %-9s %-7s %-21s %15s %6s %7s %7s %10s %8s\n", "REPLICA", "HEALTH", "BACKEND",
              "WORKER", "KV FREE/TOTAL", "USED", "RUNNING", "WAITING", "STEPS", "PREEMPT");
  for (const client::ReplicaState& r : state->replicas) {
    const std::string blocks =
        std::to_string(r.num_free_blocks) + "/" + std::to_string(r.num_kv_blocks);
    std::printf("%-16s %-9s %-7s %-21s %15s %5.1f%% %7d %7d %10llu %8llu\n", r.replica_id.c_str(),
                r.healthy ? "healthy" : "unhealthy", r.backend.c_str(), r.worker_address.c_str(),
                blocks.c_str(), 100.0 * r.kv_cache_usage, r.num_running, r.num_waiting,
                static_cast<unsigned long long>(r.num_steps),
                static_cast<unsigned long long>(r.num_preemptions));
  }
  return 0;
}

}  // namespace loom::cli
