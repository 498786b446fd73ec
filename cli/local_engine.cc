#include "cli/local_engine.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <memory>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_format.h"
#include "common/sampling_params.h"
#include "common/status_macros.h"
#include "engine/request_validation.h"
#include "engine/sequence.h"
#include "engine/step_plan.h"

namespace loom::cli {
namespace {

engine::SchedulerConfig SchedulerConfigFor(const worker::StepBackend& backend,
                                           const LocalEngineOptions& options) {
  engine::SchedulerConfig config;
  config.block_size = static_cast<int32_t>(backend.block_size());
  config.num_blocks = backend.num_kv_blocks();
  config.max_num_batched_tokens = options.max_num_batched_tokens;
  config.max_num_seqs = options.max_num_seqs;
  config.max_waiting = INT32_MAX;  // Generate bounds what it adds
  config.enable_prefix_caching = options.enable_prefix_caching;
  config.speculation = options.speculation;
  config.speculation.pipelined = false;  // one plan in flight
  config.sliding_window = backend.config().WindowOfEveryLayer();
  return config;
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

std::vector<int32_t> EngineResult::token_ids() const {
  std::vector<int32_t> ids;
  ids.reserve(outputs.size());
  for (const loom::v1::SequenceOutput& output : outputs) ids.push_back(output.token_id());
  return ids;
}

// The requests RunTogether runs: where each one's results go.
struct LocalEngine::Run {
  const TokenCallback* on_token = nullptr;
  std::vector<EngineResult>* results = nullptr;
  absl::flat_hash_map<uint64_t, size_t> index_of;  // seq_id -> index in Generate's requests
};

LocalEngine::LocalEngine(worker::StepBackend& backend, const common::Tokenizer& tokenizer,
                         LocalEngineOptions options, worker::StepExecutorOptions executor_options)
    : backend_(backend),
      tokenizer_(tokenizer),
      options_(options),
      eos_ids_(tokenizer.EndOfGenerationIds()),
      engine_(SchedulerConfigFor(backend, options), "local",
              {.on_token = [this](engine::Request& request, const loom::v1::SequenceOutput& output,
                                  bool finished) { OnToken(request, output, finished); },
               .on_end = nullptr,  // an ended request leaves engine_.requests()
               .on_handoff = nullptr}),
      executor_(backend, executor_options) {}

absl::StatusOr<engine::RequestParams> LocalEngine::Validate(const EngineRequest& request,
                                                            size_t index) const {
  auto bad = [index](const absl::Status& status) {
    return absl::Status(status.code(), absl::StrFormat("request %d: %s", index, status.message()));
  };
  loom::v1::GenerateRequest proto;
  proto.mutable_token_ids()->mutable_ids()->Add(request.prompt_ids.begin(),
                                                request.prompt_ids.end());
  *proto.mutable_sampling() = common::SamplingParamsToProto(request.sampling);
  proto.set_max_tokens(request.max_tokens);
  for (const std::string& stop : request.stop) proto.add_stop(stop);
  proto.mutable_stop_token_ids()->Add(request.stop_token_ids.begin(), request.stop_token_ids.end());
  proto.set_ignore_eos(request.ignore_eos);
  if (request.num_speculative_tokens >= 0) {
    proto.set_num_speculative_tokens(request.num_speculative_tokens);
  }
  absl::StatusOr<engine::RequestParams> params =
      engine::ValidateGenerateRequest(proto, config(), tokenizer_);
  if (!params.ok()) return bad(params.status());
  const int64_t prompt_len = static_cast<int64_t>(params->prompt_ids.size());
  if (request.score_prompt_from != 0 &&
      (request.score_prompt_from < 1 || request.score_prompt_from >= prompt_len)) {
    return bad(absl::InvalidArgumentError(
        absl::StrFormat("score_prompt_from is %d, must be 0 or in [1, %d) (the prompt's length)",
                        request.score_prompt_from, prompt_len)));
  }
  // The scheduler refuses what can never fit as the cluster does (InvalidArgument); here
  // the pool is the caller's choice, so it is a resource that ran out.
  const int64_t block_size = backend_.block_size();
  const int64_t blocks =
      engine::MaxBlocksHeld(engine_.scheduler().config(), prompt_len + params->max_tokens);
  if (blocks > backend_.num_kv_blocks()) {
    return bad(absl::ResourceExhaustedError(absl::StrFormat(
        "the prompt (%d tokens) plus max_tokens (%d) needs %d KV blocks of %d tokens, the pool "
        "has %d",
        prompt_len, params->max_tokens, blocks, block_size, backend_.num_kv_blocks())));
  }
  return params;
}

absl::StatusOr<std::vector<EngineResult>> LocalEngine::Generate(
    const std::vector<EngineRequest>& requests, const TokenCallback& on_token, bool batched) {
  std::vector<engine::RequestParams> params;
  params.reserve(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    LOOM_ASSIGN_OR_RETURN(engine::RequestParams checked, Validate(requests[i], i));
    params.push_back(std::move(checked));
  }
  std::vector<EngineResult> results(requests.size());
  if (batched) {
    std::vector<size_t> all(requests.size());
    for (size_t i = 0; i < all.size(); ++i) all[i] = i;
    LOOM_RETURN_IF_ERROR(RunTogether(requests, params, all, on_token, results));
  } else {
    for (size_t i = 0; i < requests.size(); ++i) {
      LOOM_RETURN_IF_ERROR(RunTogether(requests, params, {i}, on_token, results));
    }
  }
  return results;
}

bool LocalEngine::Execute(const engine::SchedulerOutput& out, loom::v1::StepResult& result,
                          absl::Status& error) {
  engine::BuildStepPlan(out, next_step_id_++, plan_);
  executor_.Execute(plan_, result);
  ++num_steps_;
  if (result.error_code() == 0) return true;
  error = absl::Status(static_cast<absl::StatusCode>(result.error_code()),
                       "the step executor rejected the step: " + result.error_message());
  return false;
}

void LocalEngine::OnToken(engine::Request& request, const loom::v1::SequenceOutput& output,
                          bool finished) {
  auto it = run_->index_of.find(request.seq_id());
  if (it == run_->index_of.end()) return;
  const size_t index = it->second;
  EngineResult& into = (*run_->results)[index];
  std::optional<engine::OutputEvent> event = request.outputs().TryPop();
  into.outputs.push_back(output);
  std::string_view text;
  if (event.has_value()) {
    into.text += event->text;
    text = event->text;
    if (event->final()) {
      into.finish_reason = event->finish_reason;
      into.cached_prompt_tokens = event->cached_prompt_tokens;
      into.num_draft_tokens = event->num_draft_tokens;
      into.num_accepted_tokens = event->num_accepted_tokens;
    }
  }
  if (*run_->on_token) (*run_->on_token)(index, TokenEvent{output, text, finished});
}

absl::Status LocalEngine::RunTogether(const std::vector<EngineRequest>& requests,
                                      std::vector<engine::RequestParams>& params,
                                      const std::vector<size_t>& indices,
                                      const TokenCallback& on_token,
                                      std::vector<EngineResult>& results) {
  Run run;
  run.on_token = &on_token;
  run.results = &results;
  run_ = &run;
  absl::Status error;
  for (size_t index : indices) {
    const uint64_t seq_id = next_seq_id_++;
    const int32_t score_from = requests[index].score_prompt_from;
    if (score_from > 0) {
      results[index].prompt_logprobs.assign(params[index].prompt_ids.size() - score_from, 0.0);
    }
    auto request = std::make_shared<engine::Request>(absl::StrFormat("local-%d", seq_id), seq_id,
                                                     params[index], tokenizer_, eos_ids_);
    // Validate ruled out what Admit refuses; should it refuse, the loop below releases what
    // was admitted before.
    error = engine_.Admit(std::move(request), score_from);
    if (!error.ok()) break;
    run.index_of[seq_id] = index;
  }

  loom::v1::StepResult result;
  engine::SchedulerOutput out;
  engine::StepRecord record;
  std::vector<uint64_t> stepped;  // unfinished sequences a step counts for
  // Until every request finished and the executor was told to release them.
  while (error.ok() && engine_.scheduler().has_work()) {
    const auto start = std::chrono::steady_clock::now();
    if (!engine_.Plan(out, record)) {
      error = absl::InternalError("the scheduler has work but planned nothing");
      break;
    }
    if (!Execute(out, result, error)) break;
    for (const loom::v1::PromptLogprobs& scored : result.prompt_logprobs()) {
      auto it = run.index_of.find(scored.seq_id());
      if (it == run.index_of.end()) continue;
      EngineResult& into = results[it->second];
      const int32_t from = requests[it->second].score_prompt_from;
      for (int i = 0; i < scored.logprobs_size(); ++i) {
        const int64_t slot = int64_t{scored.first_token()} + i - from;
        if (slot >= 0 && slot < static_cast<int64_t>(into.prompt_logprobs.size())) {
          into.prompt_logprobs[slot] = scored.logprobs(i);
        }
      }
    }
    stepped.clear();
    for (const auto& [seq_id, unused] : engine_.requests()) stepped.push_back(seq_id);
    engine_.Apply(record, result);
    if (!out.scheduled.empty()) {
      const double seconds = SecondsSince(start);
      for (uint64_t seq_id : stepped) {
        EngineResult& into = results[run.index_of[seq_id]];
        (out.num_prefill_tokens > 0 ? into.prefill_seconds : into.decode_seconds) += seconds;
      }
    }
  }
  // The core holds only this run's requests and forgets each one as it ends.
  if (error.ok() && engine_.requests().empty()) {
    run_ = nullptr;
    return absl::OkStatus();
  }
  if (error.ok()) error = absl::InternalError("the engine stopped with requests unfinished");
  // The executor dropped the sequences the failed plan named; end every one of ours (blocks
  // back to the pool) and tell the executor about the others.
  std::vector<uint64_t> left;
  for (const auto& [seq_id, unused] : engine_.requests()) left.push_back(seq_id);
  for (uint64_t seq_id : left) {
    engine_.End(seq_id, loom::v1::FINISH_REASON_ERROR, std::string(error.message()));
  }
  while (engine_.Plan(out, record)) {
    absl::Status ignored;
    Execute(out, result, ignored);
  }
  engine_.scheduler().ForgetPrefixCache();  // the failed step may have left blocks half written
  run_ = nullptr;
  return error;
}

}  // namespace loom::cli
