#include "worker/worker_service.h"

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "common/cluster_secret.h"
#include "common/grpc_status.h"
#include "common/step_stream.h"
#include "worker/kv_pool_transfer.h"
#include "worker/kv_push_stream.h"
#include "worker/kv_transfer.h"

namespace loom::worker {

namespace {
const char kShuttingDown[] = "the worker is shutting down";

// The coordinator's id of a Step stream (its metadata); 0 when not sent.
uint64_t StreamIdOf(const grpc::ServerContext& context) {
  const auto found = context.client_metadata().find(common::kStepStreamIdMetadata);
  uint64_t id = 0;
  if (found == context.client_metadata().end() ||
      !absl::SimpleAtoi(absl::string_view(found->second.data(), found->second.size()), &id)) {
    return 0;
  }
  return id;
}
}  // namespace

WorkerService::WorkerService(StepExecutor& executor, WorkerMetrics* metrics)
    : executor_(&executor),
      metrics_(metrics),
      host_tier_(executor.host_tier()),
      pool_(executor.backend().kv_pool()) {
  absl::StatusOr<std::unique_ptr<KvPoolFence>> fence = KvPoolFence::Create();
  if (fence.ok()) {
    pool_fence_ = *std::move(fence);
  } else {
    std::fprintf(stderr, "loom-worker: pool-to-pool KV transfers are off: %s\n",
                 std::string(fence.status().message()).c_str());
  }
}

KvStepState WorkerService::StepState(uint64_t step_id) const {
  // Step ids rise across the coordinator's streams: one below this stream's first was
  // planned for an earlier stream, whose later plans never ran here.
  const uint64_t first = first_step_id_.load(std::memory_order_acquire);
  if (first != 0 && step_id < first) return KvStepState::kGone;
  // The plan that offloads the blocks ran, or at least its copies did. Read before the
  // failures: a failure is recorded before its step counts as run.
  const bool ran = last_step_id_.load(std::memory_order_acquire) >= step_id ||
                   executor_->kv_copied_step_id() >= step_id;
  // The blocks may come from the copies of any plan that was in flight when they were
  // exported (a few before step_id: kExportDepth covers pipelined plans and stages).
  constexpr uint64_t kExportDepth = 16;
  const uint64_t since = step_id > kExportDepth ? step_id - kExportDepth : 0;
  if (executor_->kv_copies_failed(since, step_id)) return KvStepState::kGone;
  return ran ? KvStepState::kRan : KvStepState::kPending;
}

void WorkerService::FencePool(uint64_t stream_id) {
  // First: a fetch batch that checks its stream after this sees another (refused); one that
  // checked before is waited for by NewStream.
  stream_id_.store(stream_id, std::memory_order_release);
  first_step_id_.store(0, std::memory_order_release);
  if (pool_fence_ != nullptr) pool_fence_->NewStream();
}

void WorkerService::ForgetWrittenBlocks() {
  std::vector<int32_t> blocks;
  {
    absl::MutexLock lock(&written_mu_);
    blocks.swap(written_blocks_);
  }
  executor_->ForgetKvBlocks(blocks);
}

grpc::Status WorkerService::ReadKvBlocks(grpc::ServerContext* context,
                                         const loom::v1::ReadKvBlocksRequest* request,
                                         grpc::ServerWriter<loom::v1::KvBlockChunk>* writer) {
  if (absl::Status secret = common::CheckClusterSecret(*context); !secret.ok()) {
    return common::ToGrpcStatus(secret);
  }
  const auto step_state = [this](uint64_t step_id) { return StepState(step_id); };
  if (request->pool_blocks_size() > 0) {
    if (pool_fence_ == nullptr) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "this worker's pool-to-pool transfers are off");
    }
    return ServeKvPoolBlocks(
        context, pool_, *pool_fence_, [this](uint64_t id) { return CurrentStream(id); }, *request,
        writer, step_state);
  }
  const grpc::Status status = ServeKvBlocks(context, host_tier_, *request, writer, step_state);
  if (status.ok() && host_tier_ != nullptr) {
    host_tier_->RecordRemote(request->host_slots_size() * host_tier_->slot_bytes(), 0, 0);
  }
  return status;
}

grpc::Status WorkerService::FetchKvBlocks(grpc::ServerContext* context,
                                          const loom::v1::FetchKvBlocksRequest* request,
                                          loom::v1::FetchKvBlocksResponse* response) {
  if (absl::Status secret = common::CheckClusterSecret(*context); !secret.ok()) {
    return common::ToGrpcStatus(secret);
  }
  absl::StatusOr<loom::v1::FetchKvBlocksResponse> fetched;
  if (request->dest_blocks_size() > 0 && refuse_pool_transfers_.load()) {
    fetched = absl::FailedPreconditionError(
        "this worker opens no other worker's KV pool (--debug-kv-pool-unreadable)");
  } else if (request->dest_blocks_size() > 0) {
    KvPoolDestination dest;
    dest.pool = pool_;
    dest.fence = pool_fence_.get();
    if (host_tier_ != nullptr) dest.heads = host_tier_->layout();
    if (const int64_t heads = num_kv_heads_.load(std::memory_order_acquire); heads > 0) {
      dest.heads.kv_head_begin = kv_head_begin_.load(std::memory_order_relaxed);
      dest.heads.num_kv_heads = heads;
    }
    dest.current_stream = [this](uint64_t stream_id) { return CurrentStream(stream_id); };
    dest.step_state = [this](uint64_t step_id) { return StepState(step_id); };
    dest.written = [this](absl::Span<const int32_t> blocks) {
      absl::MutexLock lock(&written_mu_);
      written_blocks_.insert(written_blocks_.end(), blocks.begin(), blocks.end());
    };
    fetched = FetchKvPoolBlocks(dest, *request, context);
  } else {
    fetched = worker::FetchKvBlocks(host_tier_, *request, context);
  }
  if (!fetched.ok()) {
    std::fprintf(stderr, "loom-worker: KV fetch from %s failed: %s\n",
                 request->sources_size() > 0 ? request->sources(0).address().c_str() : "nowhere",
                 std::string(fetched.status().message()).c_str());
    return common::ToGrpcStatus(fetched.status());
  }
  *response = *std::move(fetched);
  return grpc::Status::OK;
}

grpc::Status WorkerService::WriteKvBlocks(grpc::ServerContext* context,
                                          grpc::ServerReader<loom::v1::KvBlockWrite>* reader,
                                          loom::v1::WriteKvBlocksResponse* response) {
  if (absl::Status secret = common::CheckClusterSecret(*context); !secret.ok()) {
    return common::ToGrpcStatus(secret);
  }
  const grpc::Status status = ReceiveKvBlocks(context, host_tier_, reader, response);
  if (!status.ok()) {
    std::fprintf(stderr, "loom-worker: KV pushed from %s refused: %s\n", context->peer().c_str(),
                 status.error_message().c_str());
  }
  return status;
}

void WorkerService::PrepareRegistration(loom::v1::RegisterRequest& request,
                                        int64_t max_report_bytes) {
  absl::MutexLock lock(&mu_);
  // The stream running now belongs to a coordinator this worker is leaving (or that lost
  // it): stopped here, so no plan of it changes the blocks reported below.
  ++generation_;
  FencePool(/*stream_id=*/0);
  ForgetWrittenBlocks();
  if (active_context_ != nullptr) {
    std::fprintf(stderr, "loom-worker: registering again: the current step stream ends\n");
    active_context_->TryCancel();
    active_context_ = nullptr;
  }
  executor_->Reset().IgnoreError();  // Reset cannot fail; it returns a Status by convention.
  num_sequences_.store(0, std::memory_order_relaxed);
  request.clear_cached_kv_blocks();
  executor_->kv_ledger().Report(max_report_bytes, request.mutable_cached_kv_blocks());
}

void WorkerService::BeginShutdown() {
  absl::MutexLock lock(&mu_);
  shutting_down_ = true;
  if (active_context_ != nullptr) active_context_->TryCancel();
}

grpc::Status WorkerService::Step(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<loom::v1::StepResult, loom::v1::StepPlan>* stream) {
  // Before anything else: a caller without the secret must not cancel the current stream.
  if (absl::Status secret = common::CheckClusterSecret(*context); !secret.ok()) {
    return common::ToGrpcStatus(secret);
  }
  uint64_t generation = 0;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return grpc::Status(grpc::StatusCode::UNAVAILABLE, kShuttingDown);
    generation = ++generation_;
    if (active_context_ != nullptr) {
      std::fprintf(stderr, "loom-worker: a new step stream from %s replaces the current one\n",
                   context->peer().c_str());
      active_context_->TryCancel();
    }
    active_context_ = context;
    executor_->Reset().IgnoreError();  // Reset cannot fail; it returns a Status by convention.
    // Step ids count per stream: a fetch waits for this stream's steps, not an earlier one's.
    last_step_id_.store(0, std::memory_order_release);
    FencePool(StreamIdOf(*context));
    num_sequences_.store(0, std::memory_order_relaxed);
  }

  grpc::Status status = grpc::Status::OK;
  // Both messages live across steps: parsing into a cleared message and building a cleared
  // result reuse the repeated fields' elements instead of allocating them per step.
  loom::v1::StepPlan plan;
  loom::v1::StepResult result;
  while (stream->Read(&plan)) {
    const auto received = std::chrono::steady_clock::now();
    {
      absl::MutexLock lock(&mu_);
      if (shutting_down_) {
        status = grpc::Status(grpc::StatusCode::UNAVAILABLE, kShuttingDown);
        break;
      }
      if (generation_ != generation) {
        status = grpc::Status(grpc::StatusCode::ABORTED, "replaced by a newer step stream");
        break;
      }
      // A coordinator that cancelled the stream lost this worker and gives the slots of
      // its pushes back: nothing more is written into them.
      if (first_step_id_.load(std::memory_order_relaxed) == 0) {
        first_step_id_.store(plan.step_id(), std::memory_order_release);
      }
      // Pool transfers the coordinator gave up on write no more; what transfers wrote, the
      // ledger no longer knows.
      if (pool_fence_ != nullptr) pool_fence_->CloseHolds(plan.kv_push_holds_closed());
      ForgetWrittenBlocks();
      executor_->Execute(plan, result, [context] { return context->IsCancelled(); });
      last_step_id_.store(plan.step_id(), std::memory_order_release);
      num_sequences_.store(executor_->num_sequences(), std::memory_order_relaxed);
    }
    num_steps_.fetch_add(1, std::memory_order_relaxed);
    if (result.error_code() != 0) {
      std::fprintf(stderr, "loom-worker: step %llu rejected: %s\n",
                   static_cast<unsigned long long>(plan.step_id()), result.error_message().c_str());
    }
    result.mutable_timings()->set_total_seconds(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - received).count());
    if (metrics_ != nullptr) {
      int64_t tokens = 0;
      for (const loom::v1::ScheduledSequence& scheduled : plan.scheduled()) {
        tokens += scheduled.num_tokens();
      }
      metrics_->RecordStep(result.timings(), plan.scheduled_size(), tokens,
                           result.error_code() != 0);
      metrics_->SetSequences(num_sequences_.load(std::memory_order_relaxed));
      metrics_->RecordForwardPassStats(executor_->backend().forward_pass_stats());
      if (executor_->host_tier() != nullptr) {
        metrics_->RecordKvTransfers(executor_->host_tier()->stats());
      }
    }
    if (!stream->Write(result)) break;
  }

  absl::MutexLock lock(&mu_);
  if (generation_ == generation) {
    // The coordinator closed (or lost) the stream: its sequences are gone with it, and so is
    // its claim on the pool's blocks.
    active_context_ = nullptr;
    FencePool(/*stream_id=*/0);
    executor_->Reset().IgnoreError();
    num_sequences_.store(0, std::memory_order_relaxed);
  }
  return status;
}

}  // namespace loom::worker
