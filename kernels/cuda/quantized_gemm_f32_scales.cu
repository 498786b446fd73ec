// The quantized GEMM's members with F32 group scales: INT8 weights in groups of 16 or 32 whose
// scales (and mins) are F32, as Loom holds GGUF's K-quants (Q6_K: INT8 g16; Q5_K and a Q4_K
// projection fused with a Q6_K one: INT8 with mins). Compiled apart from quantized_gemm.cu,
// which dispatches here, so that the two halves of the family build in parallel.
#include "kernels/cuda/quantized_gemm.cuh"

namespace loom::kernels::cuda::internal::qgemm {

template <typename T>
absl::Status DispatchF32Scales(const QuantGemmParams& p, int config, int splits,
                               cudaStream_t stream) {
  constexpr QuantScaleType kF32 = QuantScaleType::kF32;
  constexpr QuantScaleType kF32WithMin = QuantScaleType::kF32WithMin;
  if (p.format == QuantWeightFormat::kInt8 && p.group_size == 16) {
    return p.scale_type == kF32WithMin
               ? DispatchConfig<T, false, 16, kF32WithMin>(p, config, splits, stream)
               : DispatchConfig<T, false, 16, kF32>(p, config, splits, stream);
  }
  if (p.format == QuantWeightFormat::kInt8 && p.group_size == 32) {
    return p.scale_type == kF32WithMin
               ? DispatchConfig<T, false, 32, kF32WithMin>(p, config, splits, stream)
               : DispatchConfig<T, false, 32, kF32>(p, config, splits, stream);
  }
  return absl::InternalError("QuantGemm: F32-scale dispatch out of sync with the check");
}

template absl::Status DispatchF32Scales<__half>(const QuantGemmParams&, int, int, cudaStream_t);
template absl::Status DispatchF32Scales<__nv_bfloat16>(const QuantGemmParams&, int, int,
                                                       cudaStream_t);

}  // namespace loom::kernels::cuda::internal::qgemm
