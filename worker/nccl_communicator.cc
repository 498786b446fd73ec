#include "worker/nccl_communicator.h"

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

struct NcclCommunicator::Impl {
  const detail::NcclApi* nccl = nullptr;  // the loaded library's entry points
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  int device = 0;
  std::chrono::milliseconds timeout{0};
  float* scratch = nullptr;  // one float for Barrier
  absl::Status broken;

  // Waits for the work enqueued on `stream`, polling NCCL's asynchronous error, up to the
  // timeout; aborts the communicator on an error or a timeout.
  absl::Status Wait(const char* what) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
      const cudaError_t done = cudaStreamQuery(stream);
      if (done == cudaSuccess) return absl::OkStatus();
      ncclResult_t async = ncclSuccess;
      nccl->CommGetAsyncError(comm, &async);
      if (done != cudaErrorNotReady || (async != ncclSuccess && async != ncclInProgress)) {
        return Break(absl::UnavailableError(absl::StrFormat(
            "nccl %s failed: %s / %s", what, cudaGetErrorString(done),
            nccl->GetErrorString(async))));
      }
      if (std::chrono::steady_clock::now() > deadline) {
        return Break(absl::DeadlineExceededError(
            absl::StrFormat("nccl %s did not finish within %d ms (a peer died or stalls)", what,
                            static_cast<long long>(timeout.count()))));
      }
      std::this_thread::yield();
    }
  }
  absl::Status Break(absl::Status status) {
    if (comm != nullptr) nccl->CommAbort(comm);
    comm = nullptr;
    broken = status;
    return status;
  }
  absl::Status Check(ncclResult_t result, const char* what) {
    if (result == ncclSuccess) return absl::OkStatus();
    return Break(absl::UnavailableError(
        absl::StrFormat("nccl %s: %s", what, nccl->GetErrorString(result))));
  }
};

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Connect(
    std::shared_ptr<gloo::rendezvous::Store> store, int rank, int world_size, int device,
    void* stream, std::chrono::milliseconds timeout) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrFormat("rank %d is outside a world of %d ranks", rank, world_size));
  }
  absl::StatusOr<const detail::NcclApi*> loaded = detail::LoadNccl();
  if (!loaded.ok()) return loaded.status();
  const detail::NcclApi& nccl = **loaded;
  if (cudaSetDevice(device) != cudaSuccess) {
    return absl::FailedPreconditionError(absl::StrFormat("no CUDA device %d", device));
  }
  ncclUniqueId id;
  try {
    if (rank == 0) {
      if (nccl.GetUniqueId(&id) != ncclSuccess) return absl::UnavailableError("ncclGetUniqueId failed");
      store->set("nccl_unique_id", std::vector<char>(id.internal, id.internal + sizeof(id.internal)));
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
  impl->stream = static_cast<cudaStream_t>(stream);
  impl->device = device;
  impl->timeout = timeout;
  // Non-blocking init so a missing peer becomes a timeout, not a hang.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclResult_t init = nccl.CommInitRankConfig(&impl->comm, world_size, id, rank, &config);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (init == ncclSuccess || init == ncclInProgress) {
    ncclResult_t state = ncclInProgress;
    nccl.CommGetAsyncError(impl->comm, &state);
    if (state == ncclSuccess) break;
    if (state != ncclInProgress || std::chrono::steady_clock::now() > deadline) {
      nccl.CommAbort(impl->comm);
      return absl::DeadlineExceededError(absl::StrFormat(
          "nccl init of rank %d of %d did not complete: %s", rank, world_size,
          nccl.GetErrorString(state)));
    }
    std::this_thread::yield();
  }
  if (init != ncclSuccess && init != ncclInProgress) {
    return absl::UnavailableError(absl::StrFormat("nccl init: %s", nccl.GetErrorString(init)));
  }
  if (cudaMalloc(reinterpret_cast<void**>(&impl->scratch), sizeof(float)) != cudaSuccess) {
    nccl.CommAbort(impl->comm);
    return absl::ResourceExhaustedError("cannot allocate the barrier scratch");
  }
  return std::unique_ptr<NcclCommunicator>(
      new NcclCommunicator(std::move(impl), rank, world_size));
}

NcclCommunicator::NcclCommunicator(std::unique_ptr<Impl> impl, int rank, int world_size)
    : impl_(std::move(impl)), rank_(rank), world_size_(world_size) {}

NcclCommunicator::~NcclCommunicator() {
  if (impl_->comm != nullptr) impl_->nccl->CommDestroy(impl_->comm);
  if (impl_->scratch != nullptr) cudaFree(impl_->scratch);
}

absl::Status NcclCommunicator::AllReduceSum(absl::Span<float> data) {
  if (!impl_->broken.ok()) return impl_->broken;
  if (data.empty()) return absl::OkStatus();
  if (absl::Status s = impl_->Check(impl_->nccl->AllReduce(data.data(), data.data(), data.size(),
                                                  ncclFloat32, ncclSum, impl_->comm,
                                                  impl_->stream),
                                    "all-reduce");
      !s.ok()) {
    return s;
  }
  return impl_->Wait("all-reduce");
}

absl::Status NcclCommunicator::AllGather(absl::Span<const float> in, absl::Span<float> out) {
  if (!impl_->broken.ok()) return impl_->broken;
  if (out.size() != in.size() * static_cast<size_t>(world_size_)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "all-gather of %d floats per rank needs %d outputs, got %d", in.size(),
        in.size() * world_size_, out.size()));
  }
  if (absl::Status s = impl_->Check(impl_->nccl->AllGather(in.data(), out.data(), in.size(), ncclFloat32,
                                                  impl_->comm, impl_->stream),
                                    "all-gather");
      !s.ok()) {
    return s;
  }
  return impl_->Wait("all-gather");
}

absl::Status NcclCommunicator::Broadcast(absl::Span<float> data, int root) {
  if (!impl_->broken.ok()) return impl_->broken;
  if (root < 0 || root >= world_size_) {
    return absl::InvalidArgumentError(
        absl::StrFormat("broadcast root %d of %d ranks", root, world_size_));
  }
  if (data.empty()) return absl::OkStatus();
  if (absl::Status s = impl_->Check(impl_->nccl->Broadcast(data.data(), data.data(), data.size(),
                                                  ncclFloat32, root, impl_->comm, impl_->stream),
                                    "broadcast");
      !s.ok()) {
    return s;
  }
  return impl_->Wait("broadcast");
}

absl::Status NcclCommunicator::Barrier() {
  // NCCL has no barrier: a one-element all-reduce is one.
  return AllReduceSum(absl::MakeSpan(impl_->scratch, 1));
}

#else  // !LOOM_HAVE_NCCL

struct NcclCommunicator::Impl {};

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Connect(
    std::shared_ptr<gloo::rendezvous::Store>, int, int, int, void*, std::chrono::milliseconds) {
  return absl::UnimplementedError("this build has no NCCL (CUDA toolkit with NCCL not found)");
}
NcclCommunicator::NcclCommunicator(std::unique_ptr<Impl> impl, int rank, int world_size)
    : impl_(std::move(impl)), rank_(rank), world_size_(world_size) {}
NcclCommunicator::~NcclCommunicator() = default;
absl::Status NcclCommunicator::AllReduceSum(absl::Span<float>) {
  return absl::UnimplementedError("no NCCL");
}
absl::Status NcclCommunicator::AllGather(absl::Span<const float>, absl::Span<float>) {
  return absl::UnimplementedError("no NCCL");
}
absl::Status NcclCommunicator::Broadcast(absl::Span<float>, int) {
  return absl::UnimplementedError("no NCCL");
}
absl::Status NcclCommunicator::Barrier() { return absl::UnimplementedError("no NCCL"); }

#endif  // LOOM_HAVE_NCCL

}  // namespace loom::worker
