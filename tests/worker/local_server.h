#pragma once

// A real gRPC server on 127.0.0.1 (a free port) for the worker tests' stand-in services.

#include <chrono>
#include <memory>
#include <string>

#include "grpcpp/grpcpp.h"

namespace loom::worker::test_util {

/// Serves `service` from construction until Stop or destruction (declare it after what the
/// service's handlers use, so it stops first).
class LocalServer {
 public:
  explicit LocalServer(grpc::Service* service) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(service);
    server_ = builder.BuildAndStart();
  }
  ~LocalServer() { Stop(); }
  LocalServer(const LocalServer&) = delete;
  LocalServer& operator=(const LocalServer&) = delete;

  void Stop() {
    if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now());
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace loom::worker::test_util
