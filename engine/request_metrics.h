#pragma once

#include <cstdint>
#include <string>

#include "loom/v1/inference.pb.h"

namespace loom::engine {

/// What one finished request reports to the metrics (durations in seconds; negative when
/// the request never reached that point, e.g. no token before an abort). Token counters,
/// TTFT, prefix-cache and speculative counters are recorded as they happen instead
/// (RequestMetrics::Record*).
struct RequestRecord {
  std::string replica_id;                  // where it ran last ("" if never placed)
  loom::v1::FinishReason finish_reason = loom::v1::FINISH_REASON_UNSPECIFIED;
  int64_t prompt_tokens = 0;
  int64_t generation_tokens = 0;
  int64_t max_tokens = 0;       // the request's max_tokens parameter
  double queue_seconds = -1;    // arrival to first scheduled
  double prefill_seconds = -1;  // first scheduled to first token
  double decode_seconds = -1;   // first token to last token
  double inference_seconds = -1;  // first scheduled to finish
  double e2e_seconds = -1;      // arrival to finish
  // Disaggregated prefill and decode: the hand-off, from the prefill replica's first token
  // to the decode replica's admission with the KV fetched (or not); -1: not handed off.
  double transfer_seconds = -1;
};

/// The latency series of one replica, looked up once per request; defined by the
/// implementation (the coordinator's Prometheus histograms), opaque to the engine.
struct ReplicaLatencySeries;

/// Where a Request reports its timeline as it happens. The engine core only calls it; the
/// coordinator's CoordinatorMetrics implements it (Prometheus), so engine/ links no
/// metrics library. Implementations are thread-safe: requests of several replicas report
/// at once.
class RequestMetrics {
 public:
  virtual ~RequestMetrics() = default;
  /// A finished request's timeline.
  virtual void RecordRequest(const RequestRecord& record) = 0;
  /// A request's first token, `ttft_seconds` after its arrival, on `replica_id`. Returns
  /// the replica's latency series for the request's later tokens (valid for the
  /// implementation's lifetime).
  virtual const ReplicaLatencySeries& RecordFirstToken(const std::string& replica_id,
                                                       double ttft_seconds,
                                                       int64_t prompt_tokens) = 0;
  /// One more token streamed, `inter_token_seconds` after the previous one of the request.
  virtual void RecordToken(const ReplicaLatencySeries& series, double inter_token_seconds) = 0;
  /// Prefix-cache lookup when a replica schedules a prompt: tokens queried and found.
  virtual void RecordPrefixCacheQuery(const std::string& replica_id, int64_t queried,
                                      int64_t hits) = 0;
  /// One speculative step of one sequence: tokens drafted and accepted.
  virtual void RecordSpeculativeStep(int64_t drafted, int64_t accepted) = 0;
};

}  // namespace loom::engine
