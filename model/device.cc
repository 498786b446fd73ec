#include "model/device.h"

#include "common/status_macros.h"

namespace loom::model {

absl::Status Device::QkvToCache(const Tensor& qkv, Tensor q, Tensor k, Tensor v,
                                const Tensor& positions, const QkvSpec& spec, KvCache& cache,
                                int64_t layer, const Tensor& slots) {
  // SplitColumns takes [T, columns] parts: the heads of each token side by side.
  const int64_t T = qkv.rows();
  auto flat = [T](const Tensor& x) {
    return Tensor::Of(x.data, x.dtype, x.device, {T, T > 0 ? x.numel() / T : 0});
  };
  const Tensor parts[] = {flat(q), flat(k), flat(v)};
  LOOM_RETURN_IF_ERROR(SplitColumns(qkv, parts));
  if (spec.q_norm.data != nullptr) {
    // Each head a row of its own.
    const int64_t head_dim = spec.q_norm.numel();
    auto heads = [head_dim](const Tensor& x) {
      return Tensor::Of(x.data, x.dtype, x.device, {x.numel() / head_dim, head_dim});
    };
    LOOM_RETURN_IF_ERROR(RmsNorm(heads(q), spec.q_norm, spec.norm_eps, heads(q)));
    LOOM_RETURN_IF_ERROR(RmsNorm(heads(k), spec.k_norm, spec.norm_eps, heads(k)));
  }
  if (spec.rope != nullptr) LOOM_RETURN_IF_ERROR(Rope(q, k, positions, *spec.rope));
  return WriteKv(cache, layer, k, v, slots);
}

}  // namespace loom::model
