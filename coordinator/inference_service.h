#pragma once

#include <atomic>
#include <string>
#include <vector>

#include "common/model_config.h"
#include "common/tokenizer.h"
#include "coordinator/cluster.h"
#include "coordinator/metrics.h"
#include "coordinator/served_model.h"
#include "loom/v1/inference.grpc.pb.h"

namespace loom::coordinator {

/// The client-facing loom.v1.Inference gRPC service: validates and tokenizes a request,
/// places it on the cluster, and streams its output until it finishes, the client
/// cancels, or the call's deadline passes (the request is then dropped at the replica's
/// next step and its blocks freed). Thread-safe.
class InferenceService final : public loom::v1::Inference::Service {
 public:
  /// `metrics` (optional) receives every request's timeline.
  InferenceService(Cluster& cluster, const ServedModel& model, const common::ModelConfig& config,
                   const common::Tokenizer& tokenizer, CoordinatorMetrics* metrics = nullptr);

  grpc::Status Generate(grpc::ServerContext* context, const loom::v1::GenerateRequest* request,
                        grpc::ServerWriter<loom::v1::GenerateResponse>* writer) override;
  grpc::Status Tokenize(grpc::ServerContext* context, const loom::v1::TokenizeRequest* request,
                        loom::v1::TokenizeResponse* response) override;
  grpc::Status Detokenize(grpc::ServerContext* context,
                          const loom::v1::DetokenizeRequest* request,
                          loom::v1::DetokenizeResponse* response) override;
  grpc::Status ListModels(grpc::ServerContext* context, const loom::v1::ListModelsRequest* request,
                          loom::v1::ListModelsResponse* response) override;
  grpc::Status GetClusterState(grpc::ServerContext* context,
                                const loom::v1::GetClusterStateRequest* request,
                                loom::v1::ClusterState* response) override;

 private:
  absl::Status CheckModel(const std::string& requested) const;

  Cluster& cluster_;
  const ServedModel& model_;
  const common::ModelConfig& config_;
  const common::Tokenizer& tokenizer_;
  const std::vector<int32_t> eos_ids_;
  CoordinatorMetrics* metrics_;
  std::atomic<uint64_t> next_request_number_{1};
};

}  // namespace loom::coordinator
