#pragma once

#include <string>

namespace loom::api {

/// Notices that an HTTP client went away while its request is still running, so the
/// request can be cancelled and its KV blocks freed. cpp-httplib hands handlers no socket
/// and writes nothing until a response starts, so a non-streaming request would otherwise
/// run to the end for nobody. The accepted socket is found once by its address pair (the
/// handler's connection stays open while the handler runs, so the match is unique), then
/// polled for the peer's FIN or RST. Linux only (POLLRDHUP); elsewhere PeerClosed()
/// answers false and requests run to the end.
class PeerConnection {
 public:
  PeerConnection(const std::string& local_addr, int local_port, const std::string& remote_addr,
                 int remote_port);

  /// True once the client closed its side of the connection (or reset it). Cheap: one
  /// poll(2) with a zero timeout.
  bool PeerClosed() const;
  /// The socket found, -1 when none matched (PeerClosed() then answers false).
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
};

}  // namespace loom::api
