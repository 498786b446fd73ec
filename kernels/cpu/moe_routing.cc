#include "kernels/cpu/moe_routing.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace loom::kernels::cpu {

void MoeRoute(const float* logits, int64_t num_tokens, int64_t num_experts, int64_t top_k,
              bool normalize, int32_t* chosen, float* weights) {
  std::vector<int32_t> order(static_cast<size_t>(num_experts));
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float* row = logits + t * num_experts;
    // Softmax is monotone: the largest logits are the most probable experts.
    std::iota(order.begin(), order.end(), 0);
    // NaN ranks last (a strict weak order whatever the logits hold).
    auto key = [row](int32_t e) { return std::isnan(row[e]) ? -INFINITY : row[e]; };
    std::partial_sort(order.begin(), order.begin() + top_k, order.end(), [&](int32_t a, int32_t b) {
      return key(a) > key(b) || (key(a) == key(b) && a < b);
    });
    const float max = row[order[0]];
    // Denominator: every expert's exp, or the chosen ones' when renormalizing.
    double total = 0.0;
    const int64_t summed = normalize ? top_k : num_experts;
    for (int64_t i = 0; i < summed; ++i) {
      const int32_t e = normalize ? order[static_cast<size_t>(i)] : static_cast<int32_t>(i);
      total += std::exp(static_cast<double>(row[e]) - max);
    }
    for (int64_t i = 0; i < top_k; ++i) {
      const int32_t e = order[static_cast<size_t>(i)];
      chosen[t * top_k + i] = e;
      weights[t * top_k + i] =
          static_cast<float>(std::exp(static_cast<double>(row[e]) - max) / total);
    }
  }
}

}  // namespace loom::kernels::cpu
