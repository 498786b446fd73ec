#include "worker/worker_metrics.h"

#include <algorithm>
#include <vector>

namespace loom::worker {
namespace {

// Moves a counter mirroring a cumulative count `now` by what it grew since `recorded`.
void Advance(prometheus::Counter* counter, int64_t now, int64_t& recorded) {
  if (now > recorded) counter->Increment(static_cast<double>(now - recorded));
  recorded = now;
}

prometheus::Histogram::BucketBoundaries PowersOfTwo(double last) {
  prometheus::Histogram::BucketBoundaries buckets;
  for (double b = 1; b <= last; b *= 2) buckets.push_back(b);
  return buckets;
}

}  // namespace

WorkerMetrics::WorkerMetrics(const std::string& replica_id, int rank, const std::string& backend,
                             int64_t num_kv_blocks)
    : registry_(std::make_shared<prometheus::Registry>()) {
  const prometheus::Labels labels = {
      {"replica", replica_id}, {"rank", std::to_string(rank)}, {"backend", backend}};
  prometheus::BuildGauge()
      .Name("loom_worker_up")
      .Help("1 while the worker process serves.")
      .Register(*registry_)
      .Add(labels)
      .Set(1);
  prometheus::BuildGauge()
      .Name("loom_worker_kv_blocks_capacity")
      .Help("Blocks in the worker's KV pool.")
      .Register(*registry_)
      .Add(labels)
      .Set(static_cast<double>(num_kv_blocks));
  step_seconds_ = &prometheus::BuildHistogram()
                       .Name("loom_worker_step_seconds")
                       .Help("Wall time of one step on the worker (plan received to result).")
                       .Register(*registry_)
                       .Add(labels, prometheus::Histogram::BucketBoundaries{
                                        0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                        0.5, 1.0, 2.5, 5.0, 10.0, 30.0});
  batch_size_ = &prometheus::BuildHistogram()
                     .Name("loom_worker_batch_size")
                     .Help("Sequences computed in one step.")
                     .Register(*registry_)
                     .Add(labels, PowersOfTwo(1024));
  tokens_per_step_ = &prometheus::BuildHistogram()
                          .Name("loom_worker_tokens_per_step")
                          .Help("Tokens (prefill and decode) computed in one step.")
                          .Register(*registry_)
                          .Add(labels, PowersOfTwo(16384));
  steps_ = &prometheus::BuildCounter()
                .Name("loom_worker_steps_total")
                .Help("Steps the worker executed.")
                .Register(*registry_)
                .Add(labels);
  rejected_steps_ = &prometheus::BuildCounter()
                         .Name("loom_worker_rejected_steps_total")
                         .Help("Plans the worker rejected as invalid (a coordinator bug).")
                         .Register(*registry_)
                         .Add(labels);
  sequences_ = &prometheus::BuildGauge()
                    .Name("loom_worker_sequences")
                    .Help("Sequences whose state the worker holds.")
                    .Register(*registry_)
                    .Add(labels);
  eager_steps_ = &prometheus::BuildCounter()
                     .Name("loom_worker_eager_steps_total")
                     .Help("CUDA forward passes run op by op (not replayed from a graph).")
                     .Register(*registry_)
                     .Add(labels);
  graph_captures_ = &prometheus::BuildCounter()
                        .Name("loom_worker_cuda_graph_captures_total")
                        .Help("CUDA graphs captured (a decode bucket's second step).")
                        .Register(*registry_)
                        .Add(labels);
  graph_replays_ = &prometheus::BuildCounter()
                       .Name("loom_worker_cuda_graph_replays_total")
                       .Help("Decode steps run by replaying a captured CUDA graph.")
                       .Register(*registry_)
                       .Add(labels);
  graph_capture_failures_ =
      &prometheus::BuildCounter()
           .Name("loom_worker_cuda_graph_capture_failures_total")
           .Help("CUDA graph captures that failed; their steps ran eagerly instead.")
           .Register(*registry_)
           .Add(labels);
  // With loom_worker_step_seconds (the whole step), where a step's time goes: what is
  // neither is the plan's preparation, the KV copies and the result's assembly.
  execute_seconds_ = &prometheus::BuildCounter()
                          .Name("loom_worker_execute_seconds_total")
                          .Help("Time inside steps spent in the forward pass (with drafting).")
                          .Register(*registry_)
                          .Add(labels);
  sample_seconds_ = &prometheus::BuildCounter()
                         .Name("loom_worker_sample_seconds_total")
                         .Help("Time inside steps spent sampling.")
                         .Register(*registry_)
                         .Add(labels);
  pipeline_wait_ = &prometheus::BuildCounter()
                        .Name("loom_worker_pipeline_wait_seconds_total")
                        .Help(
                            "Pipeline stage: time inside steps spent waiting for the previous "
                            "stage's activations or for the next stage to take this one's.")
                        .Register(*registry_)
                        .Add(labels);
  host_tier_capacity_ = &prometheus::BuildGauge()
                             .Name("loom_worker_kv_host_tier_blocks_capacity")
                             .Help("Blocks the worker's host KV tier holds (--kv-offload-memory).")
                             .Register(*registry_)
                             .Add(labels);
  auto& blocks = prometheus::BuildCounter()
                     .Name("loom_worker_kv_transfer_blocks_total")
                     .Help("KV blocks copied between the pool and the host tier, by direction.")
                     .Register(*registry_);
  auto& bytes = prometheus::BuildCounter()
                    .Name("loom_worker_kv_transfer_bytes_total")
                    .Help(
                        "Bytes of KV copied between the pool and the host tier (to_host, "
                        "to_device) and between workers (to_peer: served to a fetch or pushed; "
                        "from_peer: fetched or pushed here over TCP; from_peer_shared_memory: "
                        "fetched by mapping a tier of this machine).")
                    .Register(*registry_);
  auto with = [&labels](const char* direction) {
    prometheus::Labels out = labels;
    out["direction"] = direction;
    return out;
  };
  blocks_to_host_ = &blocks.Add(with("to_host"));
  blocks_to_device_ = &blocks.Add(with("to_device"));
  bytes_to_host_ = &bytes.Add(with("to_host"));
  bytes_to_device_ = &bytes.Add(with("to_device"));
  bytes_to_peer_ = &bytes.Add(with("to_peer"));
  bytes_from_peer_ = &bytes.Add(with("from_peer"));
  bytes_from_peer_shared_ = &bytes.Add(with("from_peer_shared_memory"));
  fetch_seconds_ = &prometheus::BuildCounter()
                        .Name("loom_worker_kv_fetch_seconds_total")
                        .Help("Time spent fetching KV blocks from other workers' host tiers.")
                        .Register(*registry_)
                        .Add(labels);
  transfer_seconds_ = &prometheus::BuildHistogram()
                           .Name("loom_worker_kv_transfer_seconds")
                           .Help("Time one plan's KV copies (offloads and reloads) took.")
                           .Register(*registry_)
                           .Add(labels, prometheus::Histogram::BucketBoundaries{
                                            0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                                            0.025, 0.05, 0.1, 0.25, 1.0});
}

void WorkerMetrics::SetHostTierCapacity(int64_t blocks) {
  host_tier_capacity_->Set(static_cast<double>(blocks));
}

void WorkerMetrics::RecordKvTransfers(const KvTransferStats& stats) {
  Advance(blocks_to_host_, stats.blocks_to_host, recorded_transfers_.blocks_to_host);
  Advance(blocks_to_device_, stats.blocks_to_device, recorded_transfers_.blocks_to_device);
  Advance(bytes_to_host_, stats.bytes_to_host, recorded_transfers_.bytes_to_host);
  Advance(bytes_to_device_, stats.bytes_to_device, recorded_transfers_.bytes_to_device);
  Advance(bytes_to_peer_, stats.bytes_served, recorded_transfers_.bytes_served);
  Advance(bytes_from_peer_, stats.bytes_fetched - stats.bytes_fetched_shared,
          recorded_transfers_.bytes_fetched);
  Advance(bytes_from_peer_shared_, stats.bytes_fetched_shared,
          recorded_transfers_.bytes_fetched_shared);
  if (stats.fetch_seconds > recorded_transfers_.fetch_seconds) {
    fetch_seconds_->Increment(stats.fetch_seconds - recorded_transfers_.fetch_seconds);
    recorded_transfers_.fetch_seconds = stats.fetch_seconds;
  }
  if (stats.seconds > recorded_transfers_.seconds) {
    transfer_seconds_->Observe(stats.seconds - recorded_transfers_.seconds);
    recorded_transfers_.seconds = stats.seconds;
  }
}

void WorkerMetrics::RecordStep(const loom::v1::StepTimings& timings, int64_t sequences,
                               int64_t tokens, bool rejected) {
  step_seconds_->Observe(timings.total_seconds());
  execute_seconds_->Increment(std::max(timings.execute_seconds(), 0.0));
  sample_seconds_->Increment(std::max(timings.sample_seconds(), 0.0));
  batch_size_->Observe(static_cast<double>(sequences));
  tokens_per_step_->Observe(static_cast<double>(tokens));
  steps_->Increment();
  if (rejected) rejected_steps_->Increment();
}

void WorkerMetrics::SetSequences(int64_t sequences) {
  sequences_->Set(static_cast<double>(sequences));
}

void WorkerMetrics::RecordForwardPassStats(const ForwardPassStats& stats) {
  Advance(eager_steps_, stats.eager_steps, recorded_.eager_steps);
  Advance(graph_captures_, stats.graph_captures, recorded_.graph_captures);
  Advance(graph_replays_, stats.graph_replays, recorded_.graph_replays);
  Advance(graph_capture_failures_, stats.graph_capture_failures, recorded_.graph_capture_failures);
  if (stats.pipeline_wait_seconds > recorded_.pipeline_wait_seconds) {
    pipeline_wait_->Increment(stats.pipeline_wait_seconds - recorded_.pipeline_wait_seconds);
    recorded_.pipeline_wait_seconds = stats.pipeline_wait_seconds;
  }
}

}  // namespace loom::worker
