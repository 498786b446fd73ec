#pragma once

#include <string>

#include "absl/time/time.h"

namespace loom::client {

/// How a call that failed with UNAVAILABLE before any output arrived is tried again.
/// A Generate call is never retried once a response message arrived: the server may have
/// produced (and charged for) tokens the caller has already seen.
struct RetryPolicy {
  /// Attempts in all, the first included; 1 turns retries off.
  int max_attempts = 5;
  /// The wait before the second attempt; each later wait is `backoff_multiplier` times the
  /// previous one, never more than `max_backoff`. No attempt starts past the call's deadline.
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(2);
  double backoff_multiplier = 2.0;
};

/// Transport security. Disabled: plaintext (grpc::InsecureChannelCredentials).
struct TlsOptions {
  bool enabled = false;
  /// PEM file of the CAs that sign the server's certificate; empty: gRPC's default roots.
  std::string root_certs_path;
  /// PEM files of a client certificate and its key, for servers that require mutual TLS;
  /// both or neither.
  std::string cert_chain_path;
  std::string private_key_path;
  /// The name the server certificate must carry when it differs from the address's host
  /// (tests with self-signed certificates); empty: the host of `address`.
  std::string server_name_override;
};

struct ClientOptions {
  /// host:port of a coordinator's gRPC endpoint (`loom serve --grpc-port`), or several
  /// separated by commas (a leader and its standby coordinators: a call refused by a
  /// standby, or whose coordinator went away before it started, is retried on the leader
  /// the standby named, else on the next address).
  std::string address = "127.0.0.1:50051";
  TlsOptions tls;
  /// The coordinator's API key (`loom serve --api-key`), sent with every call as metadata
  /// `authorization: Bearer <api_key>`; empty: none. Calls without the right key fail with
  /// UNAUTHENTICATED when the server requires one.
  std::string api_key;
  /// Deadline of calls whose CallOptions leave it unset; InfiniteDuration: none.
  absl::Duration default_timeout = absl::InfiniteDuration();
  RetryPolicy retry;
  /// HTTP/2 keep-alive ping period for long idle streams; zero: gRPC's default (off). The
  /// server must permit pings this often or it closes the connection.
  absl::Duration keepalive_time = absl::ZeroDuration();
};

/// Per-call settings.
struct CallOptions {
  /// Deadline of the whole call, retries and backoff included; InfiniteDuration: the
  /// client's default_timeout.
  absl::Duration timeout = absl::InfiniteDuration();
};

}  // namespace loom::client
