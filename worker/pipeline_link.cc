#include "worker/pipeline_link.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "gloo/common/error.h"
#include "gloo/rendezvous/context.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/transport/unbound_buffer.h"
#include "worker/gloo_status.h"

namespace loom::worker {
namespace {

// The link's context carries nothing else, so fixed slots tell the three parts apart.
constexpr uint64_t kHeaderSlot = 1;
constexpr uint64_t kResidualSlot = 2;
constexpr uint64_t kProjSlot = 3;

absl::Status FromGlooException(const char* what, const std::exception& error) {
  return GlooStatus("pipeline", what, error);
}

// Adds the scope's duration to `total`.
class WaitTimer {
 public:
  explicit WaitTimer(double& total) : total_(total), start_(std::chrono::steady_clock::now()) {}
  ~WaitTimer() {
    total_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  double& total_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace

struct PipelineLink::Header {
  uint64_t step_id = 0;
  int32_t code = 0;  // absl::StatusCode of a failed step; 0: activations follow
  int32_t message_bytes = 0;
  int64_t residual_floats = 0;
  int64_t proj_floats = 0;
  char message[224] = {};
};

absl::StatusOr<std::unique_ptr<PipelineLink>> PipelineLink::Connect(
    std::shared_ptr<gloo::rendezvous::Store> store, int stage, int num_stages,
    const PipelineLinkOptions& options) {
  if (num_stages < 2 || stage < 0 || stage >= num_stages) {
    return absl::InvalidArgumentError(
        absl::StrFormat("stage %d is outside a pipeline of %d stages", stage, num_stages));
  }
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.hostname;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(stage, num_stages);
    context->setTimeout(options.timeout);
    context->connectFullMesh(*store, device);
    return std::unique_ptr<PipelineLink>(
        new PipelineLink(std::move(context), stage, num_stages, options.timeout));
  } catch (const std::exception& error) {
    return FromGlooException("rendezvous", error);
  }
}

PipelineLink::PipelineLink(std::shared_ptr<gloo::Context> context, int stage, int num_stages,
                           std::chrono::milliseconds timeout)
    : context_(std::move(context)),
      stage_(stage),
      num_stages_(num_stages),
      timeout_(timeout),
      receive_header_(sizeof(Header)) {
  static_assert(sizeof(Header) == 256, "a fixed-size message");
}

PipelineLink::~PipelineLink() {
  // A send still in flight reads send_buffer_: let it finish (or fail) first.
  (void)FinishSend();
}

template <typename F>
absl::Status PipelineLink::Run(const char* what, F&& transfer) {
  if (!broken_.ok()) return broken_;
  try {
    return transfer();
  } catch (const std::exception& error) {
    broken_ = FromGlooException(what, error);
    return broken_;
  }
}

absl::Status PipelineLink::FinishSend() {
  if (!send_pending_) return broken_;
  send_pending_ = false;
  return Run("send", [&]() -> absl::Status {
    // One completion per part sent: the header, and with activations the two arrays.
    const auto* header = reinterpret_cast<const Header*>(send_buffer_.data());
    const int parts = header->code == 0 ? 3 : 1;
    WaitTimer timer(wait_seconds_);
    for (int i = 0; i < parts; ++i) {
      if (!send_header_->waitSend(timeout_)) {
        return absl::AbortedError("pipeline send: aborted");
      }
    }
    return absl::OkStatus();
  });
}

absl::Status PipelineLink::SendHeader(const Header& header) {
  const size_t floats = static_cast<size_t>(header.residual_floats + header.proj_floats);
  const size_t bytes = sizeof(Header) + floats * sizeof(float);
  if (send_buffer_.size() < bytes || send_header_ == nullptr) {
    send_buffer_.resize(std::max(bytes, send_buffer_.size()));
    send_header_ = context_->createUnboundBuffer(send_buffer_.data(), send_buffer_.size());
  }
  std::memcpy(send_buffer_.data(), &header, sizeof(Header));
  return absl::OkStatus();
}

absl::Status PipelineLink::Send(uint64_t step_id, absl::Span<const float> residual,
                                absl::Span<const float> proj) {
  if (!has_next()) return absl::FailedPreconditionError("the last stage sends nothing");
  LOOM_RETURN_IF_ERROR(FinishSend());
  Header header;
  header.step_id = step_id;
  header.residual_floats = static_cast<int64_t>(residual.size());
  header.proj_floats = static_cast<int64_t>(proj.size());
  return Run("send", [&]() -> absl::Status {
    LOOM_RETURN_IF_ERROR(SendHeader(header));
    uint8_t* payload = send_buffer_.data() + sizeof(Header);
    std::memcpy(payload, residual.data(), residual.size() * sizeof(float));
    std::memcpy(payload + residual.size() * sizeof(float), proj.data(),
                proj.size() * sizeof(float));
    const int next = stage_ + 1;
    send_header_->send(next, kHeaderSlot, 0, sizeof(Header));
    send_header_->send(next, kResidualSlot, sizeof(Header), residual.size() * sizeof(float));
    send_header_->send(next, kProjSlot, sizeof(Header) + residual.size() * sizeof(float),
                       proj.size() * sizeof(float));
    send_pending_ = true;
    return absl::OkStatus();
  });
}

absl::Status PipelineLink::SendFailure(uint64_t step_id, const absl::Status& why) {
  if (!has_next()) return absl::FailedPreconditionError("the last stage sends nothing");
  LOOM_RETURN_IF_ERROR(FinishSend());
  Header header;
  header.step_id = step_id;
  header.code = static_cast<int32_t>(why.ok() ? absl::StatusCode::kUnknown : why.code());
  const size_t length = std::min(why.message().size(), sizeof(header.message));
  std::memcpy(header.message, why.message().data(), length);
  header.message_bytes = static_cast<int32_t>(length);
  return Run("send", [&]() -> absl::Status {
    LOOM_RETURN_IF_ERROR(SendHeader(header));
    send_header_->send(stage_ + 1, kHeaderSlot, 0, sizeof(Header));
    send_pending_ = true;
    return absl::OkStatus();
  });
}

absl::Status PipelineLink::ReceiveHeader(uint64_t step_id, Header& header) {
  if (!has_previous()) return absl::FailedPreconditionError("the first stage receives nothing");
  LOOM_RETURN_IF_ERROR(Run("receive", [&]() -> absl::Status {
    auto buffer = context_->createUnboundBuffer(receive_header_.data(), sizeof(Header));
    buffer->recv(stage_ - 1, kHeaderSlot, 0, sizeof(Header));
    WaitTimer timer(wait_seconds_);
    if (!buffer->waitRecv(timeout_)) return absl::AbortedError("pipeline receive: aborted");
    return absl::OkStatus();
  }));
  std::memcpy(&header, receive_header_.data(), sizeof(Header));
  if (header.step_id != step_id) {
    broken_ = absl::InternalError(absl::StrFormat(
        "pipeline stage %d received step %d's message while running step %d (the stages "
        "disagree on the plans)",
        stage_, header.step_id, step_id));
    return broken_;
  }
  return absl::OkStatus();
}

absl::Status PipelineLink::ReceiveFloats(float* out, int64_t count, uint64_t slot) {
  if (count == 0) return absl::OkStatus();
  return Run("receive", [&]() -> absl::Status {
    auto buffer = context_->createUnboundBuffer(out, static_cast<size_t>(count) * sizeof(float));
    buffer->recv(stage_ - 1, slot);
    if (!buffer->waitRecv(timeout_)) return absl::AbortedError("pipeline receive: aborted");
    return absl::OkStatus();
  });
}

absl::Status PipelineLink::Receive(uint64_t step_id, absl::Span<float> residual,
                                   absl::Span<float> proj) {
  Header header;
  LOOM_RETURN_IF_ERROR(ReceiveHeader(step_id, header));
  if (header.code != 0) {
    return absl::AbortedError(
        absl::StrFormat("pipeline stage %d failed step %d: %s", stage_ - 1, step_id,
                        std::string(header.message, static_cast<size_t>(header.message_bytes))));
  }
  if (header.residual_floats != static_cast<int64_t>(residual.size()) ||
      header.proj_floats != static_cast<int64_t>(proj.size())) {
    // Taken anyway, so the next step's message is next on the link.
    discard_.resize(static_cast<size_t>(std::max(header.residual_floats, header.proj_floats)));
    LOOM_RETURN_IF_ERROR(ReceiveFloats(discard_.data(), header.residual_floats, kResidualSlot));
    LOOM_RETURN_IF_ERROR(ReceiveFloats(discard_.data(), header.proj_floats, kProjSlot));
    return absl::InternalError(absl::StrFormat(
        "pipeline stage %d sent %d + %d activations for step %d, stage %d expected %d + %d",
        stage_ - 1, header.residual_floats, header.proj_floats, step_id, stage_, residual.size(),
        proj.size()));
  }
  LOOM_RETURN_IF_ERROR(ReceiveFloats(residual.data(), header.residual_floats, kResidualSlot));
  return ReceiveFloats(proj.data(), header.proj_floats, kProjSlot);
}

absl::Status PipelineLink::Discard(uint64_t step_id) {
  Header header;
  LOOM_RETURN_IF_ERROR(ReceiveHeader(step_id, header));
  if (header.code != 0) return absl::OkStatus();
  discard_.resize(static_cast<size_t>(std::max(header.residual_floats, header.proj_floats)));
  LOOM_RETURN_IF_ERROR(ReceiveFloats(discard_.data(), header.residual_floats, kResidualSlot));
  return ReceiveFloats(discard_.data(), header.proj_floats, kProjSlot);
}

absl::Status PipelineLink::CheckStage(const PipelineLink* link, int stage, int num_stages) {
  if (num_stages > 1 &&
      (link == nullptr || link->stage() != stage || link->num_stages() != num_stages)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "pipeline stage %d of %d needs a link of that stage and size", stage, num_stages));
  }
  return absl::OkStatus();
}

}  // namespace loom::worker
