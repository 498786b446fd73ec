#include "worker/gloo_communicator.h"

#include <exception>
#include <utility>

#include "absl/strings/str_format.h"
#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/common/error.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/transport/tcp/device.h"
#include "worker/gloo_status.h"

namespace loom::worker {
namespace {

absl::Status FromGlooException(const char* what, const std::exception& error) {
  return GlooStatus("gloo", what, error);
}

}  // namespace

absl::StatusOr<std::unique_ptr<GlooCommunicator>> GlooCommunicator::Connect(
    std::shared_ptr<gloo::rendezvous::Store> store, int rank, int world_size,
    const GlooOptions& options) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrFormat("rank %d is outside a world of %d ranks", rank, world_size));
  }
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.hostname;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, world_size);
    context->setTimeout(options.timeout);
    context->connectFullMesh(*store, device);
    if (world_size > 1) {
      // Every rank's pairs connected before any rank goes on: one that fails right after
      // (its shard cannot be loaded) would otherwise close a pair another rank is still
      // connecting, which then reports a broken rendezvous instead of its own error.
      gloo::BarrierOptions meet(context);
      meet.setTimeout(options.timeout);
      gloo::barrier(meet);
    }
    return std::unique_ptr<GlooCommunicator>(
        new GlooCommunicator(std::move(context), rank, world_size, options.timeout));
  } catch (const std::exception& error) {
    return FromGlooException("rendezvous", error);
  }
}

GlooCommunicator::GlooCommunicator(std::shared_ptr<gloo::Context> context, int rank,
                                   int world_size, std::chrono::milliseconds timeout)
    : context_(std::move(context)), rank_(rank), world_size_(world_size), timeout_(timeout) {}

GlooCommunicator::~GlooCommunicator() = default;

template <typename F>
absl::Status GlooCommunicator::Run(const char* what, F&& collective) {
  if (!broken_.ok()) return broken_;
  try {
    collective();
    return absl::OkStatus();
  } catch (const std::exception& error) {
    // A failed collective leaves the pairs in an unknown state: nothing after it can be
    // trusted to line up across ranks.
    broken_ = FromGlooException(what, error);
    return broken_;
  }
}

absl::Status GlooCommunicator::AllReduceSum(absl::Span<float> data) {
  if (world_size_ == 1 || data.empty()) return broken_;
  return Run("all-reduce", [&] {
    gloo::AllreduceOptions options(context_);
    options.setOutput(data.data(), data.size());
    options.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
    options.setTimeout(timeout_);
    gloo::allreduce(options);
  });
}

absl::Status GlooCommunicator::AllGather(absl::Span<const float> in, absl::Span<float> out) {
  if (out.size() != in.size() * static_cast<size_t>(world_size_)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "all-gather of %d floats per rank needs %d outputs, got %d", in.size(),
        in.size() * world_size_, out.size()));
  }
  if (world_size_ == 1) {
    std::copy(in.begin(), in.end(), out.begin());
    return broken_;
  }
  return Run("all-gather", [&] {
    gloo::AllgatherOptions options(context_);
    options.setInput(const_cast<float*>(in.data()), in.size());
    options.setOutput(out.data(), out.size());
    options.setTimeout(timeout_);
    gloo::allgather(options);
  });
}

absl::Status GlooCommunicator::Broadcast(absl::Span<float> data, int root) {
  if (root < 0 || root >= world_size_) {
    return absl::InvalidArgumentError(absl::StrFormat("broadcast root %d of %d ranks", root,
                                                      world_size_));
  }
  if (world_size_ == 1 || data.empty()) return broken_;
  return Run("broadcast", [&] {
    gloo::BroadcastOptions options(context_);
    options.setOutput(data.data(), data.size());
    options.setRoot(root);
    options.setTimeout(timeout_);
    gloo::broadcast(options);
  });
}

absl::Status GlooCommunicator::Barrier() {
  if (world_size_ == 1) return broken_;
  return Run("barrier", [&] {
    gloo::BarrierOptions options(context_);
    options.setTimeout(timeout_);
    gloo::barrier(options);
  });
}

}  // namespace loom::worker
