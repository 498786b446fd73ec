#pragma once

#include <atomic>
#include <cstdint>

#include "loom/v1/worker.pb.h"

namespace loom::worker {

/// How far a worker's steps have got, written by the thread that computes them and read
/// by the heartbeat thread. Every field is a relaxed atomic: the computing thread pays one
/// uncontended atomic add per unit of work (a layer's attention or FFN, a phase of the
/// step) and never waits for the reader, and a SIGSTOPped or deadlocked computing thread
/// leaves the count frozen while the heartbeat keeps reporting it, which is how the
/// coordinator tells a slow step (the count moves) from a stuck one (it does not).
/// Thread-safe.
class StepProgress {
 public:
  /// Computing thread: the plan `step_id` starts executing (counts as a unit).
  void BeginStep(uint64_t step_id) {
    step_id_.store(step_id, std::memory_order_relaxed);
    steps_started_.fetch_add(1, std::memory_order_relaxed);
    running_.store(true, std::memory_order_relaxed);
    Advance();
  }
  /// Computing thread: one more unit of work is done.
  void Advance() { units_done_.fetch_add(1, std::memory_order_relaxed); }
  /// Computing thread: the running step ended (its result is being sent).
  void EndStep() {
    Advance();
    running_.store(false, std::memory_order_relaxed);
  }
  /// About how many units one step advances the count by (set at start-up, reported so
  /// the coordinator can expect a unit every step time / units_per_step).
  void set_units_per_step(uint32_t units) {
    units_per_step_.store(units, std::memory_order_relaxed);
  }

  /// Any thread: the state as the heartbeat reports it (fields read one by one, so a
  /// report taken while a step begins may pair the new step id with the old count).
  loom::v1::StepProgress Snapshot() const;
  /// Units done since construction.
  uint64_t units_done() const { return units_done_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> step_id_{0};
  std::atomic<bool> running_{false};
  // Never decreases.
  std::atomic<uint64_t> units_done_{0};
  std::atomic<uint64_t> steps_started_{0};
  std::atomic<uint32_t> units_per_step_{1};
};

}  // namespace loom::worker
