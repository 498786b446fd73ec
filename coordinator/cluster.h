#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/kv_index.h"
#include "coordinator/replica.h"
#include "coordinator/router.h"
#include "engine/request.h"
#include "loom/v1/inference.pb.h"
#include "loom/v1/worker.pb.h"

namespace loom::coordinator {

struct ClusterOptions {
  ReplicaOptions replica;
  RouterOptions router;
  absl::Duration heartbeat_timeout = absl::Seconds(5);  // silence that marks a worker dead
  // The longest heartbeat interval told to workers at registration (HeartbeatInterval).
  int32_t heartbeat_interval_ms = 500;
  // Disaggregated serving, when prefill replicas serve: see Cluster::Submit. The threshold
  // itself is ReplicaOptions::max_local_prefill_length (the decode replica's). A prefill
  // replica holding this many requests already is passed over; when every one is, the
  // prompt is prefilled locally (--max-prefill-queue-size, Dynamo's name; 0, the default:
  // no limit). With the threshold measured, a prefill replica whose expected first token
  // comes later than the decode replica's own is passed over too.
  int64_t max_prefill_queue_size = 0;
  // Cross-replica prefix fetch: a request placed on a replica while another replica of the
  // same layout, both with host tiers, holds at least this many more blocks of its prefix
  // fetches them from it instead of recomputing (--kv-fetch-min-blocks; 0: never).
  int64_t kv_fetch_min_blocks = 4;
};

/// The heartbeat interval workers are told: heartbeat_interval_ms, or a quarter of the
/// heartbeat timeout or of the no-progress timeout where that is shorter (at least 10 ms),
/// so several reports fall inside either timeout.
absl::Duration HeartbeatInterval(const ClusterOptions& options);

/// The replicas a coordinator drives (data parallel), their registration and liveness,
/// and request placement: the Router ranks the healthy replicas (by default by the prompt
/// tokens each has cached, from the cluster-wide KvIndex the replicas publish to, and
/// their load). Requests whose replica lost its worker before they produced output are
/// placed again here. Thread-safe.
class Cluster {
 public:
  /// `model_fingerprint`: workers must serve the model with this fingerprint.
  Cluster(ClusterOptions options, std::string model_fingerprint);
  ~Cluster();  // Stop()s

  /// A worker registers: checks protocol version, model and topology (FailedPrecondition
  /// naming the mismatch), then (re)connects its replica.
  absl::StatusOr<loom::v1::RegisterResponse> Register(const loom::v1::RegisterRequest& request);
  /// NotFound for a worker id the coordinator does not know (it should register again).
  absl::Status Heartbeat(const loom::v1::HeartbeatRequest& request);

  /// Places a request. Unavailable when draining or no replica is healthy;
  /// ResourceExhausted when every healthy replica's waiting queue is full.
  /// Disaggregated serving (cluster_disaggregation.cc): while prefill replicas and others
  /// serve, a request goes to the others (decode and mixed replicas) unless its prompt's
  /// uncached tokens on the one chosen for it exceed that replica's local_prefill_limit()
  /// and a prefill replica's queue is below max_prefill_queue_size: then that prefill
  /// replica computes the prompt and its first token and hands it to that decode replica,
  /// which fetches the KV and decodes the rest.
  absl::Status Submit(std::shared_ptr<engine::Request> request);
  /// For an API request that Submits `parts` requests at once (prompts x samples, inputs):
  /// InvalidArgument (a 400: retrying cannot help) when they exceed what every registered
  /// replica's queue together takes even when empty (the sum of their --max-waiting), so
  /// the batch is refused before any part takes a queue slot another client needs. OK
  /// otherwise, and when no replica is registered (Submit answers that).
  absl::Status CheckBatchFits(int64_t parts, std::string_view what) const;
  /// Where Submit would place a prompt now, without placing it (the endpoint picker):
  /// the router's first choice among the healthy serving replicas with room (running plus
  /// waiting below max_num_seqs + max_waiting), and the prompt tokens it holds cached.
  /// Unavailable when draining or none is healthy; ResourceExhausted when none has room.
  struct Placement {
    std::string replica_id;
    int64_t cached_tokens = 0;
  };
  absl::StatusOr<Placement> Pick(absl::Span<const int32_t> prompt_ids, std::string_view cache_salt);
  uint64_t NextSeqId() { return next_seq_id_.fetch_add(1); }

  /// A worker of `worker_id`'s replica is shutting down: no request is placed on the
  /// replica from now on (until a worker registers for it again); waits until the replica
  /// holds no request, or `timeout`. Returns the requests left (0: drained). NotFound for
  /// a worker id the coordinator does not know.
  absl::StatusOr<int64_t> DrainReplica(const std::string& worker_id, absl::Duration timeout);

  /// Refuses new requests from now on (SIGTERM).
  void StartDrain() { draining_.store(true); }
  bool draining() const { return draining_.load(); }
  /// Waits until no replica holds a request, or `timeout`; true when idle.
  bool WaitIdle(absl::Duration timeout) const;
  int num_healthy() const;
  const KvIndex& kv_index() const { return kv_index_; }
  loom::v1::ClusterState Status() const;
  /// Aborts every request and stops the replicas' loops. Idempotent.
  void Stop();

 private:
  // The replica to fetch the request's prefix from when it is placed on candidates[chosen]
  // (ClusterOptions::kv_fetch_min_blocks); null: none.
  Replica* FetchSource(absl::Span<Replica* const> candidates, size_t chosen,
                       absl::Span<const engine::BlockHash> hashes) const;
  // Moves the candidate named `replica_id` (when `order` holds it) to the front of `order`.
  static void PreferFirst(absl::Span<Replica* const> candidates, const std::string& replica_id,
                          std::vector<size_t>& order);
  // The healthy replicas placement may choose (not draining), except `excluded`.
  std::vector<Replica*> Candidates(const Replica* excluded = nullptr) const;
  // The router's order of `candidates` for a prompt of `prompt_tokens` tokens whose full
  // blocks (of `block_size`) have `hashes`.
  RouteDecision Rank(absl::Span<Replica* const> candidates, int64_t prompt_tokens,
                     absl::Span<const engine::BlockHash> hashes, int32_t block_size);
  static int64_t PromptTokens(const engine::Request& request) {
    return static_cast<int64_t>(request.params().prompt_ids.size());
  }
  // Disaggregated serving (cluster_disaggregation.cc). Takes the prefill replicas out of
  // `candidates` when others serve too, and returns them.
  static std::vector<Replica*> SplitPrefill(std::vector<Replica*>& candidates);
  // Places a long prompt on a prefill replica, to be handed to the decode replica the
  // router picks among `serving`; nullopt: place it among `serving` as usual.
  std::optional<absl::Status> PlaceDisaggregated(const std::shared_ptr<engine::Request>& request,
                                                 absl::Span<Replica* const> serving,
                                                 absl::Span<Replica* const> prefill,
                                                 absl::Span<const engine::BlockHash> hashes,
                                                 int32_t block_size);
  // Replica::HandOffFn: `source` prefilled the request; `target` (or, if it refuses,
  // another decode or mixed replica, else the source itself) fetches its KV and decodes.
  void HandOff(std::shared_ptr<engine::Request> request, Replica* source, Replica* target,
               KvExport exported);
  void Retry(std::shared_ptr<engine::Request> request);
  void Monitor();

  const ClusterOptions options_;
  const std::string model_fingerprint_;
  // Declared before replicas_: the replicas publish to it until they are destroyed.
  KvIndex kv_index_;
  Router router_;
  std::atomic<uint64_t> next_seq_id_{1};
  std::atomic<bool> draining_{false};

  mutable absl::Mutex mu_;
  // Replicas are created on first registration and never removed (a dead one waits for
  // its worker to come back), so pointers into the map stay valid.
  std::map<std::string, std::unique_ptr<Replica>> replicas_ ABSL_GUARDED_BY(mu_);
  // Ranks of tensor-parallel replicas registered so far, until all of a replica's have.
  struct PendingRanks {
    int32_t world_size = 0;
    std::vector<std::optional<loom::v1::RegisterRequest>> ranks;
  };
  std::map<std::string, PendingRanks> pending_ranks_ ABSL_GUARDED_BY(mu_);
  // Replicas being drained or drained (Coordinator.Drain): never candidates for placement.
  // A replica leaves the set when its workers register again.
  std::set<std::string> draining_replicas_ ABSL_GUARDED_BY(mu_);
  // The KV element type each replica's workers registered with (for the metrics).
  std::map<std::string, std::string> kv_dtypes_ ABSL_GUARDED_BY(mu_);
  // Prefill and decode replicas whose KV layouts differ (their prompts stay on the decode
  // replica), as "prefill>decode": logged once each.
  std::set<std::string> unmatched_layouts_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread monitor_;
};

}  // namespace loom::coordinator
