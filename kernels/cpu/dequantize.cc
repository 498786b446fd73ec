#include <vector>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "kernels/cpu/half.h"
#include "kernels/dequantize.h"

namespace loom::kernels {

absl::Status CheckDequantizeParams(const DequantizeParams& params) {
  using common::GgmlType;
  const GgmlType type = params.src_type;
  if (type != GgmlType::kF16 && type != GgmlType::kQ8_0 && type != GgmlType::kQ4_0 &&
      type != GgmlType::kQ4_1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "dequantize: unsupported source type %s (supported: F16, Q8_0, Q4_0, Q4_1)",
        common::RawGgmlTypeName(static_cast<uint32_t>(type))));
  }
  const int64_t block_size = type == GgmlType::kF16 ? 1 : 32;
  if (params.num_elements <= 0 || params.num_elements % block_size != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "dequantize: num_elements %d must be positive and a multiple of %d for %s",
        params.num_elements, block_size, common::RawGgmlTypeName(static_cast<uint32_t>(type))));
  }
  if (params.src == nullptr || params.dst == nullptr) {
    return absl::InvalidArgumentError("dequantize: null src or dst");
  }
  return absl::OkStatus();
}

absl::Status DequantizeReference(const DequantizeParams& params) {
  LOOM_RETURN_IF_ERROR(CheckDequantizeParams(params));
  if (params.dst_type == DequantOutputType::kF32) {
    return common::DequantizeToF32(params.src_type, params.src,
                                   static_cast<uint64_t>(params.num_elements),
                                   static_cast<float*>(params.dst));
  }
  std::vector<float> values(static_cast<size_t>(params.num_elements));
  LOOM_RETURN_IF_ERROR(common::DequantizeToF32(
      params.src_type, params.src, static_cast<uint64_t>(params.num_elements), values.data()));
  auto* dst = static_cast<uint16_t*>(params.dst);
  for (size_t i = 0; i < values.size(); ++i) dst[i] = cpu::FloatToHalf(values[i]);
  return absl::OkStatus();
}

#if !LOOM_HAVE_CUDA
absl::Status LaunchDequantize(const DequantizeParams& params, cudaStream_t stream) {
  (void)stream;
  LOOM_RETURN_IF_ERROR(CheckDequantizeParams(params));
  return absl::FailedPreconditionError("dequantize: Loom was built without CUDA");
}
#endif

}  // namespace loom::kernels
