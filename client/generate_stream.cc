#include "client/generate_stream.h"

#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/backoff.h"
#include "client/generate_call.h"
#include "client/wire.h"
#include "grpcpp/client_context.h"

namespace loom::client {

struct GenerateStream::Impl {
  std::shared_ptr<Endpoints> endpoints;
  std::shared_ptr<loom::v1::Inference::Stub> stub;  // of the attempt in flight
  loom::v1::GenerateRequest request;
  absl::Time deadline;
  std::string api_key;  // empty: no authorization metadata
  RetryPolicy retry;

  // The reader's state (Next() only).
  std::unique_ptr<grpc::ClientReader<loom::v1::GenerateResponse>> reader;
  bool received_any = false;  // a message arrived: from here on, never retry
  bool ended = false;
  absl::Status outcome;  // of an ended stream: OK after the final chunk

  mutable absl::Mutex mu;
  absl::CondVar cancelled_cv;
  bool cancelled ABSL_GUARDED_BY(mu) = false;
  // The context of the call in flight; replaced (under mu) for each attempt so Cancel()
  // always reaches the current one.
  std::unique_ptr<grpc::ClientContext> context ABSL_GUARDED_BY(mu);
  int attempts ABSL_GUARDED_BY(mu) = 0;

  // Starts attempt number `attempts + 1`; CANCELLED when Cancel() came first. The call
  // itself starts outside mu: a Cancel() that lands in between still reaches it, since
  // ClientContext::TryCancel before the call starts cancels it as it starts.
  absl::Status StartCall() {
    grpc::ClientContext* call_context = nullptr;
    {
      absl::MutexLock lock(&mu);
      if (cancelled) return absl::CancelledError("the client cancelled the call");
      context = std::make_unique<grpc::ClientContext>();
      if (deadline != absl::InfiniteFuture()) context->set_deadline(absl::ToChronoTime(deadline));
      if (!api_key.empty()) context->AddMetadata("authorization", "Bearer " + api_key);
      ++attempts;
      call_context = context.get();
    }
    stub = endpoints->Stub();
    reader = stub->Generate(call_context, request);
    return absl::OkStatus();
  }

  // Sleeps `backoff` unless Cancel() comes first (false then).
  bool SleepUnlessCancelled(absl::Duration backoff) {
    absl::MutexLock lock(&mu);
    const absl::Time until = absl::Now() + backoff;
    while (!cancelled && absl::Now() < until) cancelled_cv.WaitWithDeadline(&mu, until);
    return !cancelled;
  }

  // The reader's final status, the reader released.
  absl::Status FinishCall() {
    const grpc::Status status = reader->Finish();
    reader.reset();
    last_status = status;
    return FromGrpcStatus(status);
  }
  // The attempt that failed will be retried: the next goes where Endpoints::Turn says.
  void Turn() {
    absl::MutexLock lock(&mu);
    if (context != nullptr) endpoints->Turn(*context, last_status);
  }
  grpc::Status last_status;  // of the last attempt that finished

  void End(absl::Status status) {
    ended = true;
    outcome = std::move(status);
  }
};

std::unique_ptr<GenerateStream> MakeGenerateStream(std::unique_ptr<GenerateStream::Impl> impl) {
  return std::unique_ptr<GenerateStream>(new GenerateStream(std::move(impl)));
}

std::unique_ptr<GenerateStream> StartGenerateCall(std::shared_ptr<Endpoints> endpoints,
                                                  loom::v1::GenerateRequest request,
                                                  absl::Time deadline, RetryPolicy retry,
                                                  std::string api_key) {
  auto impl = std::make_unique<GenerateStream::Impl>();
  impl->api_key = std::move(api_key);
  impl->endpoints = std::move(endpoints);
  impl->request = std::move(request);
  impl->deadline = deadline;
  impl->retry = retry;
  return MakeGenerateStream(std::move(impl));
}

GenerateStream::GenerateStream(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

GenerateStream::~GenerateStream() {
  if (impl_->reader != nullptr) {
    // A stream dropped mid-call: cancel, then drain so Finish() returns at once and the
    // call's resources are released. The reader must go before the context it uses, which
    // Impl's member order alone would not ensure.
    Cancel();
    loom::v1::GenerateResponse ignored;
    while (impl_->reader->Read(&ignored)) {
    }
    impl_->FinishCall().IgnoreError();
  }
}

absl::StatusOr<std::optional<GenerateChunk>> GenerateStream::Next() {
  Impl& s = *impl_;
  while (!s.ended) {
    if (s.reader == nullptr) {
      if (absl::Status started = s.StartCall(); !started.ok()) {
        s.End(started);
        break;
      }
    }
    loom::v1::GenerateResponse response;
    if (s.reader->Read(&response)) {
      s.received_any = true;
      GenerateChunk chunk = FromWire(response);
      if (chunk.finish_reason != FinishReason::kNone) {
        // The server ends the call right after the final message.
        loom::v1::GenerateResponse ignored;
        while (s.reader->Read(&ignored)) {
        }
        s.End(s.FinishCall());
      }
      return std::optional<GenerateChunk>(std::move(chunk));
    }
    absl::Status status = s.FinishCall();
    if (status.ok()) {
      s.End(absl::InternalError("the Generate stream ended without a finish reason"));
      break;
    }
    const int attempts_made = attempts();
    // Retry only while nothing was received: tokens already seen cannot be taken back.
    if (s.received_any || !IsRetryable(status) || attempts_made >= s.retry.max_attempts) {
      s.End(std::move(status));
      break;
    }
    const absl::Duration backoff = BackoffBefore(s.retry, attempts_made);
    if (absl::Now() + backoff >= s.deadline) {
      s.End(std::move(status));
      break;
    }
    if (!s.SleepUnlessCancelled(backoff)) {
      s.End(absl::CancelledError("the client cancelled the call"));
      break;
    }
    s.Turn();
  }
  if (!s.outcome.ok()) return s.outcome;
  return std::optional<GenerateChunk>();
}

void GenerateStream::Cancel() {
  absl::MutexLock lock(&impl_->mu);
  impl_->cancelled = true;
  if (impl_->context != nullptr) impl_->context->TryCancel();
  impl_->cancelled_cv.SignalAll();
}

int GenerateStream::attempts() const {
  absl::MutexLock lock(&impl_->mu);
  return impl_->attempts;
}

}  // namespace loom::client
