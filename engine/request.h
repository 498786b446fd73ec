#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/tokenizer/incremental_decoder.h"
#include "common/tokenizer/tokenizer.h"
#include "engine/block_hash.h"
#include "engine/request_metrics.h"
#include "engine/stop_string_matcher.h"
#include "loom/v1/inference.pb.h"

namespace loom::engine {

/// One message for the client: new text/tokens, and on the last one the finish reason.
/// One prompt token's score (RequestParams::prompt_logprobs): its log-probability given
/// the tokens before it, its rank among the vocabulary, and the most likely tokens there.
struct PromptTokenLogprob {
  double logprob = 0;
  int32_t rank = 0;
  std::vector<loom::v1::TokenLogprob> top;
};

struct OutputEvent {
  std::string text;
  std::vector<int32_t> token_ids;
  std::vector<loom::v1::SequenceOutput> logprobs;
  loom::v1::FinishReason finish_reason = loom::v1::FINISH_REASON_UNSPECIFIED;
  std::string error_message;
  std::string replica_id;
  int32_t cached_prompt_tokens = 0;  // on the final event: prompt tokens served from cache
  int32_t num_draft_tokens = 0;      // on the final event: speculative drafts proposed
  int32_t num_accepted_tokens = 0;   //   and accepted
  // On the final event of a request with RequestParams::prompt_logprobs >= 0: one entry
  // per prompt token, the first (nothing before it) and any the worker did not score
  // (a failed request) empty.
  std::vector<std::optional<PromptTokenLogprob>> prompt_logprobs;
  std::vector<float> embedding;  // RequestParams::embed: on the final event
  // On a final ERROR event of a request that produced nothing: another attempt may succeed
  // where this one could not be placed (no replica: its coordinator lost its workers or
  // handed over to another leader). The gRPC API ends such a call UNAVAILABLE, which the
  // SDKs retry; the HTTP API answers 503 as for every error.
  bool retryable = false;
  bool final() const { return finish_reason != loom::v1::FINISH_REASON_UNSPECIFIED; }
};

/// "stop", "length", "abort" or "error": the finish reason as the OpenAI API and the
/// metrics' finished_reason label spell it.
const char* FinishReasonName(loom::v1::FinishReason reason);

/// The hand-off between the replica loop (the producer) and the RPC handler (the one
/// consumer).
/// Events are merged as they are pushed (text and tokens concatenated, the final event's
/// finish reason), so the queue holds at most one event and a consumer that was busy
/// finds everything new in one piece. Thread-safe.
class OutputQueue {
 public:
  /// Queues `event` (merged into the one already queued); wakes a consumer that waits
  /// for it. Nothing may follow a final event (later events are dropped).
  void Push(OutputEvent event);
  /// Everything queued so far as one event, waiting up to `timeout` for one; nullopt
  /// without one. Until `hold_until`, only a final event ends the wait: non-final events
  /// stay queued and merge with the ones that follow (a stream's flush interval, so that
  /// one consumer wakeup carries several tokens; the producer wakes no one meanwhile).
  std::optional<OutputEvent> Pop(absl::Duration timeout,
                                 absl::Time hold_until = absl::InfinitePast());
  /// Pop without waiting, for a consumer driven by `listener`: what Pop would return
  /// at once. When that is nothing, the listener is armed: the next Push that would end
  /// Pop's wait (a final event before `hold_until`, any event after it) calls it once.
  std::optional<OutputEvent> TryPop(absl::Time hold_until = absl::InfinitePast());
  /// Sets (or, with nullptr, clears) what an armed TryPop calls. It runs on the
  /// producer's thread with the queue locked: it must be quick and must not call into
  /// the queue. Once SetListener(nullptr) returned, the old listener is not running and
  /// will not run again.
  void SetListener(std::function<void()> listener);

 private:
  // What a consumer blocked in Pop waits for; Push signals only when that arrived, so
  // tokens pushed during a hold cost the producer no wakeup.
  enum class Waiting { kNothing, kAnyEvent, kFinalEvent };

  absl::Mutex mu_;
  absl::CondVar ready_;
  std::optional<OutputEvent> queued_ ABSL_GUARDED_BY(mu_);
  Waiting waiting_ ABSL_GUARDED_BY(mu_) = Waiting::kNothing;
  std::function<void()> listener_ ABSL_GUARDED_BY(mu_);
};

/// What the client asked for, validated and tokenized.
struct RequestParams {
  std::vector<int32_t> prompt_ids;
  loom::v1::SamplingParams sampling;
  int32_t max_tokens = 0;  // >= 1 after validation
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  int32_t priority = 0;
  // Isolates this request's prefix-cache entries: only requests with the same salt share
  // cached blocks (a per-tenant secret). Empty: the shared default.
  std::string cache_salt;
  // Speculative decoding: draft tokens per step at most; -1: the server's default.
  int32_t num_speculative_tokens = -1;
  // The stop string or stop token's text that ended the output is sent too.
  bool include_stop_str_in_output = false;
  // Special tokens' text is left out of the output.
  bool skip_special_tokens = true;
  // -1: no prompt scores; k >= 0: every prompt token's log-probability from the second on,
  // its rank and the k most likely tokens at its position (OutputEvent::prompt_logprobs).
  // The prefix cache then serves none of the prompt (its logits must be computed).
  int32_t prompt_logprobs = -1;
  // Embedding: the request's only output is the last prompt token's normalized hidden
  // state (OutputEvent::embedding); max_tokens is 1 and nothing is sampled or detokenized.
  bool embed = false;
};

/// One request in flight: its parameters, the client's queue, and the output processing
/// (incremental detokenization, stop checks). The replica loop that runs it is the only
/// writer of the processing state; `outputs` is the thread-safe hand-off to the handler.
class Request {
 public:
  Request(std::string request_id, uint64_t seq_id, RequestParams params,
          const common::Tokenizer& tokenizer, std::vector<int32_t> eos_ids);

  const std::string& request_id() const { return request_id_; }
  uint64_t seq_id() const { return seq_id_; }
  const RequestParams& params() const { return params_; }
  OutputQueue& outputs() { return outputs_; }

  /// Processes one sampled token (replica loop only): appends text through the
  /// detokenizer and the stop strings, pushes an event, and returns true when the
  /// sequence is finished (EOS, stop token, stop string, max_tokens; the final event was
  /// pushed).
  bool OnToken(const loom::v1::SequenceOutput& output, const std::string& replica_id);
  /// Ends the request without more tokens (abort or error): pushes the final event.
  void Finish(loom::v1::FinishReason reason, std::string error_message,
              const std::string& replica_id, bool retryable = false);
  /// Keeps a step's scores of this request's prompt tokens (replica loop only) for the
  /// final event; a position scored again (after a preemption) keeps its latest score.
  void AddPromptLogprobs(const loom::v1::PromptLogprobs& scored);

  /// True once any token reached the client: placed on another replica, it continues from
  /// its outputs (a migration) instead of starting over.
  bool produced_output() const { return num_outputs_ > 0; }
  int32_t num_outputs() const { return num_outputs_; }
  /// The tokens that reached the client, in order: a migrated request's sequence starts
  /// with them (its worker recomputes prompt and outputs, then samples what follows).
  const std::vector<int32_t>& output_ids() const { return output_ids_; }
  /// Times the request moved to another replica after producing output (replica loop).
  int32_t num_migrations() const { return num_migrations_; }
  void CountMigration() { ++num_migrations_; }
  /// Disaggregated serving: the prefill replica handed the request over after its first
  /// token (MarkHandedOff, its loop), then the decode replica admitted it, its KV fetched
  /// or not (MarkHandoffDone, that loop, later): the transfer phase of its timeline.
  void MarkHandedOff() {
    handed_off_ = std::chrono::steady_clock::now();
    outputs_at_handoff_ = num_outputs_;
  }
  void MarkHandoffDone() {
    if (handed_off_ && !handoff_done_) handoff_done_ = std::chrono::steady_clock::now();
  }
  bool handed_off() const { return handed_off_.has_value(); }
  /// Handed off and no token produced since: a decode replica lost before it produced one
  /// places it again (as a request without output) rather than counting a migration.
  bool handoff_undecoded() const { return handed_off_ && num_outputs_ <= outputs_at_handoff_; }
  bool finished() const { return finished_; }
  /// Asks the replica running it to drop it at its next step (any thread). The replica
  /// then frees its blocks and pushes the final ABORT event.
  void Cancel() { cancelled_.store(true, std::memory_order_relaxed); }
  bool cancelled() const { return cancelled_.load(std::memory_order_relaxed); }
  std::chrono::steady_clock::time_point arrival() const { return arrival_; }

  /// Records how many prompt tokens the replica found in its prefix cache when it first
  /// scheduled the request (replica loop only, after MarkScheduled); reported on the final
  /// event and, at once, to the prefix-cache metrics.
  void set_cached_prompt_tokens(int32_t tokens);
  int32_t cached_prompt_tokens() const { return cached_prompt_tokens_; }

  /// Records one speculative step's drafts and accepted drafts (replica loop only);
  /// reported on the final event and, at once, to the metrics.
  void AddSpeculation(int32_t drafted, int32_t accepted);

  /// Where the request's events go as they happen (tokens, TTFT, prefix-cache lookups,
  /// speculative steps) and its timeline when it finishes; null: nowhere. Set before
  /// the request is placed.
  void set_metrics(RequestMetrics* metrics) { metrics_ = metrics; }
  /// The replica an endpoint picker chose for it (the HTTP header `x-loom-replica`):
  /// placement tries it first while it is healthy and has room. Empty: the router decides.
  void set_preferred_replica(std::string replica_id) { preferred_replica_ = std::move(replica_id); }
  const std::string& preferred_replica() const { return preferred_replica_; }
  /// `replica_id` scheduled it (replica loop only): the first call ends its queue time.
  void MarkScheduled(const std::string& replica_id);

  /// The prompt's prefix-cache identity for KV blocks of `block_size` tokens: the chain's
  /// seed (model fingerprint and cache salt) and the hashes of its full blocks, computed
  /// once (the cluster calls this before placing the request; later calls, from any thread
  /// after that one, return the same). Not safe to call concurrently for the first time.
  const std::vector<BlockHash>& PromptBlockHashes(std::string_view model_fingerprint,
                                                  int32_t block_size);
  /// What PromptBlockHashes computed (empty before).
  const std::vector<BlockHash>& prompt_block_hashes() const { return prompt_block_hashes_; }
  const BlockHash& hash_seed() const { return hash_seed_; }
  /// The block size PromptBlockHashes was computed for; 0 before.
  int32_t hashed_block_size() const { return hashed_block_size_; }

 private:
  // Reports the finished request's timeline to metrics_ (when set).
  void RecordFinished(loom::v1::FinishReason reason, const std::string& replica_id);

  std::string request_id_;
  uint64_t seq_id_;
  RequestParams params_;
  std::vector<int32_t> eos_ids_;
  common::IncrementalDecoder decoder_;
  StopStringMatcher stop_matcher_;
  int32_t num_outputs_ = 0;
  std::vector<int32_t> output_ids_;
  int32_t num_migrations_ = 0;
  int32_t outputs_at_handoff_ = 0;
  int32_t cached_prompt_tokens_ = 0;
  int32_t num_speculative_steps_ = 0;
  int32_t num_draft_tokens_ = 0;
  int32_t num_accepted_tokens_ = 0;
  bool finished_ = false;
  BlockHash hash_seed_;
  std::string preferred_replica_;
  std::vector<BlockHash> prompt_block_hashes_;
  int32_t hashed_block_size_ = 0;
  std::chrono::steady_clock::time_point arrival_;
  std::optional<std::chrono::steady_clock::time_point> first_scheduled_, first_token_, last_token_,
      handed_off_, handoff_done_;
  std::string scheduled_replica_id_;  // the replica that scheduled it last
  std::string reported_replica_id_;   // the replica its output events named last
  RequestMetrics* metrics_ = nullptr;
  // The latency series of the replica of its first token (set then, with metrics_).
  const ReplicaLatencySeries* latency_series_ = nullptr;
  std::atomic<bool> cancelled_{false};
  std::vector<std::optional<PromptTokenLogprob>> prompt_logprobs_;  // AddPromptLogprobs
  OutputQueue outputs_;
};

}  // namespace loom::engine
