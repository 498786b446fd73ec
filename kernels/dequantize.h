#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "common/formats/ggml_type.h"
#include "kernels/cuda_device.h"

namespace loom::kernels {

/// Element type a dequantize kernel writes.
enum class DequantOutputType { kF32, kF16 };

/// Expands GGUF blocks into plain F32/F16 values. Used at load time for weights in
/// formats that a backend has no direct GEMM for.
struct DequantizeParams {
  const void* src = nullptr;   // [num_elements / block_size] blocks of src_type
  void* dst = nullptr;         // [num_elements] values of dst_type
  int64_t num_elements = 0;    // > 0, a multiple of src_type's block size
  common::GgmlType src_type = common::GgmlType::kQ4_1;  // F16, Q8_0, Q4_0 or Q4_1
  DequantOutputType dst_type = DequantOutputType::kF16;
};

/// OK when `params` names a supported conversion with valid sizes; InvalidArgument
/// (naming the type or size) otherwise. Checked before every launch.
absl::Status CheckDequantizeParams(const DequantizeParams& params);

/// CPU reference over host pointers: F32 output is bit-identical to
/// common::DequantizeToF32; F16 output is that value rounded to nearest even.
absl::Status DequantizeReference(const DequantizeParams& params);

/// The CUDA kernel over device pointers, asynchronous on `stream`; same results as the
/// reference (bit-identical: no fused multiply-add). FailedPrecondition when Loom was
/// built without CUDA; launch errors come back as Internal.
absl::Status LaunchDequantize(const DequantizeParams& params, cudaStream_t stream);

}  // namespace loom::kernels
