#pragma once

#include <cstdint>

#include "engine/scheduler.h"
#include "loom/v1/worker.pb.h"

namespace loom::engine {

/// Writes the scheduler's plan as the wire's StepPlan `step_id`: for each scheduled
/// sequence in batch order, a NewSequence first when the worker does not hold it (prompt,
/// outputs so far, sampling, cached prefix, prompt scoring), then its ScheduledSequence;
/// then the released and preempted ids. `plan` is cleared first (its sequence messages
/// keep their allocations). The replica's step loop and the in-process engine
/// (cli/local_engine) both send their plans through this.
/// `with_input_tokens` (pipeline parallelism): each scheduled entry also names the output
/// tokens it computes (ScheduledSequence.input_token_ids), which the scheduler applied
/// before planning it (SchedulerConfig::overlap_samples false).
void BuildStepPlan(const SchedulerOutput& out, uint64_t step_id, loom::v1::StepPlan& plan,
                   bool with_input_tokens = false);

}  // namespace loom::engine
