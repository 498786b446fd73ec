#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "engine/request.h"
#include "engine/scheduler.h"
#include "loom/v1/worker.pb.h"

namespace loom::engine {

/// What a planned step scheduled, kept until its result is applied.
struct StepRecord {
  std::vector<uint64_t> seq_ids;              // every sequence the step scheduled
  absl::flat_hash_set<uint64_t> speculative;  // those it asked to speculate
  int64_t num_tokens = 0;                     // tokens it computes (decodes + prefill)
  int64_t num_decode_tokens = 0;              // of which decodes (and their drafts)
};

/// The engine core, written once: admits requests into the scheduler, plans steps, and
/// applies a step's result (scheduler outputs, speculation, detokenization and stop
/// checks through Request::OnToken, finishing). Both drivers use it: a coordinator
/// Replica, whose plans travel to workers over gRPC (several in flight), and the
/// in-process engine (cli/local_engine), which hands each plan to a StepExecutor. The
/// driver owns what differs: transport, liveness, load accounting, result collection.
/// Not thread-safe: one driver thread calls it.
class EngineCore {
 public:
  /// Called for each token applied to a request (`finished` on its last), and once for a
  /// request the core ended (finished, stopped, cancelled or failed) just before it
  /// forgets it.
  struct Hooks {
    std::function<void(Request& request, const loom::v1::SequenceOutput& output,
                       bool finished)>
        on_token;
    std::function<void(Request& request)> on_end;
    /// A request admitted `prefill_only` got its first token and is not finished: the
    /// core forgot it (its blocks freed, the full ones kept in the prefix cache) without
    /// ending it, for the driver to hand to a decode replica.
    std::function<void(std::shared_ptr<Request> request)> on_handoff;
  };

  /// `name` labels the requests' metrics and events (a replica id, or "local").
  EngineCore(const SchedulerConfig& config, std::string name, Hooks hooks);

  /// Adds `request` to the scheduler's waiting queue; `score_prompt_from` > 0 asks for
  /// the prompt's log-probabilities from that index on. A refusal (the scheduler's
  /// InvalidArgument or ResourceExhausted) leaves nothing behind; the request is not ended.
  /// `prefill_only` (disaggregated serving, a prefill replica): the request runs until its
  /// next token, then goes to Hooks::on_handoff unless that token finished it.
  absl::Status Admit(std::shared_ptr<Request> request, int32_t score_prompt_from = 0,
                     bool prefill_only = false);

  /// Plans the next step into `out` and `record`: false when there is nothing to run.
  /// Requests scheduled for the first time learn their prefix-cache hits.
  bool Plan(SchedulerOutput& out, StepRecord& record);

  /// Applies the result of the step `record` planned. A failed step (error_code != 0)
  /// ends each of its sequences with FINISH_REASON_ERROR and forgets the prefix cache
  /// (the step may have written part of cached blocks).
  void Apply(const StepRecord& record, const loom::v1::StepResult& result);

  /// Ends the request of `seq_id` (if the core holds it): Request::Finish, on_end, and its
  /// blocks freed.
  void End(uint64_t seq_id, loom::v1::FinishReason reason, const std::string& message);

  /// Takes every admitted request out of the core (the scheduler forgets their
  /// sequences), without ending them: a lost worker hands them back to the cluster.
  std::vector<std::shared_ptr<Request>> TakeAll();

  Scheduler& scheduler() { return scheduler_; }
  const Scheduler& scheduler() const { return scheduler_; }
  const absl::flat_hash_map<uint64_t, std::shared_ptr<Request>>& requests() const {
    return requests_;
  }

 private:
  Scheduler scheduler_;
  const std::string name_;
  const Hooks hooks_;
  // Admitted and not yet ended, by sequence id.
  absl::flat_hash_map<uint64_t, std::shared_ptr<Request>> requests_;
  absl::flat_hash_set<uint64_t> prefill_only_;  // admitted prefill_only, not yet handed off
  std::vector<int32_t> token_scratch_;  // Apply: one sequence's tokens of a result
};

}  // namespace loom::engine
