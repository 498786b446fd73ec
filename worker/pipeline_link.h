#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "gloo/rendezvous/store.h"

namespace gloo {
class Context;
namespace transport {
class UnboundBuffer;
}
}  // namespace gloo

namespace loom::worker {

struct PipelineLinkOptions {
  std::string hostname = "127.0.0.1";  // the address the neighbouring stages reach this one at
  // Rendezvous, and the longest a stage waits for its neighbour's message of a step (the
  // previous stage's whole step): a dead or stalled neighbour fails the step after this.
  std::chrono::milliseconds timeout{300000};
};

/// Pipeline parallelism's channel between the stages of one tensor-parallel rank column
/// (stage s's rank k sends to stage s + 1's rank k): for every step that computes
/// anything, each stage but the first receives exactly one message from its predecessor
/// and each stage but the last sends exactly one to its successor, in step order. A message
/// is a header (step id, and OK or the failure that stopped the step upstream) and, when
/// OK, the step's residual stream (two [tokens, hidden] F32 arrays). A stage whose step
/// failed sends the failure on instead of activations, and one that fails before
/// receiving still takes its predecessor's message: the stages stay aligned and every
/// later stage reports the step as failed, none waits for a message that never comes.
/// Over gloo's TCP pairs (a send completes once the successor posted the receive, so at
/// most one step's activations are buffered per link); a closed peer fails at once, a
/// silent one after the timeout. Not thread-safe: the worker's step thread uses it.
class PipelineLink {
 public:
  /// InvalidArgument unless a forward pass of pipeline stage `stage` of `num_stages` got
  /// a link of that stage and size (none needed for a single stage).
  static absl::Status CheckStage(const PipelineLink* link, int stage, int num_stages);

  /// Connects stage `stage` of `num_stages` (> 1) to the others of its column through
  /// `store` (every stage passes a store with the same prefix).
  static absl::StatusOr<std::unique_ptr<PipelineLink>> Connect(
      std::shared_ptr<gloo::rendezvous::Store> store, int stage, int num_stages,
      const PipelineLinkOptions& options);
  ~PipelineLink();

  int stage() const { return stage_; }
  int num_stages() const { return num_stages_; }
  bool has_previous() const { return stage_ > 0; }
  bool has_next() const { return stage_ + 1 < num_stages_; }

  /// Sends step `step_id`'s residual stream to the next stage. Returns once the arrays are
  /// copied (the transfer completes in the background; the next Send waits for it).
  absl::Status Send(uint64_t step_id, absl::Span<const float> residual,
                    absl::Span<const float> proj);
  /// Tells the next stage that step `step_id` failed here (or upstream) with `why`.
  absl::Status SendFailure(uint64_t step_id, const absl::Status& why);
  /// Receives step `step_id`'s residual stream from the previous stage into `residual` and
  /// `proj` (each as long as the sender's). Aborted with the upstream stage's message when
  /// the step failed there; Internal when the message is for another step or of another
  /// size (the stages disagree on the plan).
  absl::Status Receive(uint64_t step_id, absl::Span<float> residual, absl::Span<float> proj);
  /// Receives and drops step `step_id`'s message (a step that failed here before Receive).
  absl::Status Discard(uint64_t step_id);
  /// Seconds spent so far waiting for the previous stage's messages and for the next stage
  /// to take this one's (the pipeline's bubbles, as this stage sees them).
  double wait_seconds() const { return wait_seconds_; }

 private:
  struct Header;
  PipelineLink(std::shared_ptr<gloo::Context> context, int stage, int num_stages,
               std::chrono::milliseconds timeout);
  // Waits for the send in flight (if any) to complete.
  absl::Status FinishSend();
  absl::Status SendHeader(const Header& header);
  absl::Status ReceiveHeader(uint64_t step_id, Header& header);
  // Receives `count` floats into `out` (the successor of a header that announced them).
  absl::Status ReceiveFloats(float* out, int64_t count, uint64_t slot);
  // gloo's exceptions as a Status; the link is broken after the first failure.
  template <typename F>
  absl::Status Run(const char* what, F&& transfer);

  std::shared_ptr<gloo::Context> context_;
  int stage_;
  int num_stages_;
  std::chrono::milliseconds timeout_;
  absl::Status broken_;
  // The message being sent: the header then the payload, one buffer; its transfer may
  // still be in flight (send_pending_).
  std::vector<uint8_t> send_buffer_;
  std::unique_ptr<gloo::transport::UnboundBuffer> send_header_, send_payload_;
  bool send_pending_ = false;
  std::vector<uint8_t> receive_header_;
  std::vector<float> discard_;
  double wait_seconds_ = 0;
};

}  // namespace loom::worker
