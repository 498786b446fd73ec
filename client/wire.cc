#include "client/wire.h"

#include <string>

namespace loom::client {

loom::v1::GenerateRequest ToWire(const GenerateRequest& request) {
  loom::v1::GenerateRequest wire;
  if (request.use_token_ids) {
    // mutable_token_ids() selects the token-id prompt even for an empty list.
    wire.mutable_token_ids()->mutable_ids()->Add(request.token_ids.begin(),
                                                 request.token_ids.end());
  } else if (request.messages.empty() || !request.text.empty()) {
    wire.set_text(request.text);
  }
  for (const ChatMessage& message : request.messages) {
    loom::v1::ChatMessage* out = wire.add_messages();
    out->set_role(message.role);
    if (message.content) out->set_content(*message.content);
    out->set_name(message.name);
    out->set_tool_call_id(message.tool_call_id);
    for (const ToolCall& call : message.tool_calls) {
      loom::v1::ToolCall* wire_call = out->add_tool_calls();
      wire_call->set_id(call.id);
      wire_call->set_name(call.name);
      wire_call->set_arguments(call.arguments);
    }
  }
  for (const Tool& tool : request.tools) {
    loom::v1::Tool* out = wire.add_tools();
    out->set_name(tool.name);
    out->set_description(tool.description);
    out->set_parameters(tool.parameters);
  }
  wire.set_tool_choice(request.tool_choice.mode);
  wire.set_tool_choice_function(request.tool_choice.function);
  if (request.parallel_tool_calls) wire.set_parallel_tool_calls(*request.parallel_tool_calls);
  if (request.add_generation_prompt) {
    wire.set_add_generation_prompt(*request.add_generation_prompt);
  }
  wire.set_continue_final_message(request.continue_final_message);
  wire.set_chat_template_kwargs(request.chat_template_kwargs);
  wire.set_reasoning_effort(request.reasoning_effort);
  const SamplingOptions& s = request.sampling;
  loom::v1::SamplingParams* sampling = wire.mutable_sampling();
  if (s.temperature) sampling->set_temperature(*s.temperature);
  if (s.top_k) sampling->set_top_k(*s.top_k);
  if (s.top_p) sampling->set_top_p(*s.top_p);
  if (s.min_p) sampling->set_min_p(*s.min_p);
  if (s.repetition_penalty) sampling->set_repetition_penalty(*s.repetition_penalty);
  if (s.presence_penalty) sampling->set_presence_penalty(*s.presence_penalty);
  if (s.frequency_penalty) sampling->set_frequency_penalty(*s.frequency_penalty);
  if (s.seed) sampling->set_seed(*s.seed);
  if (s.num_logprobs) sampling->set_num_logprobs(*s.num_logprobs);
  for (const auto& [id, bias] : s.logit_bias) (*sampling->mutable_logit_bias())[id] = bias;
  if (s.min_tokens) sampling->set_min_tokens(*s.min_tokens);
  if (request.constraint) {
    sampling->mutable_grammar()->set_kind(request.constraint->kind);
    sampling->mutable_grammar()->set_text(request.constraint->text);
  }
  wire.set_max_tokens(request.max_tokens);
  for (const std::string& stop : request.stop) wire.add_stop(stop);
  wire.mutable_stop_token_ids()->Add(request.stop_token_ids.begin(), request.stop_token_ids.end());
  wire.set_ignore_eos(request.ignore_eos);
  wire.set_priority(request.priority);
  wire.set_request_id(request.request_id);
  wire.set_model(request.model);
  wire.set_cache_salt(request.cache_salt);
  wire.set_include_stop_str_in_output(request.include_stop_str_in_output);
  if (request.skip_special_tokens) wire.set_skip_special_tokens(*request.skip_special_tokens);
  return wire;
}

namespace {

FinishReason FromWire(loom::v1::FinishReason reason) {
  switch (reason) {
    case loom::v1::FINISH_REASON_STOP:
      return FinishReason::kStop;
    case loom::v1::FINISH_REASON_LENGTH:
      return FinishReason::kLength;
    case loom::v1::FINISH_REASON_ABORT:
      return FinishReason::kAbort;
    case loom::v1::FINISH_REASON_ERROR:
      return FinishReason::kError;
    default:
      return FinishReason::kNone;
  }
}

}  // namespace

GenerateChunk FromWire(const loom::v1::GenerateResponse& response) {
  GenerateChunk chunk;
  chunk.request_id = response.request_id();
  chunk.text = response.text();
  chunk.token_ids.assign(response.token_ids().begin(), response.token_ids().end());
  for (const loom::v1::SequenceOutput& output : response.logprobs()) {
    TokenLogprobs& logprobs = chunk.logprobs.emplace_back();
    logprobs.token_id = output.token_id();
    logprobs.logprob = output.logprob();
    for (const loom::v1::TokenLogprob& top : output.top_logprobs()) {
      logprobs.top.emplace_back(top.token_id(), top.logprob());
    }
  }
  chunk.finish_reason = FromWire(response.finish_reason());
  chunk.error_message = response.error_message();
  chunk.usage.prompt_tokens = response.prompt_tokens();
  chunk.usage.completion_tokens = response.completion_tokens();
  chunk.usage.cached_prompt_tokens = response.cached_prompt_tokens();
  chunk.replica_id = response.replica_id();
  for (const loom::v1::ToolCall& call : response.tool_calls()) {
    chunk.tool_calls.push_back(ToolCall{call.id(), call.name(), call.arguments()});
  }
  chunk.content = response.content();
  if (response.has_reasoning_content()) chunk.reasoning_content = response.reasoning_content();
  return chunk;
}

ModelDescription FromWire(const loom::v1::ServedModel& model) {
  ModelDescription out;
  out.id = model.id();
  out.name = model.info().name();
  out.path = model.info().path();
  out.architecture = model.info().architecture();
  out.vocab_size = model.info().vocab_size();
  out.context_length = model.info().context_length();
  out.fingerprint = model.info().fingerprint();
  out.created = model.created();
  return out;
}

ClusterState FromWire(const loom::v1::ClusterState& state) {
  ClusterState out;
  out.model = state.model();
  out.draining = state.draining();
  out.num_healthy_replicas = state.num_healthy_replicas();
  out.num_waiting = state.num_waiting();
  out.num_running = state.num_running();
  for (const loom::v1::ReplicaStatus& r : state.replicas()) {
    ReplicaState& replica = out.replicas.emplace_back();
    replica.replica_id = r.replica_id();
    replica.healthy = r.healthy();
    replica.worker_address = r.worker_address();
    replica.backend = r.backend();
    replica.num_kv_blocks = r.num_kv_blocks();
    replica.num_free_blocks = r.num_free_blocks();
    replica.kv_cache_usage = r.kv_cache_usage();
    replica.num_running = r.num_running();
    replica.num_waiting = r.num_waiting();
    replica.num_steps = r.num_steps();
    replica.num_mixed_steps = r.num_mixed_steps();
    replica.num_preemptions = r.num_preemptions();
    replica.num_tokens_computed = r.num_tokens_computed();
    replica.schedule_seconds = r.schedule_seconds();
    replica.step_seconds = r.step_seconds();
    replica.max_plans_in_flight = r.max_plans_in_flight();
  }
  return out;
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

}  // namespace loom::client
