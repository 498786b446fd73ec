#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "grpcpp/channel.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/channel_arguments.h"

namespace loom::common {

// The cluster secret: what the coordinator and its workers present to each other on every
// internal RPC (loom.v1.Coordinator: Register, Heartbeat, the rendezvous store, Drain;
// loom.v1.Worker: Step and the KV transfers). Without it anyone who reaches the
// coordinator's gRPC port could register a replica and be sent clients' prompts, and
// anyone who reaches a worker could drive its steps. Clients' API keys (api/api_keys) do
// not cover these services: workers hold no client key. Not covered: gloo's own TCP
// connections between ranks and pipeline stages (their addresses are exchanged through
// the guarded store, but the ports accept anyone) and the endpoint picker's port.
//
// One secret per process, installed at start-up before any channel or service exists
// (`--cluster-secret-file`, else LOOM_CLUSTER_SECRET; `loom up` makes one for its
// processes, the Helm chart keeps one in a Secret). None installed: the internal services
// are open, as on a private network. The secret travels as gRPC metadata in clear text
// like any bearer token: use a private network, or a mesh that encrypts pod traffic.

/// The metadata key the secret travels in.
inline constexpr char kClusterSecretMetadataKey[] = "x-loom-cluster-secret";
/// The environment variable read when no file is given.
inline constexpr char kClusterSecretEnvironment[] = "LOOM_CLUSTER_SECRET";

/// Installs the process's secret: the first non-blank line of `file` (surrounding
/// whitespace trimmed) when `file` is not empty, else `environment` (LOOM_CLUSTER_SECRET's
/// value; null or empty: none). NotFound for a file that cannot be read, InvalidArgument
/// for a file without a secret or a secret that is not printable ASCII (gRPC metadata);
/// no message contains the secret.
absl::Status LoadClusterSecret(const std::string& file, const char* environment);

/// Installs `secret` (empty: none). Start-up and tests only: not safe while calls run.
void SetClusterSecret(absl::string_view secret);

/// True when a secret is installed.
bool ClusterSecretEnabled();

/// A random secret (32 bytes from the OS, hex): what `loom up` gives its processes.
std::string NewClusterSecret();

/// A channel to another process of the cluster: every call on it presents the installed
/// secret (none installed: a plain channel). Insecure transport, as every internal channel.
std::shared_ptr<grpc::Channel> CreateClusterChannel(const std::string& address,
                                                    const grpc::ChannelArguments& arguments = {});

/// OK when the call presents the installed secret or none is installed; else
/// Unauthenticated (the message never echoes what was presented). Compares SHA-256
/// digests in constant time.
absl::Status CheckClusterSecret(const grpc::ServerContextBase& context);

}  // namespace loom::common
