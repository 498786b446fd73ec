#include "kernels/cuda/device_memory.h"

#include <utility>

#include "absl/strings/str_format.h"

#if LOOM_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace loom::kernels::cuda {

#if LOOM_HAVE_CUDA
namespace {

absl::Status FromCuda(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();  // the error was reported here; do not leave it for the next check
  return absl::InternalError(absl::StrFormat("%s: %s", what, cudaGetErrorString(error)));
}

}  // namespace

absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(size_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("DeviceBuffer: 0 bytes requested");
  DeviceBuffer buffer;
  const cudaError_t error = cudaMalloc(&buffer.data_, bytes);
  if (error != cudaSuccess) {
    cudaGetLastError();
    const std::string message =
        absl::StrFormat("cudaMalloc of %d bytes: %s", bytes, cudaGetErrorString(error));
    if (error == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(message);
    return absl::InternalError(message);
  }
  buffer.bytes_ = bytes;
  return buffer;
}

DeviceBuffer::~DeviceBuffer() {
  if (data_ != nullptr) cudaFree(data_);
}

absl::Status DeviceBuffer::CopyFromHost(const void* src, size_t bytes, size_t offset) {
  if (offset > bytes_ || bytes > bytes_ - offset) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "DeviceBuffer: copy of %d bytes at offset %d into %d", bytes, offset, bytes_));
  }
  absl::Status status =
      FromCuda(cudaMemcpy(static_cast<char*>(data_) + offset, src, bytes, cudaMemcpyHostToDevice),
               "cudaMemcpy to device");
  // From pageable memory the copy may still be in flight on the legacy stream when
  // cudaMemcpy returns, unordered with a non-blocking stream's next kernel: wait for it.
  if (status.ok()) status = FromCuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  return status;
}

absl::Status DeviceBuffer::CopyToHost(void* dst, size_t bytes) const {
  if (bytes > bytes_) {
    return absl::InvalidArgumentError(
        absl::StrFormat("DeviceBuffer: copy of %d bytes out of %d", bytes, bytes_));
  }
  return FromCuda(cudaMemcpy(dst, data_, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to host");
}

absl::Status DeviceBuffer::Fill(uint8_t byte) {
  if (bytes_ == 0) return absl::OkStatus();
  absl::Status status = FromCuda(cudaMemset(data_, byte, bytes_), "cudaMemset");
  // cudaMemset is asynchronous to the host for device memory (and unordered with a
  // non-blocking stream): the fill is done when this returns.
  if (status.ok()) status = FromCuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  return status;
}

absl::Status SynchronizeStream(cudaStream_t stream) {
  return FromCuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

absl::StatusOr<int> CurrentDeviceSmCount() {
  int device = 0;
  absl::Status status = FromCuda(cudaGetDevice(&device), "cudaGetDevice");
  if (!status.ok()) return status;
  int count = 0;
  status = FromCuda(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device),
                    "cudaDeviceGetAttribute(MultiProcessorCount)");
  if (!status.ok()) return status;
  return count;
}

#else  // !LOOM_HAVE_CUDA

namespace {
absl::Status NoCuda() { return absl::FailedPreconditionError("Loom was built without CUDA"); }
}  // namespace

absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(size_t) { return NoCuda(); }
DeviceBuffer::~DeviceBuffer() = default;
absl::Status DeviceBuffer::CopyFromHost(const void*, size_t, size_t) { return NoCuda(); }
absl::Status DeviceBuffer::CopyToHost(void*, size_t) const { return NoCuda(); }
absl::Status DeviceBuffer::Fill(uint8_t) { return NoCuda(); }
absl::Status SynchronizeStream(cudaStream_t) { return NoCuda(); }
absl::StatusOr<int> CurrentDeviceSmCount() { return NoCuda(); }

#endif

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    DeviceBuffer old(std::move(*this));
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

}  // namespace loom::kernels::cuda
