#include "engine/step_plan.h"

#include <algorithm>

namespace loom::engine {

void BuildStepPlan(const SchedulerOutput& out, uint64_t step_id, loom::v1::StepPlan& plan,
                   bool with_input_tokens) {
  plan.Clear();
  plan.set_step_id(step_id);
  for (const ScheduledWork& work : out.scheduled) {
    const Sequence& seq = *work.seq;
    if (work.is_new) {
      loom::v1::NewSequence* added = plan.add_added();
      added->set_seq_id(seq.seq_id);
      added->mutable_prompt_token_ids()->Add(seq.prompt_ids.begin(), seq.prompt_ids.end());
      added->mutable_output_token_ids()->Add(seq.output_ids.begin(), seq.output_ids.end());
      *added->mutable_sampling() = seq.sampling;
      added->set_num_cached_tokens(work.num_cached_tokens);
      if (seq.embed) added->set_embed(true);
      if (!seq.cache_salt.empty()) added->set_cache_salt(seq.cache_salt);
      if (seq.score_prompt_from > 0) {
        added->set_score_prompt_from(seq.score_prompt_from);
        added->set_score_prompt_top(seq.score_prompt_top);
      }
    }
    loom::v1::ScheduledSequence* scheduled = plan.add_scheduled();
    scheduled->set_seq_id(seq.seq_id);
    scheduled->mutable_new_block_ids()->Add(work.new_block_ids.begin(), work.new_block_ids.end());
    scheduled->set_num_tokens(work.num_tokens);
    scheduled->set_sample(work.sample);
    if (work.num_speculative_tokens > 0) {
      scheduled->set_num_speculative_tokens(work.num_speculative_tokens);
    }
    if (with_input_tokens && !work.is_new) {
      // The step computes tokens [num_computed - num_tokens, num_computed): those past the
      // prompt are outputs, applied here before this plan was built.
      const int64_t prompt = static_cast<int64_t>(seq.prompt_ids.size());
      const int64_t begin = std::max<int64_t>(seq.num_computed - work.num_tokens, prompt);
      for (int64_t p = begin; p < seq.num_computed; ++p) {
        scheduled->add_input_token_ids(seq.output_ids.at(static_cast<size_t>(p - prompt)));
      }
    }
  }
  plan.mutable_finished()->Add(out.finished.begin(), out.finished.end());
  plan.mutable_preempted()->Add(out.preempted.begin(), out.preempted.end());
  for (const KvCopy& copy : out.kv_copies) {
    loom::v1::KvBlockCopy* added = plan.add_kv_copies();
    added->set_direction(copy.to_host ? loom::v1::KvBlockCopy::DEVICE_TO_HOST
                                      : loom::v1::KvBlockCopy::HOST_TO_DEVICE);
    added->set_device_block(copy.device_block);
    added->set_host_slot(copy.host_slot);
  }
  plan.mutable_kv_push_holds_closed()->Add(out.kv_push_holds_closed.begin(),
                                           out.kv_push_holds_closed.end());
}

}  // namespace loom::engine
