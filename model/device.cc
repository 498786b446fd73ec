#include "model/device.h"

#include "common/status_macros.h"

namespace loom::model {

absl::Status Device::QkvToCache(const Tensor& qkv, Tensor q, Tensor k, Tensor v,
                                const Tensor& positions, const RopeSpec* rope, KvCache& cache,
                                int64_t layer, const Tensor& slots) {
  // SplitColumns takes [T, columns] parts: the heads of each token side by side.
  const int64_t T = qkv.rows();
  auto flat = [T](const Tensor& x) {
    return Tensor::Of(x.data, x.dtype, x.device, {T, T > 0 ? x.numel() / T : 0});
  };
  const Tensor parts[] = {flat(q), flat(k), flat(v)};
  LOOM_RETURN_IF_ERROR(SplitColumns(qkv, parts));
  if (rope != nullptr) LOOM_RETURN_IF_ERROR(Rope(q, k, positions, *rope));
  return WriteKv(cache, layer, k, v, slots);
}

}  // namespace loom::model
