#include "worker/step_executor.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "worker/ngram_proposer.h"

namespace loom::worker {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

absl::Status CheckTokenIds(const google::protobuf::RepeatedField<int32_t>& ids, int64_t vocab,
                           uint64_t seq_id, const char* what) {
  for (int i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrFormat("sequence %d: %s token %d has id %d, outside the vocabulary [0, %d)",
                          seq_id, what, i, ids[i], vocab));
    }
  }
  return absl::OkStatus();
}

// The checks of an added sequence against the model: a prompt, a token count within the
// context, a cached prefix and a scored part inside it, token ids in the vocabulary.
absl::Status CheckNewSequence(const loom::v1::NewSequence& added,
                              const common::ModelConfig& config) {
  const uint64_t id = added.seq_id();
  if (added.prompt_token_ids().empty()) {
    return absl::InvalidArgumentError(absl::StrFormat("sequence %d has an empty prompt", id));
  }
  const int64_t num_tokens =
      int64_t{added.prompt_token_ids().size()} + added.output_token_ids().size();
  if (num_tokens > config.context_length) {
    return absl::InvalidArgumentError(
        absl::StrFormat("sequence %d: %d tokens exceed the model's context length %d", id,
                        num_tokens, config.context_length));
  }
  // A prefix-cache hit: its first num_cached_tokens tokens' K/V are in the blocks it
  // will be given. At least one token must be left to compute (the logits come from it).
  if (added.num_cached_tokens() < 0 || added.num_cached_tokens() >= num_tokens) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "sequence %d: num_cached_tokens is %d, must be in [0, %d) (its token count)", id,
        added.num_cached_tokens(), num_tokens));
  }
  const int64_t prompt_size = added.prompt_token_ids().size();
  if (added.score_prompt_from() != 0 &&
      (added.score_prompt_from() < 1 || added.score_prompt_from() >= prompt_size ||
       added.num_cached_tokens() >= added.score_prompt_from())) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "sequence %d: score_prompt_from is %d, must be 0 or in [1, %d) (the prompt's length) "
        "and above num_cached_tokens %d",
        id, added.score_prompt_from(), prompt_size, added.num_cached_tokens()));
  }
  if (added.score_prompt_top() < 0 || added.score_prompt_top() > common::kMaxLogprobs ||
      added.score_prompt_top() > config.vocab_size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "sequence %d: score_prompt_top is %d, must be in [0, %d]", id, added.score_prompt_top(),
        std::min<int64_t>(common::kMaxLogprobs, config.vocab_size)));
  }
  LOOM_RETURN_IF_ERROR(CheckTokenIds(added.prompt_token_ids(), config.vocab_size, id, "prompt"));
  LOOM_RETURN_IF_ERROR(CheckTokenIds(added.output_token_ids(), config.vocab_size, id, "output"));
  return absl::OkStatus();
}

}  // namespace

struct StepExecutor::SequenceState {
  std::vector<int32_t> tokens;       // prompt, then outputs, in order
  std::vector<int32_t> block_table;  // every block the coordinator sent, in order
  int64_t num_computed = 0;          // tokens whose K/V are in the pool
  // Draft-model speculation: leading tokens whose draft K/V are in the draft's pool.
  // Invariant: <= num_computed, so they lie in blocks the sequence still holds.
  int64_t num_draft_computed = 0;
  int32_t num_logprobs = -1;
  int64_t num_prompt_tokens = 0;
  // Prompt scoring: 0, or the first prompt index whose log-probability is returned; with
  // this many most likely tokens per scored position.
  int64_t score_prompt_from = 0;
  int32_t score_prompt_top = 0;
  bool embed = false;                        // NewSequence.embed
  std::string cache_salt;                    // NewSequence.cache_salt
  // Leading blocks of block_table the KV ledger has recorded.
  int64_t num_ledgered_blocks = 0;
  std::unique_ptr<SequenceSampler> sampler;  // null when the backend uses no samplers
};

// Everything a plan will change, built before anything changes.
struct StepExecutor::Prepared {
  struct Entry {
    SequenceState* sequence = nullptr;
    int index = 0;  // in plan.scheduled()
    // Tokens [begin, end) are computed through sequence->block_table (with the step's
    // new blocks).
    int64_t begin = 0;
    int64_t end = 0;
    int32_t max_drafts = 0;  // within the context and the slots given
    bool sample = false;
  };
  std::vector<std::pair<uint64_t, std::unique_ptr<SequenceState>>> added;
  std::vector<Entry> entries;            // plan.scheduled(), resolved
  std::vector<DraftProposal> proposals;  // per entry: its drafts (and q from a draft model)
  double propose_seconds = 0;            // the draft model's passes
  std::vector<SequenceState*> sampled;   // sequences of `rows`, in batch order
  std::vector<bool> speculative;   // per entry of `rows`: a speculative step
  std::vector<int64_t> known;      // per entry of `rows`: tokens known before the step
  std::vector<DraftProposal> drafts;  // per entry of `rows`; rows[i].draft_* view it
  StepBatch batch;
  std::vector<SampleRow> rows;
  // Prompt scoring: the rows past the sampled ones in batch.sample_rows, the token each
  // predicts, and per scoring entry its sequence and first scored prompt index.
  struct ScoreRun {
    uint64_t seq_id = 0;
    int64_t first_token = 0;
    int32_t count = 0;
  };
  std::vector<int32_t> score_rows;
  std::vector<int32_t> score_targets;
  std::vector<int32_t> score_top_counts;
  std::vector<ScoreRun> score_runs;
  PromptScores scores;
  // What Execute hands the backend and gets back.
  std::vector<SampledToken> tokens;
  std::vector<int32_t> num_emitted;

  // Prompt scoring of `entry`, a sequence `seq_id` whose step tokens start at batch row
  // `first_new`: row p predicts token p + 1, over the prompt positions from the first scored
  // token's predecessor on, up to the one before the prompt's last token.
  void AddScoreRows(uint64_t seq_id, const Entry& entry, size_t first_new) {
    const SequenceState& sequence = *entry.sequence;
    const int64_t first = std::max(entry.begin, sequence.score_prompt_from - 1);
    const int64_t last = std::min(entry.end, sequence.num_prompt_tokens - 1);
    if (first >= last) return;
    score_runs.push_back({seq_id, first + 1, static_cast<int32_t>(last - first)});
    for (int64_t p = first; p < last; ++p) {
      score_rows.push_back(static_cast<int32_t>(first_new + (p - entry.begin)));
      score_targets.push_back(sequence.tokens[p + 1]);
      score_top_counts.push_back(sequence.score_prompt_top);
    }
  }

  // Empties everything, keeping capacity.
  void Clear() {
    added.clear();
    entries.clear();
    proposals.clear();
    propose_seconds = 0;
    sampled.clear();
    speculative.clear();
    known.clear();
    drafts.clear();
    batch.Clear();
    rows.clear();
    score_rows.clear();
    score_targets.clear();
    score_top_counts.clear();
    score_runs.clear();
    scores.Clear();
    tokens.clear();
    num_emitted.clear();
  }
};

StepExecutor::StepExecutor(StepBackend& backend, StepExecutorOptions options)
    : backend_(backend),
      options_(options),
      prepared_(std::make_unique<Prepared>()),
      pusher_(std::make_unique<KvPusher>(backend, options.host_tier)),
      ledger_(backend.num_kv_blocks(), static_cast<int32_t>(backend.block_size())) {}

StepExecutor::~StepExecutor() = default;

int64_t StepExecutor::NumComputed(uint64_t seq_id) const {
  auto it = sequences_.find(seq_id);
  return it == sequences_.end() ? -1 : it->second->num_computed;
}

int64_t StepExecutor::NumTokens(uint64_t seq_id) const {
  auto it = sequences_.find(seq_id);
  return it == sequences_.end() ? -1 : static_cast<int64_t>(it->second->tokens.size());
}

int64_t StepExecutor::NumDraftComputed(uint64_t seq_id) const {
  auto it = sequences_.find(seq_id);
  return it == sequences_.end() ? -1 : it->second->num_draft_computed;
}

absl::Status StepExecutor::Reset() {
  sequences_.clear();
  has_last_step_id_ = false;
  last_step_id_ = 0;
  kv_copied_step_id_.store(0, std::memory_order_release);
  {
    absl::MutexLock lock(&failed_copies_mu_);
    failed_copy_steps_.clear();  // a new stream's ids may start over (another coordinator)
  }
  return absl::OkStatus();
}

absl::Status StepExecutor::AttachGrammar(const loom::v1::GrammarConstraint& constraint,
                                         uint64_t seq_id, SequenceSampler& sampler) {
  if (options_.grammars == nullptr) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "sequence %d has a grammar but this worker has no vocabulary to apply it with", seq_id));
  }
  absl::StatusOr<common::GrammarKind> kind = common::ParseGrammarKind(constraint.kind());
  if (!kind.ok()) {
    return absl::InvalidArgumentError(absl::StrFormat("sequence %d: %s", seq_id, kind.status().message()));
  }
  absl::StatusOr<std::unique_ptr<common::GrammarMatcher>> matcher =
      options_.grammars->NewMatcher({*kind, constraint.text()});
  if (!matcher.ok()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("sequence %d: %s", seq_id, matcher.status().message()));
  }
  sampler.SetGrammar(*std::move(matcher));
  return absl::OkStatus();
}

// The sequences a plan names as Prepare checks it: the executor's, less the ones the plan
// releases (finished or preempted), plus the ones it adds.
class StepExecutor::PlanView {
 public:
  PlanView(const loom::v1::StepPlan& plan,
           const absl::flat_hash_map<uint64_t, std::unique_ptr<SequenceState>>& sequences)
      : sequences_(sequences) {
    released_.insert(plan.finished().begin(), plan.finished().end());
    released_.insert(plan.preempted().begin(), plan.preempted().end());
  }

  // The sequence `seq_id` names once releases and additions are applied, or nullptr.
  SequenceState* Find(uint64_t seq_id) const {
    if (auto it = added_.find(seq_id); it != added_.end()) return it->second;
    if (released_.contains(seq_id)) return nullptr;
    auto it = sequences_.find(seq_id);
    return it == sequences_.end() ? nullptr : it->second.get();
  }
  void Add(uint64_t seq_id, SequenceState* sequence) { added_[seq_id] = sequence; }

 private:
  const absl::flat_hash_map<uint64_t, std::unique_ptr<SequenceState>>& sequences_;
  absl::flat_hash_set<uint64_t> released_;
  absl::flat_hash_map<uint64_t, SequenceState*> added_;
};

absl::Status StepExecutor::Prepare(const loom::v1::StepPlan& plan, Prepared& prepared) {
  PlanView view(plan, sequences_);
  for (const loom::v1::NewSequence& added : plan.added()) {
    const uint64_t id = added.seq_id();
    if (view.Find(id) != nullptr) {
      return absl::InvalidArgumentError(
          absl::StrFormat("sequence %d is added but the worker already holds it", id));
    }
    LOOM_ASSIGN_OR_RETURN(std::unique_ptr<SequenceState> sequence, NewSequence(added));
    view.Add(id, sequence.get());
    prepared.added.emplace_back(id, std::move(sequence));
  }

  absl::flat_hash_set<uint64_t> scheduled_ids;
  for (int i = 0; i < plan.scheduled_size(); ++i) {
    const loom::v1::ScheduledSequence& entry = plan.scheduled(i);
    const uint64_t id = entry.seq_id();
    SequenceState* sequence = view.Find(id);
    if (sequence == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrFormat("scheduled sequence %d is unknown to the worker", id));
    }
    if (!scheduled_ids.insert(id).second) {
      return absl::InvalidArgumentError(
          absl::StrFormat("sequence %d is scheduled twice in one plan", id));
    }
    LOOM_RETURN_IF_ERROR(CheckScheduled(entry, *sequence));
    Schedule(entry, i, *sequence, prepared);
  }

  LOOM_RETURN_IF_ERROR(Propose(prepared));
  return BuildBatch(plan, prepared);
}

absl::StatusOr<std::unique_ptr<StepExecutor::SequenceState>> StepExecutor::NewSequence(
    const loom::v1::NewSequence& added) {
  const int64_t vocab = backend_.config().vocab_size;
  const uint64_t id = added.seq_id();
  LOOM_RETURN_IF_ERROR(CheckNewSequence(added, backend_.config()));
  const SamplingParams params = SamplingParamsFromProto(added.sampling());
  if (absl::Status status = ValidateSamplingParams(params, vocab); !status.ok()) {
    return absl::InvalidArgumentError(absl::StrFormat("sequence %d: %s", id, status.message()));
  }
  auto sequence = std::make_unique<SequenceState>();
  sequence->tokens.reserve(added.prompt_token_ids().size() + added.output_token_ids().size() + 1);
  sequence->tokens.assign(added.prompt_token_ids().begin(), added.prompt_token_ids().end());
  sequence->tokens.insert(sequence->tokens.end(), added.output_token_ids().begin(),
                          added.output_token_ids().end());
  sequence->num_computed = added.num_cached_tokens();
  sequence->num_logprobs = params.num_logprobs;
  sequence->num_prompt_tokens = added.prompt_token_ids().size();
  sequence->score_prompt_from = added.score_prompt_from();
  sequence->score_prompt_top = added.score_prompt_top();
  sequence->embed = added.embed();
  sequence->cache_salt = added.cache_salt();
  if (backend_.uses_samplers()) {
    sequence->sampler = std::make_unique<SequenceSampler>(
        params,
        absl::MakeConstSpan(added.prompt_token_ids().data(), added.prompt_token_ids().size()),
        vocab);
    if (!params.grammar_kind.empty()) {
      LOOM_RETURN_IF_ERROR(AttachGrammar(added.sampling().grammar(), id, *sequence->sampler));
    }
    for (int32_t token : added.output_token_ids()) sequence->sampler->RecordOutput(token);
  }
  return sequence;
}

absl::Status StepExecutor::CheckScheduled(const loom::v1::ScheduledSequence& entry,
                                          const SequenceState& sequence) const {
  const common::ModelConfig& config = backend_.config();
  const int64_t block_size = backend_.block_size();
  const int64_t num_blocks = backend_.num_kv_blocks();
  const int64_t max_blocks_per_sequence = (config.context_length + block_size - 1) / block_size;
  const uint64_t id = entry.seq_id();
  if (entry.num_tokens() < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("sequence %d: num_tokens must be >= 1, got %d", id, entry.num_tokens()));
  }
  for (int32_t block : entry.new_block_ids()) {
    if (block < 0 || block >= num_blocks) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "sequence %d: block id %d is outside the KV pool [0, %d)", id, block, num_blocks));
    }
  }
  const int64_t table_size =
      static_cast<int64_t>(sequence.block_table.size()) + entry.new_block_ids_size();
  if (table_size > max_blocks_per_sequence) {
    return absl::InvalidArgumentError(
        absl::StrFormat("sequence %d: %d blocks exceed the %d a context of %d tokens needs", id,
                        table_size, max_blocks_per_sequence, config.context_length));
  }
  const int64_t begin = sequence.num_computed;
  const int64_t end = begin + entry.num_tokens();
  int64_t known = static_cast<int64_t>(sequence.tokens.size());
  // A pipelined replica names the step's output tokens (stages before the last did not
  // sample them): each must be the one this worker has, or the next one it learns.
  const int64_t num_inputs = entry.input_token_ids_size();
  if (num_inputs > entry.num_tokens()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("sequence %d: %d input token ids for a step of %d tokens", id, num_inputs,
                        entry.num_tokens()));
  }
  LOOM_RETURN_IF_ERROR(CheckTokenIds(entry.input_token_ids(), config.vocab_size, id, "input"));
  for (int64_t i = 0; i < num_inputs; ++i) {
    const int64_t position = end - num_inputs + i;
    const int32_t token = entry.input_token_ids(static_cast<int>(i));
    if (position < known && sequence.tokens[position] != token) {
      return absl::InvalidArgumentError(
          absl::StrFormat("sequence %d: input token %d at position %d, but the worker has %d there",
                          id, token, position, sequence.tokens[position]));
    }
    if (position > known) {
      return absl::InvalidArgumentError(
          absl::StrFormat("sequence %d: input token at position %d, but the worker knows %d tokens",
                          id, position, known));
    }
    if (position == known) ++known;
  }
  if (end > known) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "sequence %d: computing tokens [%d, %d) runs past the %d tokens the worker knows", id,
        begin, end, known));
  }
  if (entry.sample() && end != known) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "sequence %d: sampling after token %d, but %d tokens are known", id, end, known));
  }
  const int32_t max_drafts = entry.num_speculative_tokens();
  if (max_drafts < 0 || max_drafts > kMaxSpeculativeTokens) {
    return absl::InvalidArgumentError(
        absl::StrFormat("sequence %d: num_speculative_tokens is %d, must be in [0, %d]", id,
                        max_drafts, kMaxSpeculativeTokens));
  }
  if (max_drafts > 0 && !entry.sample()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "sequence %d: speculating %d tokens needs a sampled step", id, max_drafts));
  }
  return absl::OkStatus();
}

void StepExecutor::Schedule(const loom::v1::ScheduledSequence& entry, int index,
                            SequenceState& sequence, Prepared& prepared) {
  // Input tokens it did not know (checked: they continue its tokens).
  const int64_t first_input =
      sequence.num_computed + entry.num_tokens() - entry.input_token_ids_size();
  for (int i = 0; i < entry.input_token_ids_size(); ++i) {
    if (first_input + i < static_cast<int64_t>(sequence.tokens.size())) continue;
    sequence.tokens.push_back(entry.input_token_ids(i));
    if (sequence.sampler != nullptr) sequence.sampler->RecordOutput(entry.input_token_ids(i));
  }
  Prepared::Entry& prepared_entry = prepared.entries.emplace_back();
  prepared_entry.sequence = &sequence;
  prepared_entry.index = index;
  prepared_entry.begin = sequence.num_computed;
  prepared_entry.end = sequence.num_computed + entry.num_tokens();
  prepared_entry.sample = entry.sample();
  // The step's blocks join the table now, not at commit: a copy of the table per step
  // would cost O(context). A plan that fails drops every sequence it names (DropNamed),
  // so no half-applied table outlives a failure.
  sequence.block_table.insert(sequence.block_table.end(), entry.new_block_ids().begin(),
                              entry.new_block_ids().end());
  // A constrained sequence does not speculate: its drafts would need the grammar's
  // state after each of them (simplest correct choice; the coordinator asks for none).
  const int32_t max_drafts = entry.num_speculative_tokens();
  const bool constrained = sequence.sampler != nullptr && sequence.sampler->constrained();
  if (max_drafts > 0 && !constrained) {
    // The drafts sit at positions [end, end + count): within the context and the slots
    // the coordinator gave (it reserved max_drafts of them).
    const int64_t end = prepared_entry.end;
    const int64_t room = std::min<int64_t>(
        backend_.config().context_length - end,
        static_cast<int64_t>(sequence.block_table.size()) * backend_.block_size() - end);
    prepared_entry.max_drafts = static_cast<int32_t>(std::clamp<int64_t>(room, 0, max_drafts));
  }
}

absl::Status StepExecutor::BuildBatch(const loom::v1::StepPlan& plan, Prepared& prepared) {
  for (size_t e = 0; e < prepared.entries.size(); ++e) {
    const Prepared::Entry& entry = prepared.entries[e];
    const uint64_t id = plan.scheduled(entry.index).seq_id();
    const size_t first_new = prepared.batch.token_ids.size();
    LOOM_RETURN_IF_ERROR(AppendEntry(e, prepared));
    if (entry.sequence->score_prompt_from > 0) prepared.AddScoreRows(id, entry, first_new);
    if (entry.sample) {
      prepared.rows.push_back({id, entry.sequence->sampler.get(), {}, {}, entry.sequence->embed});
      prepared.sampled.push_back(entry.sequence);
      prepared.speculative.push_back(plan.scheduled(entry.index).num_speculative_tokens() > 0);
      prepared.known.push_back(entry.end);
      prepared.drafts.push_back(std::move(prepared.proposals[e]));
    }
  }
  // The scored rows come after every sampled one (StepBackend::RunAndScore).
  prepared.batch.sample_rows.insert(prepared.batch.sample_rows.end(), prepared.score_rows.begin(),
                                    prepared.score_rows.end());
  // Views into `drafts`, taken once it no longer grows.
  for (size_t r = 0; r < prepared.rows.size(); ++r) {
    prepared.rows[r].draft_tokens = prepared.drafts[r].tokens;
    prepared.rows[r].draft_probs = prepared.drafts[r].probs;
  }
  return absl::OkStatus();
}

absl::Status StepExecutor::AppendEntry(size_t e, Prepared& prepared) const {
  const Prepared::Entry& entry = prepared.entries[e];
  const std::vector<int32_t>& drafts = prepared.proposals[e].tokens;
  const SequenceState& sequence = *entry.sequence;
  StepBatch& batch = prepared.batch;
  const auto block_size = static_cast<int32_t>(backend_.block_size());
  if (drafts.empty()) {
    return AppendSequence(
        batch, absl::MakeConstSpan(sequence.tokens).subspan(entry.begin, entry.end - entry.begin),
        static_cast<int32_t>(entry.begin), sequence.block_table, block_size, entry.sample);
  }
  const size_t first_new = batch.token_ids.size();
  std::vector<int32_t> step_tokens(sequence.tokens.begin() + entry.begin,
                                   sequence.tokens.begin() + entry.end);
  step_tokens.insert(step_tokens.end(), drafts.begin(), drafts.end());
  LOOM_RETURN_IF_ERROR(AppendSequence(batch, step_tokens, static_cast<int32_t>(entry.begin),
                                      sequence.block_table, block_size,
                                      /*sample_last=*/false));
  // The computed token's logits and each draft's.
  for (size_t d = 0; d <= drafts.size(); ++d) {
    batch.sample_rows.push_back(
        static_cast<int32_t>(first_new + (entry.end - entry.begin) - 1 + d));
  }
  return absl::OkStatus();
}

absl::Status StepExecutor::Propose(Prepared& prepared) {
  prepared.proposals.assign(prepared.entries.size(), DraftProposal{});
  if (options_.draft_proposer == nullptr) {
    for (size_t e = 0; e < prepared.entries.size(); ++e) {
      const Prepared::Entry& entry = prepared.entries[e];
      if (entry.max_drafts == 0) continue;
      prepared.proposals[e].tokens = ProposeNgram(entry.sequence->tokens, options_.ngram_min,
                                                  options_.ngram_max, entry.max_drafts);
    }
    return absl::OkStatus();
  }
  std::vector<DraftRequest> requests;
  std::vector<size_t> requesting;  // entry of each request
  for (size_t e = 0; e < prepared.entries.size(); ++e) {
    const Prepared::Entry& entry = prepared.entries[e];
    if (entry.max_drafts == 0) continue;
    DraftRequest& request = requests.emplace_back();
    request.tokens = entry.sequence->tokens;
    request.num_draft_computed = entry.sequence->num_draft_computed;
    request.block_table = entry.sequence->block_table;
    request.max_drafts = entry.max_drafts;
    request.sampler = entry.sequence->sampler.get();
    requesting.push_back(e);
  }
  if (requests.empty()) return absl::OkStatus();
  const auto start = std::chrono::steady_clock::now();
  std::vector<DraftProposal> proposals;
  LOOM_RETURN_IF_ERROR(options_.draft_proposer->Propose(requests, proposals));
  for (size_t r = 0; r < requests.size(); ++r) {
    prepared.proposals[requesting[r]] = std::move(proposals[r]);
  }
  prepared.propose_seconds = SecondsSince(start);
  return absl::OkStatus();
}

absl::Status StepExecutor::CheckEmitted(const Prepared& prepared,
                                        const std::vector<SampledToken>& tokens,
                                        const std::vector<int32_t>& num_emitted) const {
  if (num_emitted.size() != prepared.rows.size()) {
    return absl::InternalError(
        absl::StrFormat("the %s backend answered %d sequences of %d sampled",
                        std::string(backend_.name()), num_emitted.size(), prepared.rows.size()));
  }
  size_t total = 0;
  for (size_t r = 0; r < num_emitted.size(); ++r) {
    const size_t drafts = prepared.rows[r].draft_tokens.size();
    if (num_emitted[r] < 1 || static_cast<size_t>(num_emitted[r]) > drafts + 1) {
      return absl::InternalError(absl::StrFormat(
          "the %s backend emitted %d tokens for sequence %d with %d drafts",
          std::string(backend_.name()), num_emitted[r], prepared.rows[r].seq_id, drafts));
    }
    total += num_emitted[r];
  }
  if (tokens.size() != total) {
    return absl::InternalError(absl::StrFormat("the %s backend returned %d tokens, not %d",
                                               std::string(backend_.name()), tokens.size(), total));
  }
  return absl::OkStatus();
}

absl::Status StepExecutor::CopyKvBlocks(const loom::v1::StepPlan& plan) {
  if (options_.host_tier == nullptr) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the plan copies %d KV blocks, but this worker has no host tier (--kv-offload-memory)",
        plan.kv_copies_size()));
  }
  copies_.clear();
  for (const loom::v1::KvBlockCopy& copy : plan.kv_copies()) {
    copies_.push_back({copy.direction() == loom::v1::KvBlockCopy::DEVICE_TO_HOST,
                       copy.device_block(), copy.host_slot()});
  }
  return options_.host_tier->Apply(copies_);
}

void StepExecutor::ForgetWrittenBlocks(const loom::v1::StepPlan& plan, const Prepared& prepared) {
  for (const loom::v1::KvBlockCopy& copy : plan.kv_copies()) {
    if (copy.direction() == loom::v1::KvBlockCopy::HOST_TO_DEVICE && copy.device_block() >= 0 &&
        copy.device_block() < ledger_.num_blocks()) {
      ledger_.Invalidate(copy.device_block());
    }
  }
  const int64_t block_size = backend_.block_size();
  for (const Prepared::Entry& entry : prepared.entries) {
    const std::vector<int32_t>& table = entry.sequence->block_table;
    const int64_t last = std::min<int64_t>((entry.end + entry.max_drafts - 1) / block_size,
                                           static_cast<int64_t>(table.size()) - 1);
    for (int64_t b = entry.begin / block_size; b <= last; ++b) {
      ledger_.Invalidate(table[static_cast<size_t>(b)]);
    }
  }
}

void StepExecutor::RecordCompletedBlocks(const Prepared& prepared) {
  const int64_t block_size = backend_.block_size();
  for (const Prepared::Entry& entry : prepared.entries) {
    SequenceState& sequence = *entry.sequence;
    if (sequence.embed) continue;
    const int64_t full = std::min<int64_t>(
        std::min<int64_t>(sequence.num_computed, static_cast<int64_t>(sequence.tokens.size())) /
            block_size,
        static_cast<int64_t>(sequence.block_table.size()));
    for (int64_t b = sequence.num_ledgered_blocks; b < full; ++b) {
      ledger_.Record(
          sequence.block_table[static_cast<size_t>(b)],
          absl::MakeConstSpan(sequence.tokens)
              .subspan(static_cast<size_t>(b * block_size), static_cast<size_t>(block_size)),
          b == 0 ? KvBlockLedger::kNoParent : sequence.block_table[static_cast<size_t>(b - 1)],
          sequence.cache_salt);
    }
    sequence.num_ledgered_blocks = std::max(sequence.num_ledgered_blocks, full);
  }
}

void StepExecutor::DropNamed(const loom::v1::StepPlan& plan) {
  for (uint64_t id : plan.finished()) sequences_.erase(id);
  for (uint64_t id : plan.preempted()) sequences_.erase(id);
  for (const loom::v1::NewSequence& added : plan.added()) sequences_.erase(added.seq_id());
  for (const loom::v1::ScheduledSequence& entry : plan.scheduled()) {
    sequences_.erase(entry.seq_id());
  }
}

loom::v1::StepResult StepExecutor::Execute(const loom::v1::StepPlan& plan) {
  loom::v1::StepResult result;
  Execute(plan, result);
  return result;
}

void StepExecutor::DebugHooks() {
  if (options_.debug_hang_at_step > 0 && num_executed_ == options_.debug_hang_at_step) {
    std::fprintf(stderr, "loom-worker: --debug-hang-at-step %lld: step hangs (no progress)\n",
                 static_cast<long long>(options_.debug_hang_at_step));
    while (!hang_released_.load()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (int64_t left = options_.debug_step_delay_ms; left > 0; left -= 20) {
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min<int64_t>(left, 20)));
    if (options_.progress != nullptr) options_.progress->Advance();
  }
}

absl::Status StepExecutor::MoveKvBlocks(const loom::v1::StepPlan& plan) {
  // Slots a prefill worker pushed into hold blocks before copies reload them.
  LOOM_RETURN_IF_ERROR(AdoptPushedSlots(options_.host_tier, plan));
  // Blocks move between the pool and the host tier before the forward pass reads them.
  if (plan.kv_copies_size() == 0) return absl::OkStatus();
  LOOM_RETURN_IF_ERROR(CopyKvBlocks(plan));
  // Another worker waiting to read slots this plan wrote need not wait for its forward pass.
  kv_copied_step_id_.store(plan.step_id(), std::memory_order_release);
  return absl::OkStatus();
}

absl::Status StepExecutor::AdvanceStepId(uint64_t step_id) {
  if (has_last_step_id_ && step_id <= last_step_id_) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "step id %d does not follow step %d (ids must strictly increase)", step_id, last_step_id_));
  }
  has_last_step_id_ = true;
  last_step_id_ = step_id;
  return absl::OkStatus();
}

bool StepExecutor::kv_copies_failed(uint64_t first, uint64_t last) const {
  absl::MutexLock lock(&failed_copies_mu_);
  return std::any_of(failed_copy_steps_.begin(), failed_copy_steps_.end(),
                     [&](uint64_t step) { return step >= first && step <= last; });
}

void StepExecutor::Execute(const loom::v1::StepPlan& plan, loom::v1::StepResult& result,
                           const std::function<bool()>& abandoned) {
  const auto start = std::chrono::steady_clock::now();
  // The step counts as started and, on every way out, as ended.
  struct ProgressScope {
    StepProgress* progress;
    ~ProgressScope() {
      if (progress != nullptr) progress->EndStep();
    }
  } scope{options_.progress};
  if (options_.progress != nullptr) options_.progress->BeginStep(plan.step_id());
  ++num_executed_;
  DebugHooks();
  result.Clear();
  result.set_step_id(plan.step_id());

  absl::Status status = AdvanceStepId(plan.step_id());
  // Closed whatever becomes of the plan: their slots may hold other blocks once it is back.
  if (options_.host_tier != nullptr) options_.host_tier->CloseHolds(plan.kv_push_holds_closed());
  Prepared& prepared = *prepared_;
  prepared.Clear();
  prepared.batch.step_id = plan.step_id();
  if (status.ok()) status = Prepare(plan, prepared);
  if (status.ok()) ForgetWrittenBlocks(plan, prepared);
  if (status.ok()) status = MoveKvBlocks(plan);
  if (!status.ok() && plan.kv_copies_size() > 0) {
    absl::MutexLock lock(&failed_copies_mu_);
    failed_copy_steps_.push_back(plan.step_id());
    if (failed_copy_steps_.size() > kMaxFailedCopySteps) failed_copy_steps_.pop_front();
  }
  // Pipeline stages: a plan with work is one message between every pair of neighbours.
  if (!status.ok() && plan.scheduled_size() > 0) backend_.SkipStep(plan.step_id(), status);
  // Pushes go out layer by layer inside the forward pass; their outcome joins the result.
  const KvPushScope pushes(*pusher_, plan, result, status.ok(), abandoned);
  std::vector<SampledToken>& tokens = prepared.tokens;
  std::vector<int32_t>& num_emitted = prepared.num_emitted;
  BackendTimings timings;
  if (status.ok() && !prepared.entries.empty()) {
    if (prepared.score_targets.empty()) {
      status = backend_.Run(prepared.batch, prepared.rows, tokens, num_emitted, timings);
    } else {
      const ScoreRequest score{prepared.score_targets, prepared.score_top_counts};
      status = backend_.RunAndScore(prepared.batch, prepared.rows, score, tokens, num_emitted,
                                    prepared.scores, timings);
      size_t top_entries = 0;
      for (int32_t count : prepared.score_top_counts) top_entries += count;
      if (status.ok() && backend_.samples() &&
          (prepared.scores.logprobs.size() != prepared.score_targets.size() ||
           prepared.scores.ranks.size() != prepared.score_targets.size() ||
           prepared.scores.top.size() != top_entries)) {
        status = absl::InternalError(absl::StrFormat(
            "the %s backend scored %d rows of %d", std::string(backend_.name()),
            prepared.scores.logprobs.size(), prepared.score_targets.size()));
      }
    }
    if (status.ok() && backend_.samples()) status = CheckEmitted(prepared, tokens, num_emitted);
  }
  if (!status.ok()) {
    DropNamed(plan);
    result.set_error_code(static_cast<int32_t>(status.code()));
    result.set_error_message(std::string(status.message()));
    result.mutable_timings()->set_total_seconds(SecondsSince(start));
    return;
  }

  // Commit: releases, then additions, then the scheduled work and its samples.
  for (uint64_t id : plan.finished()) sequences_.erase(id);
  for (uint64_t id : plan.preempted()) sequences_.erase(id);
  for (auto& [id, sequence] : prepared.added) sequences_[id] = std::move(sequence);
  for (const Prepared::Entry& entry : prepared.entries) {
    entry.sequence->num_computed += plan.scheduled(entry.index).num_tokens();
  }
  result.mutable_outputs()->Reserve(static_cast<int>(tokens.size()));
  size_t next_token = 0;
  // A pipeline stage before the last computed its layers only: no tokens, no scores.
  const size_t num_sampled = backend_.samples() ? prepared.rows.size() : 0;
  if (!backend_.samples()) prepared.score_runs.clear();
  for (size_t r = 0; r < num_sampled; ++r) {
    SequenceState& sequence = *prepared.sampled[r];
    const int32_t emitted = num_emitted[r];
    // Accepted drafts' K/V were written by this step: they count as computed. The last
    // emitted token is the next one to compute, as after a plain decode.
    sequence.num_computed += emitted - 1;
    const int32_t num_drafts = static_cast<int32_t>(prepared.drafts[r].tokens.size());
    if (options_.draft_proposer != nullptr && num_drafts > 0) {
      sequence.num_draft_computed =
          DraftProposer::NumDraftComputedAfter(prepared.known[r], num_drafts, emitted - 1);
    }
    if (prepared.speculative[r]) {
      // The coordinator frees the blocks only rejected drafts used (the same rule on both
      // sides): later plans append after the trimmed table.
      const int64_t block_size = backend_.block_size();
      const size_t needed =
          static_cast<size_t>((sequence.num_computed + block_size - 1) / block_size);
      if (sequence.block_table.size() > needed) sequence.block_table.resize(needed);
    }
    for (int32_t e = 0; e < emitted; ++e) {
      const SampledToken& token = tokens[next_token++];
      sequence.tokens.push_back(token.token_id);
      loom::v1::SequenceOutput* output = result.add_outputs();
      output->set_seq_id(prepared.rows[r].seq_id);
      WriteSampledToken(token, sequence.num_logprobs >= 0, *output);
      if (e == 0 && prepared.speculative[r]) {
        output->set_num_draft_tokens(num_drafts);
        output->set_num_accepted_tokens(emitted - 1);
      }
    }
  }
  RecordCompletedBlocks(prepared);
  size_t next_score = 0;
  size_t next_top = 0;
  const PromptScores& scores = prepared.scores;
  for (const Prepared::ScoreRun& run : prepared.score_runs) {
    loom::v1::PromptLogprobs* scored = result.add_prompt_logprobs();
    scored->set_seq_id(run.seq_id);
    scored->set_first_token(static_cast<int32_t>(run.first_token));
    scored->mutable_logprobs()->Add(scores.logprobs.begin() + next_score,
                                    scores.logprobs.begin() + next_score + run.count);
    scored->mutable_ranks()->Add(scores.ranks.begin() + next_score,
                                 scores.ranks.begin() + next_score + run.count);
    for (int32_t i = 0; i < run.count; ++i) {
      for (int32_t k = 0; k < prepared.score_top_counts[next_score + i]; ++k) {
        const TokenLogprob& entry = scores.top.at(next_top++);
        loom::v1::TokenLogprob* top = scored->add_top_logprobs();
        top->set_token_id(entry.token_id);
        top->set_logprob(entry.logprob);
      }
    }
    next_score += run.count;
  }
  result.set_num_tokens(static_cast<int32_t>(prepared.batch.num_tokens()));
  loom::v1::StepTimings* step_timings = result.mutable_timings();
  // The draft model's passes count as forward time: the coordinator's speculation policy
  // learns what a step with drafts costs from it.
  step_timings->set_execute_seconds(timings.execute_seconds + prepared.propose_seconds);
  step_timings->set_sample_seconds(timings.sample_seconds);
  step_timings->set_total_seconds(SecondsSince(start));
}

}  // namespace loom::worker
