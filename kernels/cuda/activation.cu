// Gated activations, soft-capping, scaling and gated row sums: element-wise, grid-stride
// loops.
#include "common/status_macros.h"
#include "kernels/cuda/activation.h"
#include "kernels/cuda/launch_internal.cuh"

namespace loom::kernels::cuda {
namespace {

using internal::FromFloat;
using internal::ToFloat;

// cpu::kSwigluOaiAlpha, the sigmoid's slope of OpenAI's clamped SwiGLU.
constexpr float kSwigluOaiAlpha = 1.702f;

// `limit`: kSwigluOai's clamp (unused by the others).
template <typename T, GateActivation kActivation>
__global__ void GatedKernel(const T* __restrict__ gate_up, T* __restrict__ out,
                            int64_t num_elements, int64_t ffn, float limit, void* out_low,
                            bool low_bf16) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       index < num_elements; index += stride) {
    const int64_t token = index / ffn, i = index % ffn;
    const T* row = gate_up + token * 2 * ffn;
    const float gate = ToFloat(row[i]), up = ToFloat(row[ffn + i]);
    float value_f;
    if constexpr (kActivation == GateActivation::kSilu) {
      value_f = gate / (1.0f + expf(-gate)) * up;
    } else if constexpr (kActivation == GateActivation::kGeluTanh) {
      constexpr float kSqrt2OverPi = 0.7978845608028654f;
      const float cube = gate * gate * gate;
      value_f = 0.5f * gate * (1.0f + tanhf(kSqrt2OverPi * (gate + 0.044715f * cube))) * up;
    } else {
      // cpu::SwigluOaiMul's expression term for term. The comparisons are std::min's and
      // std::clamp's, so a NaN gate or up stays NaN (fminf would answer the limit).
      const float g = limit < gate ? limit : gate;
      const float u = up < -limit ? -limit : (limit < up ? limit : up);
      value_f = g / (1.0f + expf(-kSwigluOaiAlpha * g)) * (u + 1.0f);
    }
    const T value = FromFloat<T>(value_f);
    out[index] = value;
    if (out_low != nullptr) internal::StoreLow(out_low, low_bf16, index, ToFloat(value));
  }
}

template <typename T, InPlaceOp kOp>
__global__ void InPlaceKernel(T* __restrict__ x, int64_t num_elements, float value) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       index < num_elements; index += stride) {
    const float in = ToFloat(x[index]);
    if constexpr (kOp == InPlaceOp::kSoftCap) {
      x[index] = FromFloat<T>(value * tanhf(in / value));
    } else {
      x[index] = FromFloat<T>(value * in);
    }
  }
}

__global__ void AddGatedRowsKernel(const float* __restrict__ x,
                                   const float* __restrict__ gate_logits, float* __restrict__ out,
                                   int64_t num_elements, int64_t cols) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       index < num_elements; index += stride) {
    const float s = gate_logits == nullptr ? 1.0f : 1.0f / (1.0f + expf(-gate_logits[index / cols]));
    out[index] += s * x[index];
  }
}

constexpr int kThreads = 256;

}  // namespace

absl::Status LaunchSiluMul(const SiluMulParams& p, cudaStream_t stream) {
  LOOM_RETURN_IF_ERROR(CheckSiluMulParams(p));
  if (p.num_tokens == 0) return absl::OkStatus();
  const int64_t num_elements = p.num_tokens * p.ffn;
  internal::DispatchDataType(p.dtype, [&]<typename T>() {
    const auto* gate_up = static_cast<const T*>(p.gate_up);
    auto* out = static_cast<T*>(p.out);
    const int grid = internal::GridFor(num_elements, kThreads);
    const bool low_bf16 = p.low_dtype == DataType::kBF16;
    switch (p.activation) {
      case GateActivation::kSilu:
        GatedKernel<T, GateActivation::kSilu><<<grid, kThreads, 0, stream>>>(
            gate_up, out, num_elements, p.ffn, p.limit, p.out_low, low_bf16);
        break;
      case GateActivation::kGeluTanh:
        GatedKernel<T, GateActivation::kGeluTanh><<<grid, kThreads, 0, stream>>>(
            gate_up, out, num_elements, p.ffn, p.limit, p.out_low, low_bf16);
        break;
      case GateActivation::kSwigluOai:
        GatedKernel<T, GateActivation::kSwigluOai><<<grid, kThreads, 0, stream>>>(
            gate_up, out, num_elements, p.ffn, p.limit, p.out_low, low_bf16);
        break;
    }
  });
  return internal::CheckLaunch("SiluMul");
}

absl::Status LaunchInPlace(const InPlaceParams& p, cudaStream_t stream) {
  LOOM_RETURN_IF_ERROR(CheckInPlaceParams(p));
  if (p.num_elements == 0) return absl::OkStatus();
  const int grid = internal::GridFor(p.num_elements, kThreads);
  internal::DispatchDataType(p.dtype, [&]<typename T>() {
    auto* x = static_cast<T*>(p.x);
    if (p.op == InPlaceOp::kSoftCap) {
      InPlaceKernel<T, InPlaceOp::kSoftCap><<<grid, kThreads, 0, stream>>>(x, p.num_elements,
                                                                          p.value);
    } else {
      InPlaceKernel<T, InPlaceOp::kScale><<<grid, kThreads, 0, stream>>>(x, p.num_elements,
                                                                        p.value);
    }
  });
  return internal::CheckLaunch(p.op == InPlaceOp::kSoftCap ? "SoftCap" : "Scale");
}

absl::Status LaunchAddGatedRows(const AddGatedRowsParams& p, cudaStream_t stream) {
  LOOM_RETURN_IF_ERROR(CheckAddGatedRowsParams(p));
  if (p.rows == 0) return absl::OkStatus();
  const int64_t num_elements = p.rows * p.cols;
  AddGatedRowsKernel<<<internal::GridFor(num_elements, kThreads), kThreads, 0, stream>>>(
      p.x, p.gate_logits, p.out, num_elements, p.cols);
  return internal::CheckLaunch("AddGatedRows");
}

}  // namespace loom::kernels::cuda
