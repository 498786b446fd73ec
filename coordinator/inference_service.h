#pragma once

#include <atomic>
#include <string>
#include <vector>

#include "common/model_config.h"
#include "common/tokenizer.h"
#include "coordinator/cluster.h"
#include "loom/v1/inference.grpc.pb.h"

namespace loom::coordinator {

/// The client-facing loom.v1.Inference gRPC service: validates and tokenizes a request,
/// places it on the cluster, and streams its output until it finishes, the client
/// cancels, or the call's deadline passes (the request is then dropped at the replica's
/// next step and its blocks freed). Thread-safe.
class InferenceService final : public loom::v1::Inference::Service {
 public:
  InferenceService(Cluster& cluster, const common::ModelConfig& config,
                   const common::Tokenizer& tokenizer);

  grpc::Status Generate(grpc::ServerContext* context, const loom::v1::GenerateRequest* request,
                        grpc::ServerWriter<loom::v1::GenerateResponse>* writer) override;
  grpc::Status GetClusterStatus(grpc::ServerContext* context,
                                const loom::v1::ClusterStatusRequest* request,
                                loom::v1::ClusterStatus* response) override;

 private:
  Cluster& cluster_;
  const common::ModelConfig& config_;
  const common::Tokenizer& tokenizer_;
  const std::vector<int32_t> eos_ids_;
  std::atomic<uint64_t> next_request_number_{1};
};

}  // namespace loom::coordinator
