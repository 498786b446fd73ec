#pragma once

#include <atomic>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "api/api_keys.h"
#include "api/embedder.h"
#include "api/reasoning_parser.h"
#include "api/served_model.h"
#include "api/stream_pump.h"
#include "common/formats/model_config.h"
#include "common/jinja/chat_template.h"
#include "common/tokenizer/tokenizer.h"
#include "coordinator/cluster.h"
#include "coordinator/leader_election.h"
#include "coordinator/metrics.h"
#include "loom/v1/inference.grpc.pb.h"

namespace loom::api {

/// The client-facing loom.v1.Inference gRPC service: validates and tokenizes a request,
/// places it on the cluster, and streams its output until it finishes, the client
/// cancels, or the call's deadline passes (the request is then dropped at the replica's
/// next step and its blocks freed). Generate uses gRPC's callback API: no thread waits per
/// stream; one StreamPump thread and gRPC's own threads write every stream. A stream
/// carries at most one message per `stream_interval` (the first and the final ones go
/// out at once): tokens that come sooner wait and share the next message. Thread-safe.
class InferenceService final
    : public loom::v1::Inference::WithCallbackMethod_Generate<loom::v1::Inference::Service> {
 public:
  /// `metrics` (optional) receives every request's timeline. With `api_keys`, every call
  /// must carry metadata `authorization: Bearer KEY` (UNAUTHENTICATED otherwise).
  InferenceService(coordinator::Cluster& cluster, const ServedModel& model,
                   const common::ModelConfig& config, const common::Tokenizer& tokenizer,
                   coordinator::CoordinatorMetrics* metrics = nullptr,
                   absl::Duration stream_interval = absl::ZeroDuration(),
                   ApiKeys api_keys = ApiKeys());
  /// Chat requests (GenerateRequest.messages) are rendered with `chat_template` (null:
  /// the model has none, and they fail with FAILED_PRECONDITION). Call before serving.
  void set_chat_template(const common::ChatTemplate* chat_template) { chat_template_ = chat_template; }
  /// A chat's last message splits the reply's <think> part into `reasoning_content`
  /// (--reasoning-parser, as /v1/chat/completions). Call before serving.
  void set_reasoning_format(ReasoningFormat format) { reasoning_ = format; }
  /// With a leader election, a follower refuses Generate and Embed with UNAVAILABLE and
  /// the leader's address (`loom-leader` metadata: the SDK turns there). Call before serving.
  void set_leader_election(const coordinator::LeaderElection* election) {
    election_.store(election);
  }
  /// Call after the gRPC server stopped (every stream is done by then).
  ~InferenceService() override;

  grpc::ServerWriteReactor<loom::v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const loom::v1::GenerateRequest* request) override;
  grpc::Status Tokenize(grpc::ServerContext* context, const loom::v1::TokenizeRequest* request,
                        loom::v1::TokenizeResponse* response) override;
  grpc::Status Embed(grpc::ServerContext* context, const loom::v1::EmbedRequest* request,
                     loom::v1::EmbedResponse* response) override;
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
  // OK when the call carries an accepted key (or none is configured).
  absl::Status CheckApiKey(const grpc::ServerContextBase& context) const;

  coordinator::Cluster& cluster_;
  const ServedModel& model_;
  const common::ModelConfig& config_;
  const common::Tokenizer& tokenizer_;
  const common::ChatTemplate* chat_template_ = nullptr;
  ReasoningFormat reasoning_ = ReasoningFormat::kNone;
  std::atomic<const coordinator::LeaderElection*> election_{nullptr};  // set after start
  const std::vector<int32_t> eos_ids_;
  coordinator::CoordinatorMetrics* metrics_;
  const absl::Duration stream_interval_;  // >= 0: the least time between two messages
  const ApiKeys api_keys_;
  Embedder embedder_;
  std::atomic<uint64_t> next_request_number_{1};
  class GenerateStream;
  StreamPump pump_;  // drives every GenerateStream
};

}  // namespace loom::api
