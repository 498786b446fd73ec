#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "loom/v1/worker.grpc.pb.h"

namespace loom::coordinator {

/// The step streams to every rank of one replica (one rank without tensor or pipeline
/// parallelism). A plan goes to every rank; a step is complete when every rank answered
/// it, and then the first sampling rank's result stands for the replica (rank 0, or with
/// pipeline stages the first rank of the last stage; earlier stages answer without
/// tokens). The sampling ranks sample from identical logits with identical per-sequence
/// RNGs, so their tokens must agree: a disagreement is reported as a failure (it would mean
/// the ranks diverged). The first stream that ends fails the replica. Events go to
/// `on_event` from the reader threads, in step order.
class ReplicaConnection {
 public:
  /// A completed step (`result`) or the failure that ends the connection
  /// (`failure`, no result).
  struct Event {
    std::optional<loom::v1::StepResult> result;
    std::string failure;
  };
  using EventFn = std::function<void(Event)>;

  /// Opens a Step stream to each address (rank r at addresses[r]), waiting up to
  /// `connect_timeout` for each channel; ranks from `first_sampling_rank` on sample.
  /// Unavailable naming the rank that cannot be reached.
  static absl::StatusOr<std::unique_ptr<ReplicaConnection>> Connect(
      const std::vector<std::string>& addresses, absl::Duration connect_timeout, EventFn on_event,
      int first_sampling_rank = 0);
  ~ReplicaConnection();  // Cancel()s and joins the readers

  int world_size() const { return static_cast<int>(ranks_.size()); }
  /// This connection's id, sent with every rank's Step call (common/step_stream.h): random,
  /// so no other connection (of this coordinator or an earlier one) has it.
  uint64_t stream_id() const { return stream_id_; }
  /// Sends `plan` to every rank; false when a stream is broken (a failure event follows).
  bool Write(const loom::v1::StepPlan& plan);
  /// Ends every stream (the readers then report `reason` unless a failure came first).
  void Cancel(const std::string& reason);
  /// Hands back an event's result once it was applied: the readers parse the next results
  /// into it, reusing its output messages instead of allocating them every step.
  void Recycle(loom::v1::StepResult result);

 private:
  struct Rank {
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<loom::v1::Worker::Stub> stub;
    std::unique_ptr<grpc::ClientContext> context;
    std::unique_ptr<grpc::ClientReaderWriter<loom::v1::StepPlan, loom::v1::StepResult>> stream;
    std::thread reader;
  };
  struct Pending {
    int answers = 0;
    std::optional<loom::v1::StepResult> rank0;   // the first sampling rank's
    // The first KV push error any rank answered: each rank pushes its own KV heads (or
    // layers), so one rank's failure fails the push, whichever rank it is.
    std::string kv_push_error;
    std::optional<std::vector<int32_t>> tokens;  // the first answer's sampled ids
    std::string mismatch;
  };

  explicit ReplicaConnection(EventFn on_event) : on_event_(std::move(on_event)) {}
  void Read(int rank);
  void Fail(const std::string& reason);

  EventFn on_event_;
  std::vector<Rank> ranks_;
  int first_sampling_rank_ = 0;
  uint64_t stream_id_ = 0;
  absl::Mutex mu_;
  std::map<uint64_t, Pending> pending_ ABSL_GUARDED_BY(mu_);  // by step id
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  std::string cancel_reason_ ABSL_GUARDED_BY(mu_);
  std::vector<loom::v1::StepResult> spare_ ABSL_GUARDED_BY(mu_);  // Recycle()d results
};

}  // namespace loom::coordinator
