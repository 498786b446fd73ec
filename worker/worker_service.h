#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "loom/v1/worker.grpc.pb.h"
#include "worker/kv_pool_fence.h"
#include "worker/kv_transfer.h"
#include "worker/step_executor.h"
#include "worker/worker_metrics.h"

namespace loom::worker {

/// The gRPC `loom.v1.Worker` service: one Step stream at a time drives the executor.
/// A new stream cancels the previous one and resets the executor (every sequence of the
/// earlier stream is dropped); each StepPlan read gets exactly one StepResult, in order.
/// Bad plans are answered with an error result, never with a crash. Thread-safe.
class WorkerService final : public loom::v1::Worker::Service {
 public:
  /// `executor` (and `metrics`, optional) must outlive the service; the service is the
  /// executor's only user.
  explicit WorkerService(StepExecutor& executor, WorkerMetrics* metrics = nullptr);

  /// The Step bidi stream (called by gRPC on its threads).
  grpc::Status Step(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<loom::v1::StepResult, loom::v1::StepPlan>* stream) override;

  /// The KV transfer (worker/kv_transfer): serves this worker's host-tier blocks, and
  /// fetches another worker's into it; with pool blocks named, the pool-to-pool transfer
  /// (worker/kv_pool_transfer). Neither waits for a running step.
  grpc::Status ReadKvBlocks(grpc::ServerContext* context,
                            const loom::v1::ReadKvBlocksRequest* request,
                            grpc::ServerWriter<loom::v1::KvBlockChunk>* writer) override;
  grpc::Status FetchKvBlocks(grpc::ServerContext* context,
                             const loom::v1::FetchKvBlocksRequest* request,
                             loom::v1::FetchKvBlocksResponse* response) override;
  /// A prefill worker's KV push over TCP into this worker's host tier (worker/kv_push_stream).
  grpc::Status WriteKvBlocks(grpc::ServerContext* context,
                             grpc::ServerReader<loom::v1::KvBlockWrite>* reader,
                             loom::v1::WriteKvBlocksResponse* response) override;
  /// Ends the current stream (after the step running now, if any) and refuses new ones
  /// with UNAVAILABLE: the process is stopping.
  void BeginShutdown();

  /// Before registering with a coordinator: ends the current stream (after the step running
  /// now, if any; no plan of it runs afterwards) and fills `request`'s cached_kv_blocks
  /// with what the pool holds (at most `max_report_bytes` of them), so the coordinator can
  /// adopt them. A new stream starts from no sequences.
  void PrepareRegistration(loom::v1::RegisterRequest& request, int64_t max_report_bytes);

  /// Sequences the executor holds after the last step; never waits for a running step.
  int num_sequences() const { return num_sequences_.load(std::memory_order_relaxed); }
  /// Steps executed since start (all streams).
  int64_t num_steps() const { return num_steps_.load(std::memory_order_relaxed); }
  /// The model's KV heads [begin, + count) this worker's pool holds (its tensor-parallel
  /// slice, as it registers them): a pool-to-pool transfer from replicas of another
  /// tensor-parallel size maps heads by them. Unset (and no host tier): only whole blocks
  /// of one source are taken.
  void SetKvHeads(int64_t begin, int64_t count) {
    kv_head_begin_.store(begin, std::memory_order_relaxed);
    num_kv_heads_.store(count, std::memory_order_release);
  }
  /// Tests only (`loom-worker --debug-kv-pool-unreadable`): every pool-to-pool transfer into
  /// this worker fails FAILED_PRECONDITION, as where the source's pool cannot be opened.
  void RefusePoolTransfers() { refuse_pool_transfers_.store(true); }

 private:
  absl::Mutex mu_;
  StepExecutor* const executor_ ABSL_PT_GUARDED_BY(mu_);
  WorkerMetrics* const metrics_;
  // Incremented by each new stream; a stream whose generation is not current stops.
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  // The current stream's context (to cancel it when a newer stream arrives), or null.
  grpc::ServerContext* active_context_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<int> num_sequences_{0};
  std::atomic<int64_t> num_steps_{0};
  std::atomic<int64_t> kv_head_begin_{0}, num_kv_heads_{0};  // SetKvHeads (0 heads: unset)
  std::atomic<bool> refuse_pool_transfers_{false};
  KvHostTier* const host_tier_;  // the executor's; null without one
  // The last step id the current stream executed (ReadKvBlocks waits for the step that
  // offloaded its blocks); 0 when a stream begins.
  std::atomic<uint64_t> last_step_id_{0};
  std::atomic<uint64_t> first_step_id_{0};  // the current step stream's first plan (0: none)
  const model::KvCache* const pool_;        // the executor's backend's; null without one
  // Pool-to-pool transfers' fence at stream changes (null: it could not be made, and pool
  // transfers are refused).
  std::unique_ptr<KvPoolFence> pool_fence_;

  // Where a step stands for a reader waiting for it (ReadKvBlocks).
  KvStepState StepState(uint64_t step_id) const;
  // The step stream `stream_id` (0: none) owns the pool from now on: pool fetches planned
  // before it stop, and readers of the pool discard what they copied meanwhile.
  void FencePool(uint64_t stream_id);
  // Pool fetches wrote these blocks: the KV ledger no longer knows what they hold.
  void ForgetWrittenBlocks() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::atomic<uint64_t> stream_id_{0};  // the current step stream's (its metadata)
  bool CurrentStream(uint64_t stream_id) const {
    return stream_id != 0 && stream_id == stream_id_.load(std::memory_order_acquire);
  }
  absl::Mutex written_mu_;
  std::vector<int32_t> written_blocks_ ABSL_GUARDED_BY(written_mu_);
};

}  // namespace loom::worker
