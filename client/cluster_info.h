#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::client {

/// A model the cluster serves (ListModels).
struct ModelDescription {
  std::string id;            // the name requests pass as `model`
  std::string name;          // general.name of the GGUF file
  std::string path;          // as given to the coordinator (on its machine)
  std::string architecture;  // llama, qwen2, ...
  int64_t vocab_size = 0;
  int64_t context_length = 0;
  std::string fingerprint;  // hex digest of the GGUF's metadata and tensor table
  int64_t created = 0;      // unix seconds the coordinator started serving it
};

/// One replica (a worker group) as the coordinator sees it.
struct ReplicaState {
  std::string replica_id;
  bool healthy = false;
  std::string worker_address;
  std::string backend;  // "cpu", "cuda", "noop"
  int64_t num_kv_blocks = 0;
  int64_t num_free_blocks = 0;
  double kv_cache_usage = 0;  // used / total KV blocks, 0..1
  int32_t num_running = 0;
  int32_t num_waiting = 0;
  uint64_t num_steps = 0;
  uint64_t num_mixed_steps = 0;
  uint64_t num_preemptions = 0;
  uint64_t num_tokens_computed = 0;
  double schedule_seconds = 0;
  double step_seconds = 0;
  int32_t max_plans_in_flight = 0;
};

/// GetClusterState: replicas, queue depth, draining.
struct ClusterState {
  std::string model;
  bool draining = false;
  int32_t num_healthy_replicas = 0;
  int32_t num_waiting = 0;
  int32_t num_running = 0;
  std::vector<ReplicaState> replicas;
};

}  // namespace loom::client
