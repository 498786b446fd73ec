// Paged prefill attention's dispatch: runtime shapes to the kernel's template arguments
// (prefill_attention.cuh holds the kernel and its design).
#include "kernels/cuda/prefill_attention.cuh"

#include "kernels/cuda/prefill_attention.h"

namespace loom::kernels::cuda {
namespace {

namespace prefill = internal::prefill;
using prefill::DispatchedTiling;
using prefill::LaunchKernel;
using prefill::PrefillArgs;

// The one place runtime shapes become template arguments: dtype x output dtype x head dim
// x stored codes.
template <typename T, typename Code>
absl::Status DispatchHeadDim(const PagedPrefillParams& p, const PrefillArgs& args,
                             cudaStream_t stream) {
  const bool f32_out = p.out_dtype == DataType::kF32;
  switch (p.cache.head_dim) {
    case 64:
      return f32_out ? LaunchKernel<T, float, 64, Code, DispatchedTiling<64>>(p, args, stream)
                     : LaunchKernel<T, T, 64, Code, DispatchedTiling<64>>(p, args, stream);
    case 128:
      return f32_out ? LaunchKernel<T, float, 128, Code, DispatchedTiling<128>>(p, args, stream)
                     : LaunchKernel<T, T, 128, Code, DispatchedTiling<128>>(p, args, stream);
    default:
      return f32_out ? LaunchKernel<T, float, 256, Code, DispatchedTiling<256>>(p, args, stream)
                     : LaunchKernel<T, T, 256, Code, DispatchedTiling<256>>(p, args, stream);
  }
}

template <typename T>
absl::Status DispatchShape(const PagedPrefillParams& p, const PrefillArgs& args,
                           cudaStream_t stream) {
  switch (p.cache.quant) {
    case KvQuant::kInt8:
      return DispatchHeadDim<T, int8_t>(p, args, stream);
    case KvQuant::kFp8E4m3:
      return DispatchHeadDim<T, uint8_t>(p, args, stream);
    default:
      return DispatchHeadDim<T, T>(p, args, stream);
  }
}

}  // namespace

absl::Status LaunchPagedPrefill(const PagedPrefillParams& p, cudaStream_t stream) {
  LOOM_RETURN_IF_ERROR(CheckPagedPrefillParams(p));
  if (p.num_seqs == 0) return absl::OkStatus();
  const prefill::PrefillArgs args = prefill::MakePrefillArgs(p);
  if (p.cache.dtype == DataType::kF16) return DispatchShape<__half>(p, args, stream);
  return DispatchShape<__nv_bfloat16>(p, args, stream);
}

}  // namespace loom::kernels::cuda
