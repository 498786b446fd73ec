#include "worker/step_progress.h"

namespace loom::worker {

loom::v1::StepProgress StepProgress::Snapshot() const {
  loom::v1::StepProgress progress;
  progress.set_step_id(step_id_.load(std::memory_order_relaxed));
  progress.set_running(running_.load(std::memory_order_relaxed));
  progress.set_units_done(units_done_.load(std::memory_order_relaxed));
  progress.set_units_per_step(units_per_step_.load(std::memory_order_relaxed));
  progress.set_steps_started(steps_started_.load(std::memory_order_relaxed));
  return progress;
}

}  // namespace loom::worker
