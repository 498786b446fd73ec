#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "api/served_model.h"
#include "common/formats/model_config.h"
#include "common/jinja/chat_template.h"
#include "common/tokenizer/tokenizer.h"
#include "coordinator/cluster.h"
#include "coordinator/leader_election.h"
#include "coordinator/metrics.h"
#include "envoy_ext_proc/external_processor.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace loom::api {

/// The header that names the replica an endpoint picker chose; the coordinator's HTTP API
/// places the request there first (engine::Request::preferred_replica).
inline constexpr char kReplicaHeader[] = "x-loom-replica";
/// The Gateway API Inference Extension's endpoint header and metadata key.
inline constexpr char kDestinationHeader[] = "x-gateway-destination-endpoint";

/// The endpoint picker of the Gateway API Inference Extension (`loom serve
/// --endpoint-picker-port`): Envoy's external processing protocol (ext_proc), one stream
/// per HTTP request a gateway routes to an InferencePool of Loom coordinator pods.
///
/// What it picks: the pool's endpoints are coordinators, of which the leader serves (the
/// others are standbys), so every request goes to the leader's HTTP API (this coordinator
/// when it leads, else the leader it knows, at the same HTTP port). Inside that endpoint it
/// picks the replica: the request body (a completion or a chat, tokenized and templated
/// as the API would) is scored by the cluster's router with the prefix index and load
/// (Cluster::Pick), and the choice rides on `x-loom-replica`, which the leader honours.
/// The endpoint goes out as the protocol requires: the `x-gateway-destination-endpoint`
/// header and `envoy.lb` dynamic metadata. The proxy's subset hint
/// (`envoy.lb.subset_hint` / `x-gateway-destination-endpoint-subset`) is honoured: a
/// leader outside it is a 503. Refusals are immediate responses with OpenAI error bodies:
/// 404 for a model this pool does not serve, 503 when no replica (or no leader) can serve,
/// 429 (with Retry-After) when every replica's queue is full.
///
/// Body modes: FULL_DUPLEX_STREAMED (the extension's; assumed when the proxy sends no
/// protocol_config): the body is gathered, then the headers response (with the picked
/// endpoint) and the whole body go back; BUFFERED / BUFFERED_PARTIAL: headers continue
/// and the pick rides on the body response; NONE / STREAMED: the pick is made from the
/// headers alone (no replica). The response passes through unchanged.
class EndpointPicker final
    : public envoy::service::ext_proc::v3::ExternalProcessor::CallbackService {
 public:
  /// `http_port`: the coordinators' HTTP API port (the pool's target port); `self_host`:
  /// this coordinator's address as the pool's endpoints name it. Everything must outlive
  /// the picker; `election` may be null (a lone coordinator always leads).
  EndpointPicker(coordinator::Cluster& cluster, const ServedModel& model,
                 const common::ModelConfig& config, const common::Tokenizer& tokenizer,
                 const common::ChatTemplate* chat_template,
                 const coordinator::LeaderElection* election, std::string self_host, int http_port,
                 coordinator::CoordinatorMetrics* metrics = nullptr);

  grpc::ServerBidiReactor<envoy::service::ext_proc::v3::ProcessingRequest,
                          envoy::service::ext_proc::v3::ProcessingResponse>*
  Process(grpc::CallbackServerContext* context) override;

  /// One request's decision: routed (`status` 0) to `endpoint`, on `replica_id` when one
  /// was scored; or refused with HTTP `status` and `message`.
  struct Decision {
    int status = 0;
    std::string message;
    std::string endpoint;
    std::string replica_id;
    int64_t cached_tokens = 0;
  };
  /// Decides for a request to `path` with `body` (empty: none seen), limited to `subset`
  /// when the proxy gave one (null: any endpoint).
  Decision Decide(std::string_view path, const std::string& body,
                  const std::vector<std::string>* subset) const;

 private:
  class Stream;
  // The leader's HTTP endpoint ("host:port"), empty when no leader is known.
  std::string LeaderEndpoint() const;

  coordinator::Cluster& cluster_;
  const ServedModel& model_;
  const common::ModelConfig& config_;
  const common::Tokenizer& tokenizer_;
  const common::ChatTemplate* chat_template_;
  const coordinator::LeaderElection* election_;
  const std::string self_host_;
  const int http_port_;
  coordinator::CoordinatorMetrics* const metrics_;  // null: not counted
};

}  // namespace loom::api
