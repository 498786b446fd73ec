#include "worker/communicator_factory.h"

#include <grpcpp/grpcpp.h>

#include <utility>

#include "absl/strings/str_format.h"
#include "common/cluster_secret.h"
#include "worker/coordinator_store.h"
#include "worker/gloo_communicator.h"
#include "worker/nccl_communicator.h"

namespace loom::worker {

absl::StatusOr<std::unique_ptr<model::Communicator>> ConnectCommunicator(
    const CommunicatorOptions& options) {
  auto store = std::make_shared<CoordinatorStore>(
      common::CreateClusterChannel(options.coordinator_address),
      absl::StrFormat("tp/%s/%s/", options.replica_id, options.rendezvous_id), options.timeout);
  if (options.cuda) {
    absl::StatusOr<std::unique_ptr<NcclCommunicator>> connected = NcclCommunicator::Connect(
        store, options.rank, options.world_size, options.gpu_index, options.timeout);
    if (!connected.ok()) return connected.status();
    return std::unique_ptr<model::Communicator>(*std::move(connected));
  }
  GlooOptions gloo;
  gloo.hostname = options.hostname;
  gloo.timeout = options.timeout;
  absl::StatusOr<std::unique_ptr<GlooCommunicator>> connected =
      GlooCommunicator::Connect(store, options.rank, options.world_size, gloo);
  if (!connected.ok()) return connected.status();
  return std::unique_ptr<model::Communicator>(*std::move(connected));
}

absl::StatusOr<std::unique_ptr<PipelineLink>> ConnectPipelineLink(
    const CommunicatorOptions& options) {
  if (options.cuda) {
    return absl::UnimplementedError("pipeline stages on CUDA devices are not built");
  }
  auto store = std::make_shared<CoordinatorStore>(
      common::CreateClusterChannel(options.coordinator_address),
      absl::StrFormat("pp/%s/%s/", options.replica_id, options.rendezvous_id), options.timeout);
  PipelineLinkOptions link;
  link.hostname = options.hostname;
  link.timeout = options.timeout;
  return PipelineLink::Connect(std::move(store), options.rank, options.world_size, link);
}

}  // namespace loom::worker
