// Quantized GEMM launches: the W4A16 / W8A16 kernel family (quantized_gemm.cuh holds the kernels,
// their fragment layouts and the device weight layout), the FP8 activation quantizer and the FP8
// GEMM through cuBLASLt.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_fp8.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <unordered_map>

#include "common/status_macros.h"
#include "kernels/cuda/cublas_library.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/launch_internal.cuh"
#include "kernels/cuda/quantized_gemm.cuh"
#include "kernels/cuda/quantized_gemm.h"
#include "kernels/cuda/quantized_gemm_internal.h"

namespace loom::kernels::cuda {
namespace {

using internal::CheckLaunch;
using internal::FromFloat;
using internal::GridFor;
using internal::ToFloat;
namespace qgemm = internal::qgemm;

// ------------------------------------------------------------------------------ W4A16 / W8A16

// The one runtime -> compile-time dispatch: dtype x format x group size x scale type (then
// qgemm::DispatchConfig: x config). The supported lists are the ones CheckQuantGemmParams
// enforces.
template <typename T>
absl::Status DispatchFormat(const QuantGemmParams& p, int config, int splits, cudaStream_t stream) {
  using qgemm::DispatchConfig;
  constexpr QuantScaleType kF16 = QuantScaleType::kF16;
  if (p.scale_type != kF16) return qgemm::DispatchF32Scales<T>(p, config, splits, stream);
  const bool int4 = p.format == QuantWeightFormat::kInt4;
  if (!QuantGemmGrouped(p)) return DispatchConfig<T, false, 0, kF16>(p, config, splits, stream);
  switch (p.group_size) {
    case 16:  // INT4 only (GGUF Q3_K, Q2_K)
      if (int4) return DispatchConfig<T, true, 16, kF16>(p, config, splits, stream);
      break;
    case 32:
      return int4 ? DispatchConfig<T, true, 32, kF16>(p, config, splits, stream)
                  : DispatchConfig<T, false, 32, kF16>(p, config, splits, stream);
    case 64:
      return int4 ? DispatchConfig<T, true, 64, kF16>(p, config, splits, stream)
                  : DispatchConfig<T, false, 64, kF16>(p, config, splits, stream);
    case 128:
      return int4 ? DispatchConfig<T, true, 128, kF16>(p, config, splits, stream)
                  : DispatchConfig<T, false, 128, kF16>(p, config, splits, stream);
  }
  return absl::InternalError("QuantGemm: dispatch out of sync with the check");
}

// ------------------------------------------------------------------------------ FP8

template <typename T>
__global__ void AbsMaxKernel(const T* __restrict__ x, int64_t count, unsigned int* amax_bits) {
  __shared__ float scratch[32];
  float local = 0.0f;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    local = fmaxf(local, fabsf(ToFloat(x[i])));
  }
  local = internal::WarpMax(local);
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = local;
  __syncthreads();
  if (threadIdx.x < 32) {
    float value = threadIdx.x < blockDim.x / 32 ? scratch[threadIdx.x] : 0.0f;
    value = internal::WarpMax(value);
    // Non-negative floats order like their bit patterns.
    if (threadIdx.x == 0) atomicMax(amax_bits, __float_as_uint(value));
  }
}

__global__ void ScaleFromAbsMaxKernel(float* scale) {
  const float amax = *scale;
  *scale = amax > 0.0f ? amax / kE4m3Max : 1.0f / kE4m3Max;
}

// One block per row: the row's max |x|, its scale (as ScaleFromAbsMaxKernel's), its codes.
template <typename T>
__global__ void QuantizeFp8RowsKernel(const T* __restrict__ x, uint8_t* __restrict__ out,
                                      float* __restrict__ scales, int64_t row_size) {
  __shared__ float scratch[32];
  const T* row = x + blockIdx.x * row_size;
  uint8_t* codes = out + blockIdx.x * row_size;
  float local = 0.0f;
  for (int64_t i = threadIdx.x; i < row_size; i += blockDim.x) {
    local = fmaxf(local, fabsf(ToFloat(row[i])));
  }
  local = internal::WarpMax(local);
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = local;
  __syncthreads();
  float amax = 0.0f;
  for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) amax = fmaxf(amax, scratch[w]);
  const float scale = amax > 0.0f ? amax / kE4m3Max : 1.0f / kE4m3Max;
  if (threadIdx.x == 0) scales[blockIdx.x] = scale;
  const float inverse = 1.0f / scale;
  for (int64_t i = threadIdx.x; i < row_size; i += blockDim.x) {
    codes[i] = __nv_cvt_float_to_fp8(ToFloat(row[i]) * inverse, __NV_SATFINITE, __NV_E4M3);
  }
}

template <typename T>
__global__ void QuantizeFp8Kernel(const T* __restrict__ x, uint8_t* __restrict__ out,
                                  const float* __restrict__ scale, int64_t count) {
  const float inverse = 1.0f / *scale;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    out[i] = __nv_cvt_float_to_fp8(ToFloat(x[i]) * inverse, __NV_SATFINITE, __NV_E4M3);
  }
}

// `results` and `y` may be the same floats (an F32 output scaled in place). x_scale is one
// value, or one per row with x_per_row.
template <typename T>
__global__ void Fp8EpilogueKernel(const float* results, const float* x_scale, bool x_per_row,
                                  const float* __restrict__ w_scale, bool per_channel,
                                  const T* __restrict__ bias, T* y, int64_t count, int n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    const int column = static_cast<int>(i % n);
    const float scale = x_scale[x_per_row ? i / n : 0];
    float value = results[i] * scale * w_scale[per_channel ? column : 0];
    if (bias != nullptr) value += ToFloat(bias[column]);
    y[i] = FromFloat<T>(value);
  }
}

absl::Status FromLt(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrFormat("Fp8Gemm: %s failed: %s (%d)", what,
                                             LOOM_CUBLAS(cublasGetStatusString)(status),
                                             static_cast<int>(status)));
}

// The current device's cuBLASLt handle, made on first use (a handle belongs to the device
// current when it was created; it may be shared between threads). A failed creation is
// not kept: the next call tries again.
absl::StatusOr<cublasLtHandle_t> LtHandle() {
  if (detail::OpenCublasLibrary(detail::CublasLibrary::kCublasLt) == nullptr ||
      detail::OpenCublasLibrary(detail::CublasLibrary::kCublas) == nullptr) {
    return absl::FailedPreconditionError("Fp8Gemm: cannot load libcublasLt / libcublas");
  }
  int device = 0;
  if (const cudaError_t error = cudaGetDevice(&device); error != cudaSuccess) {
    cudaGetLastError();
    return absl::InternalError(
        absl::StrFormat("Fp8Gemm: cudaGetDevice: %s", cudaGetErrorString(error)));
  }
  static std::mutex mu;
  static auto* handles = new std::unordered_map<int, cublasLtHandle_t>();
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = handles->find(device); it != handles->end()) return it->second;
  cublasLtHandle_t handle = nullptr;
  LOOM_RETURN_IF_ERROR(FromLt(LOOM_CUBLAS_LT(cublasLtCreate)(&handle), "cublasLtCreate"));
  (*handles)[device] = handle;
  return handle;
}

struct MatmulDescDeleter {
  void operator()(cublasLtMatmulDescOpaque_t* d) const {
    LOOM_CUBLAS_LT(cublasLtMatmulDescDestroy)(d);
  }
};
struct LayoutDeleter {
  void operator()(cublasLtMatrixLayoutOpaque_t* l) const {
    LOOM_CUBLAS_LT(cublasLtMatrixLayoutDestroy)(l);
  }
};
struct PreferenceDeleter {
  void operator()(cublasLtMatmulPreferenceOpaque_t* p) const {
    LOOM_CUBLAS_LT(cublasLtMatmulPreferenceDestroy)(p);
  }
};

absl::StatusOr<std::unique_ptr<cublasLtMatrixLayoutOpaque_t, LayoutDeleter>> Layout(
    cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld) {
  cublasLtMatrixLayout_t layout = nullptr;
  LOOM_RETURN_IF_ERROR(
      FromLt(LOOM_CUBLAS_LT(cublasLtMatrixLayoutCreate)(&layout, type, rows, cols, ld),
             "cublasLtMatrixLayoutCreate"));
  return std::unique_ptr<cublasLtMatrixLayoutOpaque_t, LayoutDeleter>(layout);
}

// What one FP8 GEMM shape needs from cuBLASLt, found once: the matmul description, the
// three layouts and the heuristic's algorithm (each call building them cost ~20-50 us of
// host time per linear layer in eager steps).
struct Fp8Plan {
  std::unique_ptr<cublasLtMatmulDescOpaque_t, MatmulDescDeleter> desc;
  std::unique_ptr<cublasLtMatrixLayoutOpaque_t, LayoutDeleter> a, b, d;
  cublasLtMatmulAlgo_t algo{};
};

absl::StatusOr<std::unique_ptr<Fp8Plan>> MakeFp8Plan(cublasLtHandle_t handle, int64_t m, int64_t n,
                                                     int64_t k) {
  auto plan = std::make_unique<Fp8Plan>();
  // Row-major Y[m, n] = X[m, k] · W[n, k]^T is column-major Y^T[n, m] = op(A) · B with A = W as a
  // column-major [k, n] matrix, transposed (FP8 on cuBLASLt wants "TN"), and B = X as a
  // column-major [k, m] matrix.
  cublasLtMatmulDesc_t raw_desc = nullptr;
  LOOM_RETURN_IF_ERROR(
      FromLt(LOOM_CUBLAS_LT(cublasLtMatmulDescCreate)(&raw_desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
             "cublasLtMatmulDescCreate"));
  plan->desc.reset(raw_desc);
  const cublasOperation_t transpose = CUBLAS_OP_T, no_transpose = CUBLAS_OP_N;
  LOOM_RETURN_IF_ERROR(
      FromLt(LOOM_CUBLAS_LT(cublasLtMatmulDescSetAttribute)(
                 plan->desc.get(), CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof(transpose)),
             "set TRANSA"));
  LOOM_RETURN_IF_ERROR(FromLt(
      LOOM_CUBLAS_LT(cublasLtMatmulDescSetAttribute)(plan->desc.get(), CUBLASLT_MATMUL_DESC_TRANSB,
                                                     &no_transpose, sizeof(no_transpose)),
      "set TRANSB"));
  LOOM_ASSIGN_OR_RETURN(plan->a, Layout(CUDA_R_8F_E4M3, k, n, k));
  LOOM_ASSIGN_OR_RETURN(plan->b, Layout(CUDA_R_8F_E4M3, k, m, k));
  LOOM_ASSIGN_OR_RETURN(plan->d, Layout(CUDA_R_32F, n, m, n));

  cublasLtMatmulPreference_t raw_preference = nullptr;
  LOOM_RETURN_IF_ERROR(FromLt(LOOM_CUBLAS_LT(cublasLtMatmulPreferenceCreate)(&raw_preference),
                              "cublasLtMatmulPreferenceCreate"));
  std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, PreferenceDeleter> preference(raw_preference);
  const uint64_t lt_workspace_bytes = internal::kFp8LtWorkspaceBytes;
  LOOM_RETURN_IF_ERROR(FromLt(LOOM_CUBLAS_LT(cublasLtMatmulPreferenceSetAttribute)(
                                  preference.get(), CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                  &lt_workspace_bytes, sizeof(lt_workspace_bytes)),
                              "set MAX_WORKSPACE_BYTES"));
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  LOOM_RETURN_IF_ERROR(FromLt(
      LOOM_CUBLAS_LT(cublasLtMatmulAlgoGetHeuristic)(handle, plan->desc.get(), plan->a.get(),
                                                     plan->b.get(), plan->d.get(), plan->d.get(),
                                                     preference.get(), 1, &heuristic, &found),
      "cublasLtMatmulAlgoGetHeuristic"));
  if (found == 0) {
    return absl::InternalError(
        absl::StrFormat("Fp8Gemm: cuBLASLt has no FP8 algorithm for m %d, n %d, k %d", m, n, k));
  }
  plan->algo = heuristic.algo;
  return plan;
}

// The plan of (the current device, m, n, k), made on first use; at most kMaxFp8Plans are
// kept (eager prefill steps see many m), the oldest set dropped whole when full.
absl::StatusOr<std::shared_ptr<const Fp8Plan>> CachedFp8Plan(cublasLtHandle_t handle, int64_t m,
                                                             int64_t n, int64_t k) {
  constexpr size_t kMaxFp8Plans = 4096;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return absl::InternalError("Fp8Gemm: cudaGetDevice failed");
  }
  using Key = std::tuple<int, int64_t, int64_t, int64_t>;
  static std::mutex mu;
  static auto* plans = new std::map<Key, std::shared_ptr<const Fp8Plan>>();
  const Key key{device, m, n, k};
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = plans->find(key); it != plans->end()) return it->second;
  }
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<Fp8Plan> made, MakeFp8Plan(handle, m, n, k));
  std::shared_ptr<const Fp8Plan> plan(std::move(made));
  std::lock_guard<std::mutex> lock(mu);
  if (plans->size() >= kMaxFp8Plans) plans->clear();
  plans->emplace(key, plan);
  return plan;
}

}  // namespace

absl::Status LaunchQuantGemm(const QuantGemmParams& p, cudaStream_t stream) {
  LOOM_RETURN_IF_ERROR(CheckQuantGemmParams(p));
  if (p.m == 0) return absl::OkStatus();
  const int config = internal::QuantGemmConfigIndex(p.m, p.format == QuantWeightFormat::kInt4);
  LOOM_ASSIGN_OR_RETURN(const int splits,
                        internal::PlanQuantGemmSplits(p, internal::kQuantGemmConfigs[config]));
  if (p.act_dtype == DataType::kF16) return DispatchFormat<__half>(p, config, splits, stream);
  return DispatchFormat<__nv_bfloat16>(p, config, splits, stream);
}

absl::Status LaunchQuantizeFp8(const QuantizeFp8Params& p, cudaStream_t stream) {
  LOOM_RETURN_IF_ERROR(CheckQuantizeFp8Params(p));
  if (p.count == 0) return absl::OkStatus();
  auto run = [&]<typename T>() -> absl::Status {
    const T* x = static_cast<const T*>(p.x);
    if (p.row_size > 0) {
      QuantizeFp8RowsKernel<T><<<static_cast<unsigned>(p.count / p.row_size), 256, 0, stream>>>(
          x, static_cast<uint8_t*>(p.out), p.scale, p.row_size);
      return CheckLaunch("QuantizeFp8 rows");
    }
    if (p.dynamic_scale) {
      const cudaError_t cleared = cudaMemsetAsync(p.scale, 0, sizeof(float), stream);
      if (cleared != cudaSuccess) {
        cudaGetLastError();
        return absl::InternalError(
            absl::StrFormat("QuantizeFp8: cudaMemsetAsync: %s", cudaGetErrorString(cleared)));
      }
      AbsMaxKernel<T><<<std::min(GridFor(p.count, 256), 1024), 256, 0, stream>>>(
          x, p.count, reinterpret_cast<unsigned int*>(p.scale));
      LOOM_RETURN_IF_ERROR(CheckLaunch("QuantizeFp8 abs max"));
      ScaleFromAbsMaxKernel<<<1, 1, 0, stream>>>(p.scale);
      LOOM_RETURN_IF_ERROR(CheckLaunch("QuantizeFp8 scale"));
    }
    QuantizeFp8Kernel<T><<<GridFor(p.count, 256), 256, 0, stream>>>(x, static_cast<uint8_t*>(p.out),
                                                                    p.scale, p.count);
    return CheckLaunch("QuantizeFp8");
  };
  if (p.in_dtype == DataType::kF16) return run.template operator()<__half>();
  return run.template operator()<__nv_bfloat16>();
}

bool Fp8GemmSupported() {
  int device = 0;
  int major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return major * 10 + minor >= 89;
}

absl::Status LaunchFp8Gemm(const Fp8GemmParams& p, cudaStream_t stream) {
  LOOM_RETURN_IF_ERROR(CheckFp8GemmParams(p));
  if (p.m == 0) return absl::OkStatus();
  if (!Fp8GemmSupported()) {
    return absl::FailedPreconditionError(
        absl::StrFormat("Fp8Gemm: needs FP8 tensor cores (compute capability "
                        ">= 8.9); device is %s",
                        CudaDeviceDescription(0)));
  }
  LOOM_ASSIGN_OR_RETURN(cublasLtHandle_t handle, LtHandle());

  LOOM_ASSIGN_OR_RETURN(std::shared_ptr<const Fp8Plan> plan, CachedFp8Plan(handle, p.m, p.n, p.k));
  // An F32 output holds cuBLASLt's sums itself and is scaled in place: no results buffer.
  const bool in_place = p.out_dtype == DataType::kF32;
  const size_t results_bytes =
      in_place ? 0 : (static_cast<size_t>(p.m) * p.n * sizeof(float) + 255) / 256 * 256;
  float* results = in_place ? static_cast<float*>(p.y) : static_cast<float*>(p.workspace);
  void* lt_workspace = static_cast<uint8_t*>(p.workspace) + results_bytes;
  const float alpha = 1.0f, beta = 0.0f;
  LOOM_RETURN_IF_ERROR(
      FromLt(LOOM_CUBLAS_LT(cublasLtMatmul)(handle, plan->desc.get(), &alpha, p.weight,
                                            plan->a.get(), p.x, plan->b.get(), &beta, results,
                                            plan->d.get(), results, plan->d.get(), &plan->algo,
                                            lt_workspace, internal::kFp8LtWorkspaceBytes, stream),
             "cublasLtMatmul"));

  const int64_t count = p.m * p.n;
  auto epilogue = [&]<typename T>() {
    Fp8EpilogueKernel<T><<<GridFor(count, 256), 256, 0, stream>>>(
        results, p.x_scale, p.x_scale_per_row, p.w_scale, p.per_channel,
        static_cast<const T*>(p.bias),
        static_cast<T*>(p.y), count, static_cast<int>(p.n));
  };
  internal::DispatchDataType(p.out_dtype, epilogue);
  return CheckLaunch("Fp8Gemm epilogue");
}

}  // namespace loom::kernels::cuda
