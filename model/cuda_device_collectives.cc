#include "model/cuda_device.h"

// The CUDA device's tensor-parallel collectives: on the stream (NCCL) or staged through host
// memory (gloo).
// Without CUDA, model/cuda_device.cc stubs them.
#if LOOM_HAVE_CUDA
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "model/cuda_status.h"

namespace loom::model {

namespace {

namespace kc = kernels::cuda;

}  // namespace

absl::Status CudaDevice::AllReduceSum(Tensor x) {
  ForgetConverted();
  Communicator* comm = options_.communicator;
  if (comm == nullptr || x.numel() == 0) return absl::OkStatus();
  if (x.dtype != DType::kF32) {
    return absl::InvalidArgumentError("AllReduceSum takes F32 activations");
  }
  if (comm->has_device_collectives()) {
    // In stream order, no host wait (capture-safe); even a world of one goes through the
    // communicator, so that path is the one a single GPU tests. Errors show at Synchronize.
    return comm->AllReduceSumOnDevice(static_cast<float*>(x.data), x.numel(), stream_);
  }
  if (comm->world_size() == 1) return absl::OkStatus();
  host_.resize(x.numel());
  LOOM_RETURN_IF_ERROR(DownloadF32(x, host_.data()));
  LOOM_RETURN_IF_ERROR(comm->AllReduceSum(absl::MakeSpan(host_)));
  LOOM_CUDA_CALL(cudaMemcpyAsync(x.data, host_.data(), host_.size() * sizeof(float),
                                 cudaMemcpyHostToDevice, stream_));
  return Synchronize();
}

absl::Status CudaDevice::AllGatherColumns(const Tensor& local, Tensor out) {
  ForgetConverted();
  const int64_t rows = out.rows(), vocab = out.cols(), n = local.cols();
  const int world = world_size();
  Communicator* comm = options_.communicator;
  const bool on_device = comm != nullptr && comm->has_device_collectives();
  if (world == 1 && !on_device) {
    if (out.numel() == 0) return absl::OkStatus();
    LOOM_CUDA_CALL(cudaMemcpyAsync(out.data, local.data, out.numel() * sizeof(float),
                                   cudaMemcpyDeviceToDevice, stream_));
    return absl::OkStatus();
  }
  // As CpuDevice: each rank's slice padded to the common stride, gathered (rank-major),
  // reordered into vocabulary order.
  const int64_t stride = (vocab + world - 1) / world;
  if (n > stride) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "AllGatherColumns: a slice of %d columns does not fit [%d, %d] over %d ranks", n, rows,
        vocab, world));
  }
  if (on_device) {
    if (rows == 0 || vocab == 0) return absl::OkStatus();
    // Every step below is an async copy or collective on stream_ (capture-safe once the
    // buffers have their size: Ensure only reallocates, and waits, when one grows).
    const size_t floats = static_cast<size_t>(rows * stride);
    LOOM_RETURN_IF_ERROR(Ensure(gather_local_, floats * sizeof(float)));
    LOOM_RETURN_IF_ERROR(Ensure(gather_all_, floats * world * sizeof(float)));
    float* padded = static_cast<float*>(gather_local_.data());
    float* gathered = static_cast<float*>(gather_all_.data());
    if (n > 0) {
      LOOM_CUDA_CALL(cudaMemcpy2DAsync(padded, stride * sizeof(float), local.data,
                                       n * sizeof(float), n * sizeof(float), rows,
                                       cudaMemcpyDeviceToDevice, stream_));
    }
    LOOM_RETURN_IF_ERROR(
        comm->AllGatherOnDevice(padded, static_cast<int64_t>(floats), gathered, stream_));
    for (int r = 0; r < world; ++r) {
      const int64_t vocab0 = std::min<int64_t>(vocab, r * stride);
      const int64_t count = std::min<int64_t>(vocab, vocab0 + stride) - vocab0;
      if (count == 0) continue;
      LOOM_CUDA_CALL(cudaMemcpy2DAsync(
          static_cast<float*>(out.data) + vocab0, vocab * sizeof(float), gathered + r * floats,
          stride * sizeof(float), count * sizeof(float), rows, cudaMemcpyDeviceToDevice, stream_));
    }
    return absl::OkStatus();
  }
  std::vector<float> padded(rows * stride, 0.0f);
  if (n > 0 && rows > 0) {
    LOOM_CUDA_CALL(cudaMemcpy2DAsync(padded.data(), stride * sizeof(float), local.data,
                                     n * sizeof(float), n * sizeof(float), rows,
                                     cudaMemcpyDeviceToHost, stream_));
  }
  LOOM_RETURN_IF_ERROR(Synchronize());
  host_gathered_.resize(world * rows * stride);
  LOOM_RETURN_IF_ERROR(comm->AllGather(padded, absl::MakeSpan(host_gathered_)));
  host_.assign(rows * vocab, 0.0f);
  for (int r = 0; r < world; ++r) {
    const int64_t vocab0 = std::min<int64_t>(vocab, r * stride);
    const int64_t count = std::min<int64_t>(vocab, vocab0 + stride) - vocab0;
    for (int64_t i = 0; i < rows; ++i) {
      std::memcpy(host_.data() + i * vocab + vocab0,
                  host_gathered_.data() + (r * rows + i) * stride, count * sizeof(float));
    }
  }
  LOOM_CUDA_CALL(cudaMemcpyAsync(out.data, host_.data(), host_.size() * sizeof(float),
                                 cudaMemcpyHostToDevice, stream_));
  return Synchronize();
}

}  // namespace loom::model

#endif  // LOOM_HAVE_CUDA
