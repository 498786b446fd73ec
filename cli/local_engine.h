#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tokenizer/tokenizer.h"
#include "engine/block_manager.h"
#include "engine/engine_core.h"
#include "engine/request.h"
#include "engine/scheduler.h"
#include "engine/speculation_policy.h"
#include "loom/v1/inference.pb.h"
#include "loom/v1/worker.pb.h"
#include "worker/sampler.h"
#include "worker/step_backend.h"
#include "worker/step_executor.h"

namespace loom::cli {

/// One request to the in-process engine: what a client's GenerateRequest carries, as
/// token ids.
struct EngineRequest {
  std::vector<int32_t> prompt_ids;
  worker::SamplingParams sampling;      // temperature 0: greedy
  int32_t max_tokens = 16;              // 0: up to the context length
  std::vector<std::string> stop;        // stop strings; the matched text is not returned
  std::vector<int32_t> stop_token_ids;  // besides the model's end-of-generation ids
  bool ignore_eos = false;
  int32_t num_speculative_tokens = -1;  // drafts per step at most; -1: the engine's default
  // Prompt scoring (perplexity): the log-probability of each prompt token from this index
  // on, each given the tokens before it, in EngineResult::prompt_logprobs. 0: none; else in
  // [1, prompt length). Such a request takes nothing from the prefix cache at or after
  // the position that predicts the first scored token.
  int32_t score_prompt_from = 0;
};

/// What one request produced.
struct EngineResult {
  std::vector<loom::v1::SequenceOutput> outputs;  // one per generated token, in order
  std::string text;  // detokenized (special tokens skipped), stop strings removed
  loom::v1::FinishReason finish_reason = loom::v1::FINISH_REASON_UNSPECIFIED;
  // log p(prompt[score_prompt_from + i] | prompt[0 .. score_prompt_from + i)), natural log.
  std::vector<double> prompt_logprobs;
  int32_t cached_prompt_tokens = 0;  // prompt tokens found in the prefix cache
  int32_t num_draft_tokens = 0;      // speculative drafts proposed
  int32_t num_accepted_tokens = 0;   //   and accepted
  // Wall time of the engine steps run while the request was unfinished: those that
  // computed prompt tokens (of any request) and the others.
  double prefill_seconds = 0;
  double decode_seconds = 0;

  /// The generated token ids.
  std::vector<int32_t> token_ids() const;
};

struct LocalEngineOptions {
  int64_t max_num_batched_tokens = 512;  // tokens per step (decodes + prefill chunks)
  int32_t max_num_seqs = 256;            // running sequences at most
  bool enable_prefix_caching = true;
  engine::SpeculationConfig speculation;  // off unless num_speculative_tokens > 0
};

/// The serving engine in one process, for `loom generate`, `loom perplexity`, the
/// benchmarks and tests: the engine core a Replica drives (EngineCore: scheduler, block
/// manager, applying results with detokenization, EOS, stop tokens, stop strings and
/// max_tokens) plans each step, the plan goes to the worker's StepExecutor as the same
/// loom.v1.StepPlan a worker receives (BuildStepPlan), and its StepResult goes back to
/// the core as a replica's does. Requests are validated as the coordinator
/// validates a client's (ValidateGenerateRequest). Continuous batching, chunked prefill,
/// preemption, prefix caching and speculation come from those components. No gRPC: one
/// plan in flight, executed synchronously. Not thread-safe.
class LocalEngine {
 public:
  /// `backend` and `tokenizer` must outlive the engine. The KV pool is the backend's.
  LocalEngine(worker::StepBackend& backend, const common::Tokenizer& tokenizer,
              LocalEngineOptions options = {},
              worker::StepExecutorOptions executor_options = {});

  /// A token as it is produced: the worker's output and the text it completes (possibly
  /// empty; stop strings are held back until ruled out). `finished` on a request's last.
  struct TokenEvent {
    const loom::v1::SequenceOutput& output;
    std::string_view text;
    bool finished = false;
  };
  using TokenCallback = std::function<void(size_t request_index, const TokenEvent& event)>;

  /// Runs `requests` to completion and returns their results in order, calling
  /// `on_token` for each token as it is applied. `batched`: all of them together
  /// (continuous batching); false: one after another (batch-invariance checks).
  /// InvalidArgument naming the request for a bad one (nothing runs); ResourceExhausted
  /// when one alone needs more KV blocks than the pool has. A step the executor rejects
  /// ends the call with its error. Whatever happens, every block is free again afterwards
  /// and the executor holds no sequence.
  absl::StatusOr<std::vector<EngineResult>> Generate(const std::vector<EngineRequest>& requests,
                                                     const TokenCallback& on_token = nullptr,
                                                     bool batched = true);

  const common::ModelConfig& config() const { return backend_.config(); }
  /// The KV block table (free count, prefix cache) between calls.
  const engine::BlockManager& block_manager() const { return engine_.scheduler().block_manager(); }
  const worker::StepExecutor& executor() const { return executor_; }
  /// Engine steps run so far (plans executed).
  int64_t num_steps() const { return num_steps_; }
  /// KV blocks freed behind the sliding window of every layer so far.
  uint64_t num_window_freed_blocks() const { return engine_.scheduler().num_window_freed_blocks(); }

 private:
  struct Run;

  // Checks `request` (index `index`) as the coordinator would and returns its parameters.
  absl::StatusOr<engine::RequestParams> Validate(const EngineRequest& request, size_t index) const;
  // Runs the requests `indices` of `requests` (validated into `params`) together.
  absl::Status RunTogether(const std::vector<EngineRequest>& requests,
                           std::vector<engine::RequestParams>& params,
                           const std::vector<size_t>& indices, const TokenCallback& on_token,
                           std::vector<EngineResult>& results);
  // The engine core's token hook: a token applied to a request of the current run.
  void OnToken(engine::Request& request, const loom::v1::SequenceOutput& output, bool finished);
  // Executes one plan; false (with `error`) when the executor rejected it.
  bool Execute(const engine::SchedulerOutput& out, loom::v1::StepResult& result,
               absl::Status& error);

  worker::StepBackend& backend_;
  const common::Tokenizer& tokenizer_;
  const LocalEngineOptions options_;
  const std::vector<int32_t> eos_ids_;
  engine::EngineCore engine_;
  worker::StepExecutor executor_;
  Run* run_ = nullptr;  // the requests being run (RunTogether's), for the hooks
  uint64_t next_seq_id_ = 1;
  uint64_t next_step_id_ = 1;
  int64_t num_steps_ = 0;
  loom::v1::StepPlan plan_;  // reused step after step
};

}  // namespace loom::cli
