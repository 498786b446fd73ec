#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/block_hash.h"
#include "engine/speculation_policy.h"
#include "loom/v1/worker.pb.h"

namespace loom::engine {

enum class SequenceStatus {
  kWaiting,   // queued (new, or preempted and waiting to be recomputed)
  kRunning,   // holds blocks and is scheduled every step
  kFinished,  // done; released on the worker by the next plan
};

/// What the scheduler knows about one sequence (one completion of a request). The token
/// bookkeeping allows two plans in flight: the scheduler schedules a decode before the
/// token it computes has come back, because the worker holds that token already.
///
/// Invariants: num_computed <= num_known_tokens(); blocks cover num_computed tokens (and
/// the drafts' slots of a speculative step in flight);
/// samples_in_flight counts tokens sampled by plans whose results have not been applied.
/// A block-table entry whose block was freed behind a sliding window.
inline constexpr int32_t kFreedBlock = -1;

struct Sequence {
  uint64_t seq_id = 0;
  int32_t priority = 0;        // lower runs first; FCFS (arrival) within a priority
  uint64_t arrival = 0;        // monotonically increasing admission order
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> output_ids;  // tokens whose results were applied, in order
  loom::v1::SamplingParams sampling;
  int32_t max_tokens = 0;      // outputs to generate at most (>= 1)
  // Prompt scoring (loom.v1.NewSequence.score_prompt_from): 0, or the first prompt index
  // whose log-probability the worker returns; the prefix cache then serves no token at or
  // after score_prompt_from - 1.
  int32_t score_prompt_from = 0;
  int32_t score_prompt_top = 0;  // NewSequence.score_prompt_top
  bool embed = false;            // NewSequence.embed: its one output is an embedding

  SequenceStatus status = SequenceStatus::kWaiting;
  int32_t num_computed = 0;       // tokens whose compute was scheduled (plans sent)
  int32_t samples_in_flight = 0;  // scheduled samples whose results are not applied yet
  std::vector<int32_t> blocks;    // block table, ceil(num_computed / block_size) entries
  // Sliding window on every layer: blocks[0, num_window_freed) were freed (kFreedBlock)
  // once behind every later query's window; the table keeps its positions.
  int32_t num_window_freed = 0;
  bool on_worker = false;         // the worker holds its state (NewSequence was sent)
  // Free blocks held for it while it waits (Scheduler::HoldBlocksFor: a hand-off whose
  // decode replica reserved room at placement); 0 once admitted.
  int32_t held_blocks = 0;
  int32_t num_preemptions = 0;

  // Prefix caching. block_hashes[i] is the chained hash of full block i of the known,
  // applied tokens (prompt then output_ids), rooted at hash_seed; it only ever grows (the
  // tokens it covers never change), lazily, as the scheduler needs more of it.
  BlockHash hash_seed;
  std::string cache_salt;  // the request's; a cached first block is verified against it
  std::vector<BlockHash> block_hashes;
  int32_t num_registered_blocks = 0;  // leading blocks offered to the prefix cache
  int32_t num_cached_tokens = 0;      // tokens found cached at its latest admission
  // Disaggregated serving: a hand-off's last partial prompt block, pushed by its prefill
  // replica into a reserved slot of this replica's host tier of generation
  // host_tail_generation (Scheduler::SetHostTail). Reloaded at admission when every full
  // prompt block before it is cached, else freed (and recomputed). -1: none.
  int32_t host_tail_slot = -1;
  uint64_t host_tail_generation = 0;

  // Speculative decoding. While a speculative step is in flight the sequence is not
  // scheduled again (its next position depends on how many drafts are accepted); its
  // table holds speculative_in_flight blocks' worth of extra slots for the drafts until
  // the result trims it back.
  int32_t max_speculative_tokens = 0;  // drafts per step at most (0: never speculates)
  int32_t speculative_in_flight = 0;   // drafts reserved by the plan in flight (0: none)
  SpeculationStats speculation;        // outcomes so far, for the adaptive policy

  /// Tokens the worker will know once every plan sent so far has run.
  int32_t num_known_tokens() const {
    return static_cast<int32_t>(prompt_ids.size() + output_ids.size()) + samples_in_flight;
  }
  /// Outputs produced or on their way.
  int32_t num_outputs_expected() const {
    return static_cast<int32_t>(output_ids.size()) + samples_in_flight;
  }
};

}  // namespace loom::engine
