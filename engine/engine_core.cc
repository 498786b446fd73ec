#include "engine/engine_core.h"

#include <algorithm>
#include <utility>

#include "engine/sequence.h"

namespace loom::engine {

EngineCore::EngineCore(const SchedulerConfig& config, std::string name, Hooks hooks)
    : scheduler_(config), name_(std::move(name)), hooks_(std::move(hooks)) {}

absl::Status EngineCore::Admit(std::shared_ptr<Request> request, int32_t score_prompt_from,
                               bool prefill_only) {
  const RequestParams& params = request->params();
  auto seq = std::make_unique<Sequence>();
  seq->seq_id = request->seq_id();
  seq->priority = params.priority;
  seq->prompt_ids = params.prompt_ids;
  // A request migrated from a failed replica continues after the outputs it streamed.
  seq->output_ids = request->output_ids();
  seq->sampling = params.sampling;
  seq->max_tokens = params.embed ? 1 : params.max_tokens;
  // A prefill replica's request stops after one more token: nothing is scheduled past it.
  if (prefill_only) {
    seq->max_tokens = std::min(seq->max_tokens, static_cast<int32_t>(seq->output_ids.size()) + 1);
  }
  seq->embed = params.embed;
  seq->cache_salt = params.cache_salt;
  seq->max_speculative_tokens = params.num_speculative_tokens >= 0
                                    ? params.num_speculative_tokens
                                    : scheduler_.config().speculation.num_speculative_tokens;
  // A request's own prompt_logprobs scores its whole prompt (a one-token prompt has
  // nothing to score).
  if (score_prompt_from == 0 && params.prompt_logprobs >= 0 && params.prompt_ids.size() > 1) {
    score_prompt_from = 1;
  }
  seq->score_prompt_from = score_prompt_from;
  seq->score_prompt_top = std::max(0, params.prompt_logprobs);
  // The cluster hashed the prompt for placement; the scheduler continues that chain.
  if (request->hashed_block_size() == scheduler_.config().block_size) {
    seq->hash_seed = request->hash_seed();
    seq->block_hashes = request->prompt_block_hashes();
  }
  const uint64_t seq_id = seq->seq_id;
  if (absl::Status added = scheduler_.Add(std::move(seq)); !added.ok()) return added;
  requests_[seq_id] = std::move(request);
  if (prefill_only) prefill_only_.insert(seq_id);
  return absl::OkStatus();
}

bool EngineCore::Plan(SchedulerOutput& out, StepRecord& record) {
  out = scheduler_.Schedule();
  if (out.empty()) return false;
  record.seq_ids.clear();
  record.speculative.clear();
  for (const ScheduledWork& work : out.scheduled) {
    const Sequence& seq = *work.seq;
    if (work.is_new && seq.num_preemptions == 0) {
      // First scheduled here: what its prompt found in the cache is what it reports.
      auto it = requests_.find(seq.seq_id);
      // A hand-off (disaggregated serving) found its prompt's KV fetched, not cached: what
      // its prefill replica found is what it reports.
      if (it != requests_.end() && !it->second->handed_off()) {
        it->second->MarkScheduled(name_);
        it->second->set_cached_prompt_tokens(
            std::min(seq.num_cached_tokens, static_cast<int32_t>(seq.prompt_ids.size())));
      }
    }
    if (work.num_speculative_tokens > 0) record.speculative.insert(seq.seq_id);
    record.seq_ids.push_back(seq.seq_id);
  }
  record.num_tokens = out.num_decode_tokens + out.num_prefill_tokens;
  record.num_decode_tokens = out.num_decode_tokens;
  return true;
}

void EngineCore::Apply(const StepRecord& record, const loom::v1::StepResult& result) {
  if (result.error_code() != 0) {
    // The worker dropped the step's sequences; they cannot continue.
    for (uint64_t seq_id : record.seq_ids) {
      End(seq_id, loom::v1::FINISH_REASON_ERROR,
          "the worker rejected the step: " + result.error_message());
    }
    // The failed step may have written part of blocks already offered to the cache.
    scheduler_.ForgetPrefixCache();
    return;
  }
  scheduler_.RecordStep(result.num_tokens(), result.timings().execute_seconds(),
                        std::min<int64_t>(record.num_decode_tokens, result.num_tokens()));
  for (const loom::v1::PromptLogprobs& scored : result.prompt_logprobs()) {
    auto it = requests_.find(scored.seq_id());
    if (it != requests_.end()) it->second->AddPromptLogprobs(scored);
  }
  // One sequence's outputs are consecutive: one token, or a speculative step's accepted
  // drafts and next token.
  const auto& outputs = result.outputs();
  std::vector<int32_t>& token_ids = token_scratch_;
  for (int begin = 0, end = 0; begin < outputs.size(); begin = end) {
    const uint64_t seq_id = outputs[begin].seq_id();
    token_ids.clear();
    for (end = begin; end < outputs.size() && outputs[end].seq_id() == seq_id; ++end) {
      token_ids.push_back(outputs[end].token_id());
    }
    const bool speculative = record.speculative.contains(seq_id);
    if (scheduler_.ApplyOutputs(seq_id, token_ids, speculative, outputs[begin].num_draft_tokens(),
                                outputs[begin].num_accepted_tokens()) == nullptr) {
      continue;
    }
    auto it = requests_.find(seq_id);
    if (it == requests_.end()) continue;
    Request& request = *it->second;
    if (speculative) {
      request.AddSpeculation(outputs[begin].num_draft_tokens(),
                             outputs[begin].num_accepted_tokens());
    }
    for (int i = begin; i < end; ++i) {
      const bool finished = request.OnToken(outputs[i], name_);
      if (hooks_.on_token) hooks_.on_token(request, outputs[i], finished);
      if (finished) {
        scheduler_.Finish(seq_id);
        prefill_only_.erase(seq_id);
        if (hooks_.on_end) hooks_.on_end(request);
        requests_.erase(it);
        break;
      }
      if (prefill_only_.erase(seq_id) > 0) {
        // Its blocks go back to the pool; the full ones stay cached for the decode replica
        // to fetch.
        scheduler_.Finish(seq_id);
        std::shared_ptr<Request> handed = std::move(it->second);
        requests_.erase(it);
        if (hooks_.on_handoff) hooks_.on_handoff(std::move(handed));
        break;
      }
    }
  }
}

void EngineCore::End(uint64_t seq_id, loom::v1::FinishReason reason, const std::string& message) {
  auto it = requests_.find(seq_id);
  if (it == requests_.end()) return;
  it->second->Finish(reason, message, name_);
  if (hooks_.on_end) hooks_.on_end(*it->second);
  requests_.erase(it);
  prefill_only_.erase(seq_id);
  scheduler_.Finish(seq_id);
}

std::vector<std::shared_ptr<Request>> EngineCore::TakeAll() {
  std::vector<std::shared_ptr<Request>> taken;
  taken.reserve(requests_.size());
  for (std::unique_ptr<Sequence>& seq : scheduler_.TakeAll()) {
    auto it = requests_.find(seq->seq_id);
    if (it == requests_.end()) continue;
    taken.push_back(std::move(it->second));
    requests_.erase(it);
  }
  for (auto& [seq_id, request] : requests_) taken.push_back(std::move(request));
  requests_.clear();
  prefill_only_.clear();
  return taken;
}

}  // namespace loom::engine
