#include "engine/request.h"

#include <algorithm>

namespace loom::engine {

const char* FinishReasonName(loom::v1::FinishReason reason) {
  switch (reason) {
    case loom::v1::FINISH_REASON_STOP:
      return "stop";
    case loom::v1::FINISH_REASON_LENGTH:
      return "length";
    case loom::v1::FINISH_REASON_ABORT:
      return "abort";
    default:
      return "error";
  }
}

namespace {

// Appends `next` (a later event of the same stream) to `into`.
void MergeInto(OutputEvent& into, OutputEvent&& next) {
  into.text += next.text;
  into.token_ids.insert(into.token_ids.end(), next.token_ids.begin(), next.token_ids.end());
  for (loom::v1::SequenceOutput& logprob : next.logprobs) {
    into.logprobs.push_back(std::move(logprob));
  }
  into.finish_reason = next.finish_reason;
  into.error_message = std::move(next.error_message);
  if (!next.replica_id.empty()) into.replica_id = std::move(next.replica_id);
  into.cached_prompt_tokens = next.cached_prompt_tokens;
  into.num_draft_tokens = next.num_draft_tokens;
  into.num_accepted_tokens = next.num_accepted_tokens;
  if (!next.prompt_logprobs.empty()) into.prompt_logprobs = std::move(next.prompt_logprobs);
  if (!next.embedding.empty()) into.embedding = std::move(next.embedding);
}

}  // namespace

void OutputQueue::Push(OutputEvent event) {
  absl::MutexLock lock(&mu_);
  if (!queued_) {
    queued_ = std::move(event);
  } else if (!queued_->final()) {
    MergeInto(*queued_, std::move(event));
  }
  if (waiting_ == Waiting::kAnyEvent ||
      (waiting_ == Waiting::kFinalEvent && queued_->final())) {
    waiting_ = Waiting::kNothing;
    ready_.Signal();
    if (listener_) listener_();
  }
}

std::optional<OutputEvent> OutputQueue::TryPop(absl::Time hold_until) {
  absl::MutexLock lock(&mu_);
  const bool holding = absl::Now() < hold_until;
  if (queued_ && (queued_->final() || !holding)) {
    waiting_ = Waiting::kNothing;
    std::optional<OutputEvent> event = std::move(queued_);
    queued_.reset();
    return event;
  }
  waiting_ = holding ? Waiting::kFinalEvent : Waiting::kAnyEvent;
  return std::nullopt;
}

void OutputQueue::SetListener(std::function<void()> listener) {
  absl::MutexLock lock(&mu_);
  listener_ = std::move(listener);
}

std::optional<OutputEvent> OutputQueue::Pop(absl::Duration timeout, absl::Time hold_until) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&mu_);
  // Until hold_until (bounded by the deadline) only a final event ends the wait.
  const absl::Time hold_end = std::min(hold_until, deadline);
  while (!(queued_ && queued_->final()) && absl::Now() < hold_end) {
    waiting_ = Waiting::kFinalEvent;
    ready_.WaitWithDeadline(&mu_, hold_end);
  }
  if (!(queued_ && queued_->final()) && hold_until > deadline) {
    waiting_ = Waiting::kNothing;
    return std::nullopt;  // still holding
  }
  while (!queued_ && absl::Now() < deadline) {
    waiting_ = Waiting::kAnyEvent;
    ready_.WaitWithDeadline(&mu_, deadline);
  }
  waiting_ = Waiting::kNothing;
  if (!queued_) return std::nullopt;
  std::optional<OutputEvent> event = std::move(queued_);
  queued_.reset();
  return event;
}

Request::Request(std::string request_id, uint64_t seq_id, RequestParams params,
                 const common::Tokenizer& tokenizer, std::vector<int32_t> eos_ids)
    : request_id_(std::move(request_id)),
      seq_id_(seq_id),
      params_(std::move(params)),
      eos_ids_(std::move(eos_ids)),
      decoder_(tokenizer, params_.skip_special_tokens),
      stop_matcher_(params_.stop),
      arrival_(std::chrono::steady_clock::now()) {}

void Request::MarkScheduled(const std::string& replica_id) {
  if (!first_scheduled_) first_scheduled_ = std::chrono::steady_clock::now();
  scheduled_replica_id_ = replica_id;
}

void Request::set_cached_prompt_tokens(int32_t tokens) {
  cached_prompt_tokens_ = tokens;
  if (metrics_ != nullptr) {
    metrics_->RecordPrefixCacheQuery(scheduled_replica_id_,
                                     static_cast<int64_t>(params_.prompt_ids.size()), tokens);
  }
}

void Request::RecordFinished(loom::v1::FinishReason reason, const std::string& replica_id) {
  if (metrics_ == nullptr) return;
  using Seconds = std::chrono::duration<double>;
  const auto now = std::chrono::steady_clock::now();
  RequestRecord record;
  record.replica_id = replica_id;
  record.finish_reason = reason;
  record.prompt_tokens = static_cast<int64_t>(params_.prompt_ids.size());
  record.generation_tokens = num_outputs_;
  record.max_tokens = params_.max_tokens;
  record.e2e_seconds = Seconds(now - arrival_).count();
  if (first_scheduled_) {
    record.queue_seconds = Seconds(*first_scheduled_ - arrival_).count();
    record.inference_seconds = Seconds(now - *first_scheduled_).count();
  }
  if (first_token_) {
    record.decode_seconds = Seconds(*last_token_ - *first_token_).count();
    if (first_scheduled_) record.prefill_seconds = Seconds(*first_token_ - *first_scheduled_).count();
  }
  if (handed_off_)
    record.transfer_seconds = Seconds(handoff_done_.value_or(now) - *handed_off_).count();
  metrics_->RecordRequest(record);
}

bool Request::OnToken(const loom::v1::SequenceOutput& output, const std::string& replica_id) {
  if (finished_) return true;
  if (params_.embed) {
    // The one output is the embedding: no text, no stop checks.
    OutputEvent event;
    event.embedding.assign(output.embedding().begin(), output.embedding().end());
    if (event.embedding.empty()) {
      event.finish_reason = loom::v1::FINISH_REASON_ERROR;
      event.error_message = "the worker returned no embedding";
    } else {
      event.finish_reason = loom::v1::FINISH_REASON_STOP;
    }
    event.replica_id = replica_id;
    event.cached_prompt_tokens = cached_prompt_tokens_;
    finished_ = true;
    RecordFinished(event.finish_reason, replica_id);
    outputs_.Push(std::move(event));
    return true;
  }
  if (!output.error_message().empty()) {
    // The worker cannot go on (its grammar's dead end): the text so far stands, the token
    // it forced does not. Not retried: another replica would meet the same end.
    Finish(loom::v1::FINISH_REASON_ERROR, output.error_message(), replica_id,
           /*retryable=*/false);
    return true;
  }
  ++num_outputs_;
  output_ids_.push_back(output.token_id());
  const auto now = std::chrono::steady_clock::now();
  using Seconds = std::chrono::duration<double>;
  // Counted as streamed: the token counter, TTFT at the first token, the gaps after it.
  if (!first_token_) {
    first_token_ = now;
    if (metrics_ != nullptr) {
      latency_series_ = &metrics_->RecordFirstToken(
          replica_id, Seconds(now - arrival_).count(),
          static_cast<int64_t>(params_.prompt_ids.size()));
    }
  } else if (latency_series_ != nullptr) {
    metrics_->RecordToken(*latency_series_, Seconds(now - *last_token_).count());
  }
  last_token_ = now;
  const int32_t id = output.token_id();
  OutputEvent event;
  event.token_ids.push_back(id);
  if (params_.sampling.num_logprobs() >= 0) event.logprobs.push_back(output);
  // Named on the first output and again whenever the request moved (a prefill replica's
  // hand-off to a decode replica, a migration).
  if (replica_id != reported_replica_id_) {
    event.replica_id = replica_id;
    reported_replica_id_ = replica_id;
  }

  // Under a grammar the worker lets an end token through only where the document is
  // complete (or at a dead end): it ends the sequence even before min_tokens or with
  // ignore_eos, which could only be honoured with text the grammar refuses.
  const bool constrained = params_.sampling.has_grammar();
  const bool is_end = std::find(eos_ids_.begin(), eos_ids_.end(), id) != eos_ids_.end();
  const bool is_eos = is_end && (!params_.ignore_eos || constrained);
  const bool is_stop_token = std::find(params_.stop_token_ids.begin(),
                                       params_.stop_token_ids.end(),
                                       id) != params_.stop_token_ids.end();
  // min_tokens: nothing else ends the sequence before it (the worker masks EOS and the
  // stop tokens; stop strings are not looked for yet, as in vLLM).
  const bool may_stop = num_outputs_ >= params_.sampling.min_tokens() || (constrained && is_end);
  if ((is_eos || is_stop_token) && may_stop) {
    // The stop token's own text is not part of the completion (unless asked for; an
    // end-of-generation token is special, so skip_special_tokens still drops it).
    event.text = stop_matcher_.Append(decoder_.Flush()).text + stop_matcher_.Flush();
    if (params_.include_stop_str_in_output) event.text += decoder_.Append(id) + decoder_.Flush();
    event.finish_reason = loom::v1::FINISH_REASON_STOP;
  } else {
    StopStringMatcher::Emitted emitted =
        may_stop ? stop_matcher_.Append(decoder_.Append(id))
                 : StopStringMatcher::Emitted{decoder_.Append(id), false, {}};
    event.text = std::move(emitted.text);
    if (emitted.stopped) {
      if (params_.include_stop_str_in_output) event.text += emitted.stop_string;
      event.finish_reason = loom::v1::FINISH_REASON_STOP;
    } else if (num_outputs_ >= params_.max_tokens) {
      event.text += stop_matcher_.Append(decoder_.Flush()).text;
      event.text += stop_matcher_.Flush();
      event.finish_reason = loom::v1::FINISH_REASON_LENGTH;
    }
  }
  finished_ = event.final();
  if (finished_) {
    event.prompt_logprobs = std::move(prompt_logprobs_);
    event.cached_prompt_tokens = cached_prompt_tokens_;
    event.num_draft_tokens = num_draft_tokens_;
    event.num_accepted_tokens = num_accepted_tokens_;
    RecordFinished(event.finish_reason, replica_id);
  }
  outputs_.Push(std::move(event));
  return finished_;
}

void Request::AddPromptLogprobs(const loom::v1::PromptLogprobs& scored) {
  if (params_.prompt_logprobs < 0) return;
  const size_t prompt_len = params_.prompt_ids.size();
  if (prompt_logprobs_.size() != prompt_len) prompt_logprobs_.resize(prompt_len);
  const int top = params_.prompt_logprobs;
  const bool has_top = scored.top_logprobs_size() == scored.logprobs_size() * top;
  for (int i = 0; i < scored.logprobs_size(); ++i) {
    const int64_t position = int64_t{scored.first_token()} + i;
    if (position < 1 || position >= static_cast<int64_t>(prompt_len)) continue;
    PromptTokenLogprob entry;
    entry.logprob = scored.logprobs(i);
    entry.rank = i < scored.ranks_size() ? scored.ranks(i) : 0;
    if (has_top) {
      entry.top.assign(scored.top_logprobs().begin() + i * top,
                       scored.top_logprobs().begin() + (i + 1) * top);
    }
    prompt_logprobs_[position] = std::move(entry);
  }
}

void Request::Finish(loom::v1::FinishReason reason, std::string error_message,
                     const std::string& replica_id, bool retryable) {
  if (finished_) return;
  finished_ = true;
  OutputEvent event;
  event.retryable = retryable && num_outputs_ == 0 && reason == loom::v1::FINISH_REASON_ERROR;
  if (reason != loom::v1::FINISH_REASON_ERROR) {
    event.text = stop_matcher_.Append(decoder_.Flush()).text + stop_matcher_.Flush();
  }
  event.finish_reason = reason;
  event.error_message = std::move(error_message);
  if (num_outputs_ == 0) event.replica_id = replica_id;
  event.prompt_logprobs = std::move(prompt_logprobs_);
  event.cached_prompt_tokens = cached_prompt_tokens_;
  event.num_draft_tokens = num_draft_tokens_;
  event.num_accepted_tokens = num_accepted_tokens_;
  RecordFinished(reason, replica_id);
  outputs_.Push(std::move(event));
}

const std::vector<BlockHash>& Request::PromptBlockHashes(std::string_view model_fingerprint,
                                                         int32_t block_size) {
  if (hashed_block_size_ != block_size) {
    hash_seed_ = PrefixHashSeed(model_fingerprint, params_.cache_salt);
    prompt_block_hashes_ = HashFullBlocks(hash_seed_, params_.prompt_ids, block_size);
    hashed_block_size_ = block_size;
  }
  return prompt_block_hashes_;
}

void Request::AddSpeculation(int32_t drafted, int32_t accepted) {
  ++num_speculative_steps_;
  num_draft_tokens_ += drafted;
  num_accepted_tokens_ += accepted;
  if (metrics_ != nullptr) metrics_->RecordSpeculativeStep(drafted, accepted);
}

}  // namespace loom::engine
