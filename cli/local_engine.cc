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

coordinator::SchedulerConfig SchedulerConfigFor(const worker::StepBackend& backend,
                                                const LocalEngineOptions& options) {
  coordinator::SchedulerConfig config;
  config.block_size = static_cast<int32_t>(backend.block_size());
  config.num_blocks = backend.num_kv_blocks();
  config.max_num_batched_tokens = options.max_num_batched_tokens;
  config.max_num_seqs = options.max_num_seqs;
  config.max_waiting = INT32_MAX;  // Generate bounds what it adds
  config.enable_prefix_caching = options.enable_prefix_caching;
  config.speculation = options.speculation;
  config.speculation.pipelined = false;  // one plan in flight
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

// A request being run: the coordinator's view of it (detokenization, stop checks).
struct LocalEngine::Running {
  size_t index = 0;  // in Generate's requests
  std::unique_ptr<coordinator::Request> request;
  bool finished = false;
};

LocalEngine::LocalEngine(worker::StepBackend& backend, const common::Tokenizer& tokenizer,
                         LocalEngineOptions options, worker::StepExecutorOptions executor_options)
    : backend_(backend),
      tokenizer_(tokenizer),
      options_(options),
      eos_ids_(tokenizer.EndOfGenerationIds()),
      scheduler_(SchedulerConfigFor(backend, options)),
      executor_(backend, executor_options) {}

absl::StatusOr<coordinator::RequestParams> LocalEngine::Validate(const EngineRequest& request,
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
  absl::StatusOr<coordinator::RequestParams> params =
      coordinator::ValidateGenerateRequest(proto, config(), tokenizer_);
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
  const int64_t blocks = (prompt_len + params->max_tokens + block_size - 1) / block_size;
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
  std::vector<coordinator::RequestParams> params;
  params.reserve(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    LOOM_ASSIGN_OR_RETURN(coordinator::RequestParams checked, Validate(requests[i], i));
    params.push_back(std::move(checked));
  }
  std::vector<EngineResult> results(requests.size());
  if (batched) {
    std::vector<size_t> all(requests.size());
    for (size_t i = 0; i < all.size(); ++i) all[i] = i;
    LOOM_RETURN_IF_ERROR(Run(requests, params, all, on_token, results));
  } else {
    for (size_t i = 0; i < requests.size(); ++i) {
      LOOM_RETURN_IF_ERROR(Run(requests, params, {i}, on_token, results));
    }
  }
  return results;
}

bool LocalEngine::Execute(const coordinator::SchedulerOutput& out, loom::v1::StepResult& result,
                          absl::Status& error) {
  coordinator::BuildStepPlan(out, next_step_id_++, plan_);
  executor_.Execute(plan_, result);
  ++num_steps_;
  if (result.error_code() == 0) return true;
  error = absl::Status(static_cast<absl::StatusCode>(result.error_code()),
                       "the step executor rejected the step: " + result.error_message());
  return false;
}

absl::Status LocalEngine::Run(const std::vector<EngineRequest>& requests,
                              std::vector<coordinator::RequestParams>& params,
                              const std::vector<size_t>& indices, const TokenCallback& on_token,
                              std::vector<EngineResult>& results) {
  absl::flat_hash_map<uint64_t, Running> running;
  for (size_t index : indices) {
    const uint64_t seq_id = next_seq_id_++;
    Running& entry = running[seq_id];
    entry.index = index;
    coordinator::RequestParams& request_params = params[index];
    auto seq = std::make_unique<coordinator::Sequence>();
    seq->seq_id = seq_id;
    seq->prompt_ids = request_params.prompt_ids;
    seq->sampling = request_params.sampling;
    seq->max_tokens = request_params.max_tokens;
    seq->max_speculative_tokens = request_params.num_speculative_tokens >= 0
                                      ? request_params.num_speculative_tokens
                                      : options_.speculation.num_speculative_tokens;
    seq->score_prompt_from = requests[index].score_prompt_from;
    if (requests[index].score_prompt_from > 0) {
      results[index].prompt_logprobs.assign(
          request_params.prompt_ids.size() - requests[index].score_prompt_from, 0.0);
    }
    entry.request = std::make_unique<coordinator::Request>(
        absl::StrFormat("local-%d", seq_id), seq_id, request_params, tokenizer_, eos_ids_);
    if (absl::Status added = scheduler_.Add(std::move(seq)); !added.ok()) {
      // Validate ruled out what Add refuses; release what was added before failing.
      for (const auto& [id, unused] : running) scheduler_.Finish(id);
      return added;
    }
  }

  size_t unfinished = running.size();
  absl::Status error;
  loom::v1::StepResult result;
  std::vector<int32_t> token_ids;
  absl::flat_hash_set<uint64_t> speculative;
  // Until every request finished and the executor was told to release them.
  while (scheduler_.has_work()) {
    const auto start = std::chrono::steady_clock::now();
    coordinator::SchedulerOutput out = scheduler_.Schedule();
    if (out.empty()) {
      error = absl::InternalError("the scheduler has work but planned nothing");
      break;
    }
    speculative.clear();
    for (const coordinator::ScheduledWork& work : out.scheduled) {
      if (work.num_speculative_tokens > 0) speculative.insert(work.seq->seq_id);
      if (!work.is_new || work.seq->num_preemptions > 0) continue;
      auto it = running.find(work.seq->seq_id);
      if (it == running.end()) continue;
      it->second.request->MarkScheduled("local");
      it->second.request->set_cached_prompt_tokens(
          std::min(work.seq->num_cached_tokens, static_cast<int32_t>(work.seq->prompt_ids.size())));
    }
    if (!Execute(out, result, error)) break;
    scheduler_.RecordStep(result.num_tokens(), result.timings().execute_seconds());

    for (const loom::v1::PromptLogprobs& scored : result.prompt_logprobs()) {
      auto it = running.find(scored.seq_id());
      if (it == running.end()) continue;
      EngineResult& into = results[it->second.index];
      const int32_t from = requests[it->second.index].score_prompt_from;
      for (int i = 0; i < scored.logprobs_size(); ++i) {
        const int64_t slot = int64_t{scored.first_token()} + i - from;
        if (slot >= 0 && slot < static_cast<int64_t>(into.prompt_logprobs.size())) {
          into.prompt_logprobs[slot] = scored.logprobs(i);
        }
      }
    }
    // One sequence's outputs are consecutive (a speculative step's accepted drafts, then
    // its next token), as the replica applies them.
    std::vector<uint64_t> stepped;  // unfinished sequences this step counts for
    for (const auto& [seq_id, entry] : running) {
      if (!entry.finished) stepped.push_back(seq_id);
    }
    const auto& outputs = result.outputs();
    for (int begin = 0, end = 0; begin < outputs.size(); begin = end) {
      const uint64_t seq_id = outputs[begin].seq_id();
      token_ids.clear();
      for (end = begin; end < outputs.size() && outputs[end].seq_id() == seq_id; ++end) {
        token_ids.push_back(outputs[end].token_id());
      }
      const bool is_speculative = speculative.contains(seq_id);
      if (scheduler_.ApplyOutputs(seq_id, token_ids, is_speculative,
                                  outputs[begin].num_draft_tokens(),
                                  outputs[begin].num_accepted_tokens()) == nullptr) {
        continue;
      }
      auto it = running.find(seq_id);
      if (it == running.end() || it->second.finished) continue;
      Running& entry = it->second;
      EngineResult& into = results[entry.index];
      if (is_speculative) {
        entry.request->AddSpeculation(outputs[begin].num_draft_tokens(),
                                      outputs[begin].num_accepted_tokens());
      }
      for (int i = begin; i < end; ++i) {
        const bool finished = entry.request->OnToken(outputs[i], "local");
        std::optional<coordinator::OutputEvent> event = entry.request->outputs().TryPop();
        into.outputs.push_back(outputs[i]);
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
        if (on_token) on_token(entry.index, TokenEvent{outputs[i], text, finished});
        if (finished) {
          entry.finished = true;
          --unfinished;
          scheduler_.Finish(seq_id);
          break;
        }
      }
    }
    if (!out.scheduled.empty()) {
      const double seconds = SecondsSince(start);
      for (uint64_t seq_id : stepped) {
        EngineResult& into = results[running[seq_id].index];
        (out.num_prefill_tokens > 0 ? into.prefill_seconds : into.decode_seconds) += seconds;
      }
    }
  }
  if (error.ok() && unfinished == 0) return absl::OkStatus();
  if (error.ok()) error = absl::InternalError("the engine stopped with requests unfinished");
  // The executor dropped the sequences the failed plan named; release every one of ours
  // (blocks back to the pool) and tell the executor about the others.
  for (auto& [seq_id, entry] : running) {
    if (!entry.finished) scheduler_.Finish(seq_id);
  }
  while (scheduler_.has_work()) {
    coordinator::SchedulerOutput out = scheduler_.Schedule();
    if (out.empty()) break;
    absl::Status ignored;
    Execute(out, result, ignored);
  }
  scheduler_.ForgetPrefixCache();  // the failed step may have left blocks half written
  return error;
}

}  // namespace loom::cli
