#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda_device.h"

namespace loom::kernels::cuda {

/// One cudaMalloc'ed allocation on the current device, freed on destruction. Move-only;
/// not thread-safe. Every call answers a Status (FailedPrecondition without CUDA).
class DeviceBuffer {
 public:
  /// Allocates `bytes` (> 0) of device memory; ResourceExhausted when it does not fit.
  static absl::StatusOr<DeviceBuffer> Allocate(size_t bytes);

  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

  /// Synchronous copy of `bytes` from host memory to byte `offset` (default: the start);
  /// InvalidArgument when offset + bytes passes this buffer's size.
  absl::Status CopyFromHost(const void* src, size_t bytes, size_t offset = 0);
  /// Synchronous copy of the first `bytes` to host memory.
  absl::Status CopyToHost(void* dst, size_t bytes) const;
  /// Sets every byte (synchronous). 0xff poisons F32, F16 and BF16 alike with NaN.
  absl::Status Fill(uint8_t byte);

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

/// Waits for all work on `stream`; a kernel's asynchronous error surfaces here as Internal.
absl::Status SynchronizeStream(cudaStream_t stream);

/// Number of streaming multiprocessors of the current device (for launch heuristics).
absl::StatusOr<int> CurrentDeviceSmCount();

}  // namespace loom::kernels::cuda
