#include "coordinator/replica_connection.h"

#include <algorithm>
#include <random>
#include <string>
#include <utility>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/cluster_secret.h"
#include "common/step_stream.h"

namespace loom::coordinator {

absl::StatusOr<std::unique_ptr<ReplicaConnection>> ReplicaConnection::Connect(
    const std::vector<std::string>& addresses, absl::Duration connect_timeout, EventFn on_event,
    int first_sampling_rank) {
  if (addresses.empty()) return absl::InvalidArgumentError("a replica needs at least one rank");
  if (first_sampling_rank < 0 || first_sampling_rank >= static_cast<int>(addresses.size())) {
    return absl::InvalidArgumentError(
        absl::StrFormat("sampling rank %d is outside a replica of %d ranks", first_sampling_rank,
                        addresses.size()));
  }
  std::unique_ptr<ReplicaConnection> connection(new ReplicaConnection(std::move(on_event)));
  connection->first_sampling_rank_ = first_sampling_rank;
  std::random_device entropy;
  std::mt19937_64 random((uint64_t{entropy()} << 32) ^ entropy() ^
                         static_cast<uint64_t>(absl::ToUnixNanos(absl::Now())));
  connection->stream_id_ = std::max<uint64_t>(random(), 1);
  connection->ranks_.resize(addresses.size());
  for (size_t r = 0; r < addresses.size(); ++r) {
    Rank& rank = connection->ranks_[r];
    grpc::ChannelArguments arguments;
    // A plan adding many long prompts can pass gRPC's 4 MiB default.
    arguments.SetMaxSendMessageSize(256 << 20);
    rank.channel = common::CreateClusterChannel(addresses[r], arguments);
    if (!rank.channel->WaitForConnected(absl::ToChronoTime(absl::Now() + connect_timeout))) {
      return absl::UnavailableError(
          absl::StrFormat("cannot reach rank %d's worker at %s", r, addresses[r]));
    }
    rank.stub = loom::v1::Worker::NewStub(rank.channel);
    rank.context = std::make_unique<grpc::ClientContext>();
    rank.context->AddMetadata(common::kStepStreamIdMetadata,
                              std::to_string(connection->stream_id_));
    rank.stream = rank.stub->Step(rank.context.get());
  }
  // Readers start only once every stream exists (a failure cancels them all).
  for (size_t r = 0; r < addresses.size(); ++r) {
    connection->ranks_[r].reader =
        std::thread([raw = connection.get(), r] { raw->Read(static_cast<int>(r)); });
  }
  return connection;
}

ReplicaConnection::~ReplicaConnection() {
  Cancel("the replica connection closed");
  for (Rank& rank : ranks_) {
    if (rank.reader.joinable()) rank.reader.join();
  }
}

bool ReplicaConnection::Write(const loom::v1::StepPlan& plan) {
  {
    absl::MutexLock lock(&mu_);
    if (failed_) return false;
    pending_.try_emplace(plan.step_id());
  }
  for (size_t r = 0; r < ranks_.size(); ++r) {
    if (!ranks_[r].stream->Write(plan)) {
      Fail(absl::StrFormat("writing step %d to rank %d failed", plan.step_id(), r));
      return false;
    }
  }
  return true;
}

void ReplicaConnection::Cancel(const std::string& reason) {
  {
    absl::MutexLock lock(&mu_);
    if (cancel_reason_.empty()) cancel_reason_ = reason;
  }
  for (Rank& rank : ranks_) {
    if (rank.context != nullptr) rank.context->TryCancel();
  }
}

void ReplicaConnection::Fail(const std::string& reason) {
  {
    absl::MutexLock lock(&mu_);
    if (failed_) return;
    failed_ = true;
  }
  for (Rank& rank : ranks_) rank.context->TryCancel();
  on_event_({std::nullopt, reason});
}

void ReplicaConnection::Recycle(loom::v1::StepResult result) {
  absl::MutexLock lock(&mu_);
  // Two plans in flight per rank need no more than a few.
  if (spare_.size() < 2 * ranks_.size() + 2) spare_.push_back(std::move(result));
}

void ReplicaConnection::Read(int rank) {
  loom::v1::StepResult result;
  while (ranks_[rank].stream->Read(&result)) {
    // Only several sampling ranks have answers to compare.
    const bool sampling = rank >= first_sampling_rank_;
    std::vector<int32_t> tokens;
    if (sampling && static_cast<int>(ranks_.size()) - first_sampling_rank_ > 1) {
      for (const loom::v1::SequenceOutput& output : result.outputs()) {
        tokens.push_back(output.token_id());
      }
    }
    std::optional<Event> complete;
    std::string failure;
    bool handed_on = false;  // `result` went into the pending step (the sampling rank)
    {
      absl::MutexLock lock(&mu_);
      if (failed_) break;
      auto it = pending_.find(result.step_id());
      if (it == pending_.end()) {
        failure = absl::StrFormat("rank %d answered step %d, which was never sent", rank,
                                  result.step_id());
      } else {
        Pending& pending = it->second;
        if (!sampling) {
          // An earlier pipeline stage: it answers with no tokens (or its step's error,
          // which the last stage reports too).
        } else if (!pending.tokens) {
          pending.tokens = tokens;
        } else if (*pending.tokens != tokens) {
          failure = absl::StrFormat(
              "the ranks disagree on the tokens sampled in step %d (rank %d differs)",
              result.step_id(), rank);
        }
        if (pending.kv_push_error.empty() && !result.kv_push_error().empty()) {
          pending.kv_push_error = absl::StrFormat("rank %d: %s", rank, result.kv_push_error());
        }
        if (rank == first_sampling_rank_) {
          pending.rank0 = std::move(result);  // its ids are in `tokens`
          handed_on = true;
        }
        if (failure.empty() && ++pending.answers == static_cast<int>(ranks_.size())) {
          if (pending.rank0 && !pending.kv_push_error.empty()) {
            pending.rank0->set_kv_push_error(pending.kv_push_error);
          }
          complete = Event{std::move(pending.rank0), ""};
          pending_.erase(it);
        }
      }
    }
    if (!failure.empty()) {
      Fail(failure);
      return;
    }
    if (complete) on_event_(std::move(*complete));
    if (!handed_on) continue;  // Read clears it
    absl::MutexLock lock(&mu_);
    if (!spare_.empty()) {
      result.Swap(&spare_.back());
      spare_.pop_back();
    }
  }
  const grpc::Status status = ranks_[rank].stream->Finish();
  std::string reason;
  {
    absl::MutexLock lock(&mu_);
    reason = !cancel_reason_.empty()
                 ? cancel_reason_
                 : absl::StrFormat("rank %d's step stream ended (%s)", rank,
                                   status.ok() ? "closed" : status.error_message());
  }
  Fail(reason);
}

}  // namespace loom::coordinator
