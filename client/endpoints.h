#pragma once

// Internal to loom::client (not installed): which coordinator a client calls.

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/client_context.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"
#include "grpcpp/support/status.h"
#include "loom/v1/inference.grpc.pb.h"

namespace loom::client {

/// The coordinators a client may call: ClientOptions::address, one "host:port" or several
/// separated by commas (coordinators of one cluster, one leading). Calls go to the current
/// one; after a call fails with UNAVAILABLE (Turn), the next goes to the leader the
/// coordinator named (a standby refuses with trailing metadata `loom-leader`), else to the
/// next address of the list. Channels are opened on first use and kept. Thread-safe;
/// shared by the client and its streams (a stream may outlive its client).
class Endpoints {
 public:
  Endpoints(const std::string& addresses, std::shared_ptr<grpc::ChannelCredentials> credentials,
            grpc::ChannelArguments args);

  /// The current coordinator's stub.
  std::shared_ptr<loom::v1::Inference::Stub> Stub();
  /// After a call on `context` failed with `status` and will be retried.
  void Turn(const grpc::ClientContext& context, const grpc::Status& status);

  const std::vector<std::string>& addresses() const { return addresses_; }

 private:
  const std::vector<std::string> addresses_;
  const std::shared_ptr<grpc::ChannelCredentials> credentials_;
  const grpc::ChannelArguments args_;
  absl::Mutex mu_;
  std::string current_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::shared_ptr<loom::v1::Inference::Stub>> stubs_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace loom::client
