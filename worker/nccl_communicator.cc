#include "worker/nccl_communicator.h"

#include <algorithm>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"

#ifdef LOOM_HAVE_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "worker/nccl_library.h"
#endif

namespace loom::worker {

#ifdef LOOM_HAVE_NCCL

namespace {

// How a host wait polls: spinning (yield) for the first kSpinFor, then sleeping kNap
// between polls, so a step of a few milliseconds is not delayed and a long wait for a
// stalled peer does not burn a core.
constexpr auto kSpinFor = std::chrono::milliseconds(2);
constexpr auto kNap = std::chrono::microseconds(20);

void Pause(std::chrono::steady_clock::time_point start) {
  if (std::chrono::steady_clock::now() - start < kSpinFor) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(kNap);
  }
}

}  // namespace

struct NcclCommunicator::Impl {
  const detail::NcclApi* nccl = nullptr;  // the loaded library's entry points
  ncclComm_t comm = nullptr;
  int rank = 0;
  int device = 0;
  std::chrono::milliseconds timeout{0};
  cudaStream_t stream = nullptr;  // owned: the host-span calls' staging and collectives
  float* scratch = nullptr;       // owned: their device copy of the data
  size_t scratch_floats = 0;
  absl::Status broken;

  ~Impl() {
    if (comm != nullptr) nccl->CommDestroy(comm);
    if (scratch != nullptr) cudaFree(scratch);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }

  absl::Status Break(absl::Status status) {
    if (comm != nullptr) nccl->CommAbort(comm);
    comm = nullptr;
    broken = status;
    return status;
  }

  // The communicator's state after a call that returned `result`: a non-blocking
  // communicator may answer ncclInProgress while it enqueues, which is polled (on the host
  // only: no stream is waited for, so this is capture-safe) until it settles.
  absl::Status Enqueued(ncclResult_t result, const char* what) {
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + timeout;
    while (result == ncclInProgress) {
      if (std::chrono::steady_clock::now() > deadline) {
        return Break(absl::DeadlineExceededError(absl::StrFormat(
            "nccl %s was not enqueued within %d ms", what,
            static_cast<long long>(timeout.count()))));
      }
      Pause(start);
      nccl->CommGetAsyncError(comm, &result);
    }
    if (result == ncclSuccess) return absl::OkStatus();
    return Break(absl::UnavailableError(
        absl::StrFormat("nccl %s: %s", what, nccl->GetErrorString(result))));
  }

  // Waits for the work enqueued on `on` so far, polling NCCL's asynchronous error, up to
  // the timeout; aborts the communicator on an error or a timeout (which stops its
  // kernels, so the stream drains).
  absl::Status Wait(cudaStream_t on, const char* what) {
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + timeout;
    while (true) {
      const cudaError_t done = cudaStreamQuery(on);
      if (done == cudaSuccess) return absl::OkStatus();
      // "Not ready" is also left as the thread's last error, which the next kernel launch's
      // check (cudaGetLastError) would report as its own failure.
      if (done == cudaErrorNotReady) (void)cudaGetLastError();
      ncclResult_t async = ncclSuccess;
      nccl->CommGetAsyncError(comm, &async);
      if (done != cudaErrorNotReady || (async != ncclSuccess && async != ncclInProgress)) {
        if (done != cudaErrorNotReady) cudaGetLastError();
        return Break(absl::UnavailableError(absl::StrFormat(
            "nccl rank %d: %s failed: %s / %s", rank, what,
            done == cudaErrorNotReady ? "stream still running" : cudaGetErrorString(done),
            nccl->GetErrorString(async))));
      }
      if (std::chrono::steady_clock::now() > deadline) {
        return Break(absl::DeadlineExceededError(absl::StrFormat(
            "nccl rank %d: %s did not finish within %d ms (a peer died or stalls)", rank, what,
            static_cast<long long>(timeout.count()))));
      }
      Pause(start);
    }
  }

  absl::Status Cuda(cudaError_t error, const char* what) {
    if (error == cudaSuccess) return absl::OkStatus();
    cudaGetLastError();
    return Break(absl::InternalError(
        absl::StrFormat("nccl rank %d: %s: %s", rank, what, cudaGetErrorString(error))));
  }

  // The checks every call starts with; selects the communicator's device.
  absl::Status Usable() {
    if (!broken.ok()) return broken;
    return Cuda(cudaSetDevice(device), "cudaSetDevice");
  }

  // scratch holds at least `floats` (the own stream is idle between calls).
  absl::Status EnsureScratch(size_t floats) {
    if (scratch_floats >= floats) return absl::OkStatus();
    if (scratch != nullptr) cudaFree(scratch);
    scratch = nullptr;
    scratch_floats = 0;
    const size_t size = std::max<size_t>(floats, 256);
    if (absl::Status s = Cuda(cudaMalloc(reinterpret_cast<void**>(&scratch), size * sizeof(float)),
                              "cudaMalloc of the staging buffer");
        !s.ok()) {
      return s;
    }
    scratch_floats = size;
    return absl::OkStatus();
  }

  // host[0, n) -> scratch at `offset` floats, on the own stream.
  absl::Status Stage(const float* host, size_t n, size_t offset) {
    return Cuda(cudaMemcpyAsync(scratch + offset, host, n * sizeof(float),
                                cudaMemcpyHostToDevice, stream),
                "copy to the device");
  }
  // scratch at `offset` -> host[0, n), once the collective before it has finished (waited
  // for under the timeout first: a pageable copy back would otherwise block without one).
  absl::Status Unstage(float* host, size_t n, size_t offset, const char* what) {
    if (absl::Status s = Wait(stream, what); !s.ok()) return s;
    if (absl::Status s = Cuda(cudaMemcpyAsync(host, scratch + offset, n * sizeof(float),
                                              cudaMemcpyDeviceToHost, stream),
                              "copy to the host");
        !s.ok()) {
      return s;
    }
    return Cuda(cudaStreamSynchronize(stream), "copy to the host");
  }
};

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Connect(
    std::shared_ptr<gloo::rendezvous::Store> store, int rank, int world_size, int device,
    std::chrono::milliseconds timeout) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrFormat("rank %d is outside a world of %d ranks", rank, world_size));
  }
  absl::StatusOr<const detail::NcclApi*> loaded = detail::LoadNccl();
  if (!loaded.ok()) return loaded.status();
  const detail::NcclApi& nccl = **loaded;
  if (const cudaError_t error = cudaSetDevice(device); error != cudaSuccess) {
    cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrFormat(
        "nccl rank %d: no CUDA device %d: %s", rank, device, cudaGetErrorString(error)));
  }
  ncclUniqueId id;
  try {
    if (rank == 0) {
      if (const ncclResult_t made = nccl.GetUniqueId(&id); made != ncclSuccess) {
        return absl::UnavailableError(
            absl::StrFormat("ncclGetUniqueId: %s", nccl.GetErrorString(made)));
      }
      store->set("nccl_unique_id",
                 std::vector<char>(id.internal, id.internal + sizeof(id.internal)));
    } else {
      const std::vector<char> bytes = store->get("nccl_unique_id");
      if (bytes.size() != sizeof(id.internal)) {
        return absl::DataLossError("the NCCL unique id from the store has the wrong size");
      }
      std::copy(bytes.begin(), bytes.end(), id.internal);
    }
  } catch (const std::exception& error) {
    return absl::DeadlineExceededError(absl::StrFormat("nccl rendezvous: %s", error.what()));
  }
  auto impl = std::make_unique<Impl>();
  impl->nccl = &nccl;
  impl->rank = rank;
  impl->device = device;
  impl->timeout = timeout;
  if (const cudaError_t error = cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking);
      error != cudaSuccess) {
    impl->stream = nullptr;
    cudaGetLastError();
    return absl::InternalError(
        absl::StrFormat("nccl rank %d: cudaStreamCreate: %s", rank, cudaGetErrorString(error)));
  }
  // Non-blocking init so a missing peer becomes a timeout, not a hang.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const ncclResult_t init = nccl.CommInitRankConfig(&impl->comm, world_size, id, rank, &config);
  if (init != ncclSuccess && init != ncclInProgress) {
    if (impl->comm != nullptr) nccl.CommAbort(impl->comm);
    impl->comm = nullptr;
    return absl::UnavailableError(absl::StrFormat("nccl init of rank %d of %d: %s", rank,
                                                  world_size, nccl.GetErrorString(init)));
  }
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + timeout;
  while (true) {
    ncclResult_t state = ncclInProgress;
    nccl.CommGetAsyncError(impl->comm, &state);
    if (state == ncclSuccess) break;
    const bool late = std::chrono::steady_clock::now() > deadline;
    if (state != ncclInProgress || late) {
      nccl.CommAbort(impl->comm);
      impl->comm = nullptr;
      const std::string message = absl::StrFormat(
          "nccl init of rank %d of %d on device %d %s: %s", rank, world_size, device,
          late ? absl::StrFormat("did not complete within %d ms (a peer is missing)",
                                 static_cast<long long>(timeout.count()))
               : std::string("failed"),
          nccl.GetErrorString(state));
      return late ? absl::DeadlineExceededError(message) : absl::UnavailableError(message);
    }
    Pause(start);
  }
  return std::unique_ptr<NcclCommunicator>(
      new NcclCommunicator(std::move(impl), rank, world_size));
}

NcclCommunicator::NcclCommunicator(std::unique_ptr<Impl> impl, int rank, int world_size)
    : impl_(std::move(impl)), rank_(rank), world_size_(world_size) {}

NcclCommunicator::~NcclCommunicator() = default;

int NcclCommunicator::device() const { return impl_->device; }

absl::Status NcclCommunicator::AllReduceSum(absl::Span<float> data) {
  if (absl::Status s = impl_->Usable(); !s.ok()) return s;
  if (data.empty()) return absl::OkStatus();
  if (absl::Status s = impl_->EnsureScratch(data.size()); !s.ok()) return s;
  if (absl::Status s = impl_->Stage(data.data(), data.size(), 0); !s.ok()) return s;
  if (absl::Status s = impl_->Enqueued(
          impl_->nccl->AllReduce(impl_->scratch, impl_->scratch, data.size(), ncclFloat32,
                                 ncclSum, impl_->comm, impl_->stream),
          "all-reduce");
      !s.ok()) {
    return s;
  }
  return impl_->Unstage(data.data(), data.size(), 0, "all-reduce");
}

absl::Status NcclCommunicator::AllGather(absl::Span<const float> in, absl::Span<float> out) {
  if (!impl_->broken.ok()) return impl_->broken;
  if (out.size() != in.size() * static_cast<size_t>(world_size_)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "all-gather of %d floats per rank needs %d outputs, got %d", in.size(),
        in.size() * world_size_, out.size()));
  }
  if (absl::Status s = impl_->Usable(); !s.ok()) return s;
  if (in.empty()) return absl::OkStatus();
  // scratch: [in | out].
  if (absl::Status s = impl_->EnsureScratch(in.size() + out.size()); !s.ok()) return s;
  if (absl::Status s = impl_->Stage(in.data(), in.size(), 0); !s.ok()) return s;
  if (absl::Status s = impl_->Enqueued(
          impl_->nccl->AllGather(impl_->scratch, impl_->scratch + in.size(), in.size(),
                                 ncclFloat32, impl_->comm, impl_->stream),
          "all-gather");
      !s.ok()) {
    return s;
  }
  return impl_->Unstage(out.data(), out.size(), in.size(), "all-gather");
}

absl::Status NcclCommunicator::Broadcast(absl::Span<float> data, int root) {
  if (!impl_->broken.ok()) return impl_->broken;
  if (root < 0 || root >= world_size_) {
    return absl::InvalidArgumentError(
        absl::StrFormat("broadcast root %d of %d ranks", root, world_size_));
  }
  if (absl::Status s = impl_->Usable(); !s.ok()) return s;
  if (data.empty()) return absl::OkStatus();
  if (absl::Status s = impl_->EnsureScratch(data.size()); !s.ok()) return s;
  if (absl::Status s = impl_->Stage(data.data(), data.size(), 0); !s.ok()) return s;
  if (absl::Status s = impl_->Enqueued(
          impl_->nccl->Broadcast(impl_->scratch, impl_->scratch, data.size(), ncclFloat32, root,
                                 impl_->comm, impl_->stream),
          "broadcast");
      !s.ok()) {
    return s;
  }
  return impl_->Unstage(data.data(), data.size(), 0, "broadcast");
}

absl::Status NcclCommunicator::Barrier() {
  // NCCL has no barrier: a one-element all-reduce is one.
  float one = 1.0f;
  return AllReduceSum(absl::MakeSpan(&one, 1));
}

absl::Status NcclCommunicator::AllReduceSumOnDevice(float* data, int64_t n, void* stream) {
  if (!impl_->broken.ok()) return impl_->broken;
  if (n < 0) return absl::InvalidArgumentError(absl::StrFormat("all-reduce of %d floats", n));
  if (n == 0) return absl::OkStatus();
  // No cudaSetDevice here: the caller's stream belongs to the caller's current device
  // (the CUDA device selects it for every step), and nothing below waits.
  return impl_->Enqueued(
      impl_->nccl->AllReduce(data, data, static_cast<size_t>(n), ncclFloat32, ncclSum,
                             impl_->comm, static_cast<cudaStream_t>(stream)),
      "all-reduce");
}

absl::Status NcclCommunicator::AllGatherOnDevice(const float* in, int64_t n, float* out,
                                                 void* stream) {
  if (!impl_->broken.ok()) return impl_->broken;
  if (n < 0) return absl::InvalidArgumentError(absl::StrFormat("all-gather of %d floats", n));
  if (n == 0) return absl::OkStatus();
  return impl_->Enqueued(impl_->nccl->AllGather(in, out, static_cast<size_t>(n), ncclFloat32,
                                                impl_->comm, static_cast<cudaStream_t>(stream)),
                         "all-gather");
}

absl::Status NcclCommunicator::WaitOnDevice(void* stream) {
  if (!impl_->broken.ok()) return impl_->broken;
  // A stream being captured cannot be waited for; that is the caller's error, not a
  // failed collective, so the communicator stays usable.
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &capturing) == cudaSuccess &&
      capturing != cudaStreamCaptureStatusNone) {
    return absl::FailedPreconditionError("cannot wait for a stream while it is captured");
  }
  return impl_->Wait(static_cast<cudaStream_t>(stream), "step");
}

#else  // !LOOM_HAVE_NCCL

struct NcclCommunicator::Impl {};

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Connect(
    std::shared_ptr<gloo::rendezvous::Store>, int rank, int world_size, int,
    std::chrono::milliseconds) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrFormat("rank %d is outside a world of %d ranks", rank, world_size));
  }
  return absl::FailedPreconditionError(
      "NCCL not found: this build has no NCCL (the CUDA toolkit's nccl.h was not found when "
      "Loom was configured)");
}
NcclCommunicator::NcclCommunicator(std::unique_ptr<Impl> impl, int rank, int world_size)
    : impl_(std::move(impl)), rank_(rank), world_size_(world_size) {}
NcclCommunicator::~NcclCommunicator() = default;
int NcclCommunicator::device() const { return 0; }
absl::Status NcclCommunicator::AllReduceSum(absl::Span<float>) {
  return absl::FailedPreconditionError("no NCCL");
}
absl::Status NcclCommunicator::AllGather(absl::Span<const float>, absl::Span<float>) {
  return absl::FailedPreconditionError("no NCCL");
}
absl::Status NcclCommunicator::Broadcast(absl::Span<float>, int) {
  return absl::FailedPreconditionError("no NCCL");
}
absl::Status NcclCommunicator::Barrier() { return absl::FailedPreconditionError("no NCCL"); }
absl::Status NcclCommunicator::AllReduceSumOnDevice(float*, int64_t, void*) {
  return absl::FailedPreconditionError("no NCCL");
}
absl::Status NcclCommunicator::AllGatherOnDevice(const float*, int64_t, float*, void*) {
  return absl::FailedPreconditionError("no NCCL");
}
absl::Status NcclCommunicator::WaitOnDevice(void*) {
  return absl::FailedPreconditionError("no NCCL");
}

#endif  // LOOM_HAVE_NCCL

}  // namespace loom::worker
