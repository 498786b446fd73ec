// INT8/INT4 weights with F32 scales and mins (the K-quants, weights.h) against int8
// activations (--activations int8): the scalar kernel, which the AVX2 and AVX-512 ones
// (matmul_kquant_int8act_avx2.cc, _avx512.cc) match bit for bit. Per weight group of 16 or
// 32 columns the integer dot product of q and the int8 activations is exact; it is applied
// as
//   p = fma(min, xsum, float(dot) * scale);   acc = fma(p, x_scale, acc)
// with xsum the activations' integer sum over the group and x_scale their scale (one per
// 256 columns, llama.cpp's Q8_K, or per 32 for a widened matrix whose width is not a
// multiple of 256: MatmulArgs::xq_group; a weight group lies inside one activation group).

#include <algorithm>
#include <cmath>

#include "kernels/cpu/matmul_internal.h"

namespace loom::kernels::cpu::internal {

void MatmulKQuantInt8ActBlocksScalar(const MatmulArgs& a, int64_t block_begin,
                                     int64_t block_end) {
  const PackedWeight& w = *a.weight;
  const int64_t k = w.cols, n = w.rows, group = w.group_size;
  const int64_t block_bytes = BlockDataBytes(w.format, k);
  const int64_t groups = k / group;
  for (int64_t b = block_begin; b < block_end; ++b) {
    const uint8_t* data = w.data.data() + b * block_bytes;
    const int64_t valid = std::min<int64_t>(kRowBlock, n - b * kRowBlock);
    for (int64_t t = 0; t < a.m; ++t) {
      const int8_t* xq = a.xq.q + t * k;
      float acc[kRowBlock] = {};
      for (int64_t g = 0; g < groups; ++g) {
        int32_t dot[kRowBlock] = {};
        AddScalarIntegerDots(data, w.format, k, xq, g * group, (g + 1) * group, dot);
        const float xsum = static_cast<float>(GroupActivationSum(a, t, g * group, group));
        const float x_scale = a.xq.scale[t * (k / a.xq_group) + g * group / a.xq_group];
        const int64_t index = (b * groups + g) * kRowBlock;
        for (int r = 0; r < kRowBlock; ++r) {
          const float p = std::fma(w.mins_f32[index + r], xsum,
                                   static_cast<float>(dot[r]) * w.scales_f32[index + r]);
          acc[r] = std::fma(p, x_scale, acc[r]);
        }
      }
      StoreBlockOutput(acc, a.bias ? a.bias + b * kRowBlock : nullptr, valid,
                       a.y + t * n + b * kRowBlock);
    }
  }
}

}  // namespace loom::kernels::cpu::internal
