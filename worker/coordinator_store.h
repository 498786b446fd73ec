#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "gloo/rendezvous/store.h"
#include "grpcpp/grpcpp.h"
#include "loom/v1/worker.grpc.pb.h"

namespace loom::worker {

/// gloo's rendezvous store backed by the coordinator's StoreSet/StoreGet RPCs: how the
/// ranks of a tensor-parallel replica find each other without another service. Every key
/// is prefixed with `prefix` (replica and incarnation), so a restarted replica never reads
/// a dead incarnation's addresses. gloo's Store interface reports errors by throwing;
/// failures throw std::runtime_error, which GlooCommunicator::Connect turns into a Status.
class CoordinatorStore final : public gloo::rendezvous::Store {
 public:
  CoordinatorStore(std::shared_ptr<grpc::Channel> channel, std::string prefix,
                   std::chrono::milliseconds timeout);

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  std::vector<std::string> Get(const std::vector<std::string>& keys,
                               std::chrono::milliseconds timeout);

  std::unique_ptr<loom::v1::Coordinator::Stub> stub_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
};

}  // namespace loom::worker
