#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "gloo/rendezvous/store.h"
#include "model/communicator.h"

namespace gloo {
class Context;
}

namespace loom::worker {

struct GlooOptions {
  std::string hostname = "127.0.0.1";  // the address peers reach this rank on
  // Rendezvous and every collective; a dead or stalled peer fails a call after this.
  std::chrono::milliseconds timeout{30000};
};

/// model::Communicator over gloo's TCP transport (CPU tensor parallelism). Ranks find each other
/// through a gloo rendezvous store (its keys carry each rank's listening address); gloo
/// reports failures as exceptions, which become absl::Status here.
class GlooCommunicator final : public model::Communicator {
 public:
  /// Connects rank `rank` of `world_size` to all others (a full mesh). Every rank calls it
  /// with the same store (a prefix per replica and incarnation keeps stores apart), and it
  /// returns once every rank connected (a barrier ends it). DeadlineExceeded when the
  /// others do not all show up within the timeout.
  static absl::StatusOr<std::unique_ptr<GlooCommunicator>> Connect(
      std::shared_ptr<gloo::rendezvous::Store> store, int rank, int world_size,
      const GlooOptions& options);
  ~GlooCommunicator() override;

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  absl::Status AllReduceSum(absl::Span<float> data) override;
  absl::Status AllGather(absl::Span<const float> in, absl::Span<float> out) override;
  absl::Status Broadcast(absl::Span<float> data, int root) override;
  absl::Status Barrier() override;

 private:
  GlooCommunicator(std::shared_ptr<gloo::Context> context, int rank, int world_size,
                   std::chrono::milliseconds timeout);
  // Runs one collective, turning gloo's exceptions into a Status and breaking the
  // communicator on the first failure.
  template <typename F>
  absl::Status Run(const char* what, F&& collective);

  std::shared_ptr<gloo::Context> context_;
  int rank_;
  int world_size_;
  std::chrono::milliseconds timeout_;
  absl::Status broken_;  // OK until a collective failed
};

}  // namespace loom::worker
