#include "worker/cuda_device_linear.h"

#if LOOM_HAVE_CUDA

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"
#include "kernels/cuda/types.h"

namespace loom::worker {
namespace kc = kernels::cuda;

namespace {

// Host rows dequantized per chunk while uploading a weight (bounds the host scratch).
constexpr int64_t kUploadChunkElements = int64_t{4} << 20;

}  // namespace

absl::Status CudaCallStatus(cudaError_t error, const char* call) {
  if (error == cudaSuccess) return absl::OkStatus();
  // Clears a non-sticky error so it is not reported again by the next launch check; a sticky one
  // (the context is lost) stays, and the runner refuses further steps anyway.
  cudaGetLastError();
  return absl::InternalError(absl::StrFormat("%s: %s", call, cudaGetErrorString(error)));
}

absl::StatusOr<kc::DeviceBuffer> UploadMatrix(const kernels::cpu::PackedWeight& weight,
                                              kc::DataType dtype) {
  const int64_t elem = kc::ElementBytes(dtype);
  LOOM_ASSIGN_OR_RETURN(
      kc::DeviceBuffer buffer,
      kc::DeviceBuffer::Allocate(static_cast<size_t>(weight.rows * weight.cols * elem)));
  const int64_t chunk_rows = std::max<int64_t>(1, kUploadChunkElements / weight.cols);
  std::vector<float> values;
  std::vector<uint8_t> converted;
  for (int64_t row = 0; row < weight.rows; row += chunk_rows) {
    const int64_t rows = std::min(chunk_rows, weight.rows - row);
    values.resize(rows * weight.cols);
    converted.resize(rows * weight.cols * elem);
    kernels::cpu::DequantizeRows(weight, row, row + rows, values.data());
    kc::ConvertFromFloat(dtype, values.data(), rows * weight.cols, converted.data());
    LOOM_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(static_cast<uint8_t*>(buffer.data()) + row * weight.cols * elem,
                   converted.data(), converted.size(), cudaMemcpyHostToDevice));
  }
  return buffer;
}

absl::StatusOr<kc::DeviceBuffer> UploadFloats(const std::vector<float>& values) {
  LOOM_ASSIGN_OR_RETURN(kc::DeviceBuffer buffer,
                        kc::DeviceBuffer::Allocate(values.size() * sizeof(float)));
  LOOM_RETURN_IF_ERROR(buffer.CopyFromHost(values.data(), values.size() * sizeof(float)));
  return buffer;
}

bool QuantGemmTakes(const kernels::cpu::PackedWeight& weight) {
  return weight.format == kernels::cpu::WeightFormat::kInt4 && weight.rows % 16 == 0 &&
         weight.cols % 64 == 0 &&
         (weight.group_size == 32 || weight.group_size == 64 || weight.group_size == 128);
}

absl::StatusOr<DeviceLinear> UploadLinear(const kernels::cpu::PackedWeight& weight,
                                          const std::vector<float>* bias, kc::DataType dtype,
                                          bool keep_quantized) {
  DeviceLinear linear;
  linear.n = weight.rows;
  linear.k = weight.cols;
  if (!keep_quantized || !QuantGemmTakes(weight)) {
    LOOM_ASSIGN_OR_RETURN(linear.dense, UploadMatrix(weight, dtype));
    return linear;
  }
  linear.group_size = weight.group_size;
  LOOM_ASSIGN_OR_RETURN(kernels::cpu::NaturalQuantizedWeight natural,
                        kernels::cpu::UnpackQuantized(weight));
  std::vector<uint8_t> nibbles(static_cast<size_t>(weight.rows * weight.cols / 2));
  for (size_t i = 0; i < nibbles.size(); ++i) {
    nibbles[i] = static_cast<uint8_t>((natural.q[2 * i] & 0x0f) | (natural.q[2 * i + 1] << 4));
  }
  LOOM_ASSIGN_OR_RETURN(
      kc::Int4GpuWeight packed,
      kc::PackInt4ForGpu(nibbles.data(), natural.scales.data(), natural.mins.data(), weight.rows,
                         weight.cols, weight.group_size));
  LOOM_ASSIGN_OR_RETURN(linear.q, kc::DeviceBuffer::Allocate(packed.q.size()));
  LOOM_RETURN_IF_ERROR(linear.q.CopyFromHost(packed.q.data(), packed.q.size()));
  const size_t scale_bytes = packed.scale_min.size() * sizeof(uint16_t);
  LOOM_ASSIGN_OR_RETURN(linear.scale_min, kc::DeviceBuffer::Allocate(scale_bytes));
  LOOM_RETURN_IF_ERROR(linear.scale_min.CopyFromHost(packed.scale_min.data(), scale_bytes));
  if (bias != nullptr && !bias->empty()) {
    std::vector<uint8_t> converted(bias->size() * kc::ElementBytes(dtype));
    kc::ConvertFromFloat(dtype, bias->data(), static_cast<int64_t>(bias->size()), converted.data());
    LOOM_ASSIGN_OR_RETURN(linear.bias, kc::DeviceBuffer::Allocate(converted.size()));
    LOOM_RETURN_IF_ERROR(linear.bias.CopyFromHost(converted.data(), converted.size()));
  }
  return linear;
}

kc::QuantGemmParams QuantParams(const DeviceLinear& linear, kc::DataType dtype, int64_t m) {
  kc::QuantGemmParams p;
  p.act_dtype = dtype;
  p.format = kc::QuantWeightFormat::kInt4;
  p.weight = linear.q.data();
  p.scales = linear.scale_min.data();
  p.bias = linear.bias.data();
  p.m = m;
  p.n = linear.n;
  p.k = linear.k;
  p.group_size = linear.group_size;
  return p;
}

}  // namespace loom::worker

#endif  // LOOM_HAVE_CUDA
