// CudaKvCache's pool-to-pool copies (model::KvCache::Share, OpenPeer, CopyBlocksFromPeer): the
// pool's K/V (and scale) allocations exported through CUDA IPC, another process's opened on this
// pool's device, and blocks copied out of them by kernels/cuda/kv_block_copy's pool-to-pool
// kernel on the pool's stream. Without CUDA, each answers FailedPrecondition.
#include "model/cuda_device_internal.h"

#if LOOM_HAVE_CUDA
#include <cuda.h>
#include <cuda_runtime_api.h>

#include "model/cuda_status.h"
#endif

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "kernels/cuda/kv_block_copy.h"

namespace loom::model::cuda_detail {

#if !LOOM_HAVE_CUDA

CudaKvCache::~CudaKvCache() = default;

absl::StatusOr<KvPoolShare> CudaKvCache::Share() const {
  return absl::FailedPreconditionError("the CUDA device needs a build with CUDA");
}
absl::StatusOr<PeerKvPool> CudaKvCache::OpenPeer(const KvPoolShare&) const {
  return absl::FailedPreconditionError("the CUDA device needs a build with CUDA");
}
absl::Status CudaKvCache::CopyBlocksFromPeer(const PeerKvPool&, absl::Span<const int32_t>,
                                             absl::Span<const int32_t>, const PeerHeads&) const {
  return absl::FailedPreconditionError("the CUDA device needs a build with CUDA");
}
absl::Status CudaKvCache::LaunchPeerCopies(const std::vector<const uint8_t*>&,
                                           absl::Span<const int32_t>, absl::Span<const int32_t>,
                                           int64_t, const PeerHeads&) const {
  return absl::FailedPreconditionError("the CUDA device needs a build with CUDA");
}

#else  // LOOM_HAVE_CUDA

namespace {

namespace kc = kernels::cuda;

constexpr size_t kUuidBytes = sizeof(cudaUUID_t);

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi names a device (the raw bytes in
// hex where they are not 16).
std::string UuidText(const std::string& uuid) {
  std::string text = uuid.size() == kUuidBytes ? "GPU-" : "";
  for (size_t i = 0; i < uuid.size(); ++i) {
    if (uuid.size() == kUuidBytes && (i == 4 || i == 6 || i == 8 || i == 10)) text += '-';
    absl::StrAppendFormat(&text, "%02x", static_cast<uint8_t>(uuid[i]));
  }
  return text;
}

absl::StatusOr<std::string> DeviceUuid(int device) {
  cudaDeviceProp properties;
  LOOM_CUDA_CALL(cudaGetDeviceProperties(&properties, device));
  return std::string(properties.uuid.bytes, kUuidBytes);
}

// A CUDA IPC call's failure, with CUDA's reason: FailedPrecondition where this machine cannot
// share device memory so (no IPC, no peer access), else Unavailable (the exporting process may
// have freed the memory or exited). The thread's last error is cleared: the next launch check
// would report it as its own.
absl::Status IpcError(cudaError_t error, const std::string& what) {
  (void)cudaGetLastError();
  const std::string message = absl::StrCat(what, ": ", cudaGetErrorString(error));
  if (error == cudaErrorNotSupported || error == cudaErrorTooManyPeers ||
      error == cudaErrorPeerAccessUnsupported || error == cudaErrorInvalidDevice) {
    return absl::FailedPreconditionError(message);
  }
  return absl::UnavailableError(message);
}

// The source pool's device must be `device` itself or one it reaches as a peer.
absl::Status CheckReachable(int device, const std::string& uuid) {
  LOOM_ASSIGN_OR_RETURN(const std::string own, DeviceUuid(device));
  if (uuid == own) return absl::OkStatus();
  int count = 0;
  LOOM_CUDA_CALL(cudaGetDeviceCount(&count));
  for (int other = 0; other < count; ++other) {
    if (other == device) continue;
    LOOM_ASSIGN_OR_RETURN(const std::string other_uuid, DeviceUuid(other));
    if (other_uuid != uuid) continue;
    int can_access = 0;
    LOOM_CUDA_CALL(cudaDeviceCanAccessPeer(&can_access, device, other));
    if (can_access) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrFormat(
        "the source KV pool is on %s (cuda:%d), which this pool's %s (cuda:%d) cannot access "
        "as a peer",
        UuidText(uuid), other, UuidText(own), device));
  }
  return absl::FailedPreconditionError(absl::StrFormat(
      "the source KV pool is on %s, neither this pool's %s (cuda:%d) nor a device this "
      "process sees",
      UuidText(uuid), UuidText(own), device));
}

// The share's own consistency, before any handle is opened (it comes from another process).
absl::Status CheckShareShape(const KvPoolShare& share) {
  if (share.cuda_device_uuid.size() != kUuidBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("the KV pool share's device UUID is %d bytes, not %d",
                        share.cuda_device_uuid.size(), kUuidBytes));
  }
  for (size_t i = 0; i < share.cuda_ipc_handles.size(); ++i) {
    if (share.cuda_ipc_handles[i].size() != sizeof(cudaIpcMemHandle_t)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("CUDA IPC handle %d of the KV pool share is %d bytes, not %d", i,
                          share.cuda_ipc_handles[i].size(), sizeof(cudaIpcMemHandle_t)));
    }
  }
  if (share.num_blocks <= 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("the KV pool share has %d blocks", share.num_blocks));
  }
  for (size_t p = 0; p < share.parts.size(); ++p) {
    const KvPoolPart& part = share.parts[p];
    if (part.allocation < 0 ||
        static_cast<size_t>(part.allocation) >= share.cuda_ipc_handles.size() || part.offset < 0 ||
        part.block_bytes <= 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "part %d of the KV pool share (allocation %d of %d, offset %d, %d bytes a block) is "
          "malformed",
          p, part.allocation, share.cuda_ipc_handles.size(), part.offset, part.block_bytes));
    }
  }
  return absl::OkStatus();
}

// The bytes from `pointer` to the end of its allocation (the driver's cuMemGetAddressRange,
// reached through the runtime: Loom links no libcuda); -1 where the driver does not say.
int64_t BytesToAllocationEnd(const void* pointer) {
  using GetAddressRange = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
  static const GetAddressRange get_range = [] {
    void* function = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &function, 12000,
                                         cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      return GetAddressRange{nullptr};
    }
    return reinterpret_cast<GetAddressRange>(function);
  }();
  CUdeviceptr base = 0;
  size_t bytes = 0;
  const CUdeviceptr address = reinterpret_cast<CUdeviceptr>(pointer);
  if (get_range == nullptr || get_range(&base, &bytes, address) != CUDA_SUCCESS) return -1;
  return static_cast<int64_t>(base + bytes - address);
}

// Another process's allocations opened here; closed, on the device they were opened on, when
// the last PeerKvPool holding them goes.
struct OpenedAllocations {
  int device = 0;
  std::vector<void*> pointers;

  ~OpenedAllocations() {
    if (pointers.empty()) return;
    int current = device;
    (void)cudaGetDevice(&current);
    if (cudaSetDevice(device) == cudaSuccess) {
      for (void* pointer : pointers) (void)cudaIpcCloseMemHandle(pointer);
    }
    // The thread that drops the pool may run another device's work: its device is restored.
    (void)cudaSetDevice(current);
    (void)cudaGetLastError();  // nothing to report from a destructor
  }
};

}  // namespace

CudaKvCache::~CudaKvCache() {
  absl::MutexLock lock(&copy_mu_);
  if (peer_stream_ != nullptr && cudaSetDevice(device_index_) == cudaSuccess) {
    (void)cudaStreamDestroy(peer_stream_);
  }
  (void)cudaGetLastError();  // nothing to report from a destructor
}

absl::StatusOr<KvPoolShare> CudaKvCache::Share() const {
  absl::MutexLock lock(&share_mu_);
  if (share_.has_value()) return *share_;
  // The calling thread (a gRPC handler's) may have no device set.
  LOOM_CUDA_CALL(cudaSetDevice(device_index_));
  KvPoolShare share;
  share.kind = KvPoolShare::Kind::kCudaIpc;
  share.num_blocks = view_.num_blocks;
  LOOM_ASSIGN_OR_RETURN(share.cuda_device_uuid, DeviceUuid(device_index_));
  // Every part is a cudaMalloc of its own: one handle each, the part at its start.
  for (const Part& part : Parts()) {
    cudaIpcMemHandle_t handle;
    if (const cudaError_t error = cudaIpcGetMemHandle(&handle, part.base); error != cudaSuccess) {
      return IpcError(error, "cudaIpcGetMemHandle of a KV pool allocation");
    }
    share.parts.push_back(
        {static_cast<int32_t>(share.cuda_ipc_handles.size()), 0, part.block_bytes});
    share.cuda_ipc_handles.emplace_back(reinterpret_cast<const char*>(&handle), sizeof(handle));
  }
  share_ = share;
  return share;
}

absl::StatusOr<PeerKvPool> CudaKvCache::OpenPeer(const KvPoolShare& share) const {
  if (share.kind != KvPoolShare::Kind::kCudaIpc) {
    return absl::InvalidArgumentError(
        "a CUDA KV pool opens CUDA IPC shares only (this one is a host memory file)");
  }
  LOOM_RETURN_IF_ERROR(CheckShareShape(share));
  LOOM_CUDA_CALL(cudaSetDevice(device_index_));
  LOOM_RETURN_IF_ERROR(CheckReachable(device_index_, share.cuda_device_uuid));
  auto opened = std::make_shared<OpenedAllocations>();
  opened->device = device_index_;
  for (size_t i = 0; i < share.cuda_ipc_handles.size(); ++i) {
    cudaIpcMemHandle_t handle;
    std::memcpy(&handle, share.cuda_ipc_handles[i].data(), sizeof(handle));
    void* pointer = nullptr;
    if (const cudaError_t error =
            cudaIpcOpenMemHandle(&pointer, handle, cudaIpcMemLazyEnablePeerAccess);
        error != cudaSuccess) {
      // `opened` closes the handles already opened.
      return IpcError(error, absl::StrFormat("cudaIpcOpenMemHandle of KV pool allocation %d of "
                                             "%d on %s",
                                             i, share.cuda_ipc_handles.size(),
                                             UuidText(share.cuda_device_uuid)));
    }
    opened->pointers.push_back(pointer);
  }
  PeerKvPool peer;
  peer.num_blocks = share.num_blocks;
  for (size_t p = 0; p < share.parts.size(); ++p) {
    const KvPoolPart& part = share.parts[p];
    const uint8_t* base = static_cast<const uint8_t*>(opened->pointers[part.allocation]);
    // A part past its allocation would fault the copy kernel (and this process's context).
    const int64_t room = BytesToAllocationEnd(base);
    if (room >= 0 &&
        (part.offset > room || share.num_blocks > (room - part.offset) / part.block_bytes)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "part %d of the KV pool share (%d blocks of %d bytes at offset %d) passes the end of "
          "its allocation (%d bytes)",
          p, share.num_blocks, part.block_bytes, part.offset, room));
    }
    peer.bases.push_back(base + part.offset);
    peer.block_bytes.push_back(part.block_bytes);
  }
  peer.keep = std::move(opened);
  return peer;
}

absl::Status CudaKvCache::CopyBlocksFromPeer(const PeerKvPool& peer,
                                             absl::Span<const int32_t> src_blocks,
                                             absl::Span<const int32_t> dest_blocks,
                                             const PeerHeads& heads) const {
  const std::vector<Part> parts = Parts();
  std::vector<int64_t> part_bytes;
  for (const Part& part : parts) part_bytes.push_back(part.block_bytes);
  LOOM_RETURN_IF_ERROR(CheckPeerCopy(peer, part_bytes, view_.num_blocks, view_.block_size,
                                     src_blocks, dest_blocks, heads));
  if (src_blocks.empty() || parts.empty()) return absl::OkStatus();
  // The peer's part bases, then this pool's: uploaded on the stream, so alive until the wait.
  std::vector<const uint8_t*> bases = peer.bases;
  for (const Part& part : parts) bases.push_back(part.base);
  LOOM_CUDA_CALL(cudaSetDevice(device_index_));
  absl::MutexLock lock(&copy_mu_);
  const absl::Status status =
      LaunchPeerCopies(bases, src_blocks, dest_blocks, peer.num_blocks, heads);
  // The copies already queued finish here whatever the launches answered.
  const absl::Status drained =
      peer_stream_ != nullptr ? kc::SynchronizeStream(peer_stream_) : absl::OkStatus();
  return status.ok() ? drained : status;
}

absl::Status CudaKvCache::LaunchPeerCopies(const std::vector<const uint8_t*>& bases,
                                           absl::Span<const int32_t> src_blocks,
                                           absl::Span<const int32_t> dest_blocks,
                                           int64_t peer_blocks, const PeerHeads& heads) const {
  if (peer_stream_ == nullptr) {
    LOOM_CUDA_CALL(cudaStreamCreateWithFlags(&peer_stream_, cudaStreamNonBlocking));
  }
  const size_t table_bytes = bases.size() * sizeof(const uint8_t*);
  if (peer_table_.bytes() < table_bytes) {
    LOOM_ASSIGN_OR_RETURN(peer_table_, kc::DeviceBuffer::Allocate(table_bytes));
  }
  // The previous call's kernels, the table's only readers, were waited for under copy_mu_.
  LOOM_CUDA_CALL(cudaMemcpyAsync(peer_table_.data(), bases.data(), table_bytes,
                                 cudaMemcpyHostToDevice, peer_stream_));
  const size_t num_parts = bases.size() / 2;
  kc::KvPoolCopyParams p;
  p.src_parts = static_cast<const uint8_t* const*>(peer_table_.data());
  p.dest_parts = static_cast<uint8_t* const*>(peer_table_.data()) + num_parts;
  p.num_layers = static_cast<int>(k_.size());
  p.pools_per_layer = block_scale_bytes() > 0 ? 4 : 2;
  p.value_bytes = block_value_bytes();
  p.scale_bytes = block_scale_bytes();
  p.src_pool_blocks = peer_blocks;
  p.dest_pool_blocks = view_.num_blocks;
  if (!heads.whole()) {
    p.heads = {static_cast<int>(view_.block_size), static_cast<int>(heads.src_heads),
               static_cast<int>(heads.dest_heads), static_cast<int>(heads.src_first),
               static_cast<int>(heads.dest_first), static_cast<int>(heads.count)};
  }
  for (size_t first = 0; first < src_blocks.size(); first += kc::kKvBlockCopyMaxBlocks) {
    const size_t count =
        std::min(src_blocks.size() - first, static_cast<size_t>(kc::kKvBlockCopyMaxBlocks));
    p.num_blocks = static_cast<int>(count);
    std::copy_n(src_blocks.begin() + first, count, p.src_blocks);
    std::copy_n(dest_blocks.begin() + first, count, p.dest_blocks);
    LOOM_RETURN_IF_ERROR(kc::LaunchKvPoolCopy(p, peer_stream_));
  }
  return absl::OkStatus();
}

#endif  // LOOM_HAVE_CUDA

}  // namespace loom::model::cuda_detail
