#include "coordinator/inference_service.h"

#include <chrono>
#include <memory>

#include "absl/strings/str_format.h"
#include "coordinator/grpc_status.h"
#include "coordinator/request_validation.h"

namespace loom::coordinator {

InferenceService::InferenceService(Cluster& cluster, const ServedModel& model,
                                   const common::ModelConfig& config,
                                   const common::Tokenizer& tokenizer,
                                   CoordinatorMetrics* metrics)
    : cluster_(cluster),
      model_(model),
      config_(config),
      tokenizer_(tokenizer),
      eos_ids_(tokenizer.EndOfGenerationIds()),
      metrics_(metrics) {}

grpc::Status InferenceService::Generate(grpc::ServerContext* context,
                                        const loom::v1::GenerateRequest* request,
                                        grpc::ServerWriter<loom::v1::GenerateResponse>* writer) {
  if (cluster_.draining()) {
    return ToGrpcStatus(absl::UnavailableError("the coordinator is shutting down (draining)"));
  }
  if (absl::Status known = CheckModel(request->model()); !known.ok()) return ToGrpcStatus(known);
  absl::StatusOr<RequestParams> params = ValidateGenerateRequest(*request, config_, tokenizer_);
  if (!params.ok()) return ToGrpcStatus(params.status());
  const int32_t prompt_tokens = static_cast<int32_t>(params->prompt_ids.size());
  const std::string request_id =
      request->request_id().empty()
          ? absl::StrFormat("req-%d", next_request_number_.fetch_add(1))
          : request->request_id();
  auto live = std::make_shared<Request>(request_id, cluster_.NextSeqId(), *std::move(params),
                                        tokenizer_, eos_ids_);
  live->set_metrics(metrics_);
  if (absl::Status placed = cluster_.Submit(live); !placed.ok()) return ToGrpcStatus(placed);

  const auto deadline = context->deadline();
  int32_t completion_tokens = 0;
  while (true) {
    std::optional<OutputEvent> event = live->outputs().Pop(absl::Milliseconds(50));
    if (context->IsCancelled()) {
      live->Cancel();
      return grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled the request");
    }
    if (std::chrono::system_clock::now() > deadline) {
      live->Cancel();
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                          "the request did not finish before its deadline");
    }
    if (!event) continue;
    completion_tokens += static_cast<int32_t>(event->token_ids.size());
    loom::v1::GenerateResponse response;
    response.set_request_id(request_id);
    response.set_text(std::move(event->text));
    response.mutable_token_ids()->Add(event->token_ids.begin(), event->token_ids.end());
    for (loom::v1::SequenceOutput& logprob : event->logprobs) {
      *response.add_logprobs() = std::move(logprob);
    }
    response.set_replica_id(event->replica_id);
    if (event->final()) {
      response.set_finish_reason(event->finish_reason);
      response.set_error_message(event->error_message);
      response.set_prompt_tokens(prompt_tokens);
      response.set_completion_tokens(completion_tokens);
      response.set_cached_prompt_tokens(event->cached_prompt_tokens);
      response.set_num_draft_tokens(event->num_draft_tokens);
      response.set_num_accepted_tokens(event->num_accepted_tokens);
    }
    if (!writer->Write(response)) {
      live->Cancel();
      return grpc::Status(grpc::StatusCode::CANCELLED, "the client went away");
    }
    if (event->final()) return grpc::Status::OK;
  }
}

absl::Status InferenceService::CheckModel(const std::string& requested) const {
  if (model_.Matches(requested)) return absl::OkStatus();
  return absl::NotFoundError(absl::StrFormat("the model '%s' does not exist; this server serves '%s'",
                                             requested, model_.id));
}

grpc::Status InferenceService::Tokenize(grpc::ServerContext*,
                                        const loom::v1::TokenizeRequest* request,
                                        loom::v1::TokenizeResponse* response) {
  if (absl::Status known = CheckModel(request->model()); !known.ok()) return ToGrpcStatus(known);
  const std::vector<int32_t> ids = tokenizer_.Encode(request->text(), request->add_special_tokens(),
                                                     request->parse_special());
  response->mutable_token_ids()->Add(ids.begin(), ids.end());
  response->set_max_model_len(static_cast<int32_t>(config_.context_length));
  return grpc::Status::OK;
}

grpc::Status InferenceService::Detokenize(grpc::ServerContext*,
                                          const loom::v1::DetokenizeRequest* request,
                                          loom::v1::DetokenizeResponse* response) {
  if (absl::Status known = CheckModel(request->model()); !known.ok()) return ToGrpcStatus(known);
  const std::vector<int32_t> ids(request->token_ids().begin(), request->token_ids().end());
  absl::StatusOr<std::string> text = tokenizer_.Decode(ids, request->skip_special_tokens());
  if (!text.ok()) return ToGrpcStatus(text.status());
  response->set_text(*std::move(text));
  return grpc::Status::OK;
}

grpc::Status InferenceService::ListModels(grpc::ServerContext*, const loom::v1::ListModelsRequest*,
                                          loom::v1::ListModelsResponse* response) {
  *response->add_models() = model_.ToProto();
  return grpc::Status::OK;
}

grpc::Status InferenceService::GetClusterState(grpc::ServerContext*,
                                               const loom::v1::GetClusterStateRequest*,
                                               loom::v1::ClusterState* response) {
  *response = cluster_.Status();
  response->set_model(model_.id);
  return grpc::Status::OK;
}

}  // namespace loom::coordinator
