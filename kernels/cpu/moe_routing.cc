#include "kernels/cpu/moe_routing.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace loom::kernels::cpu {

void MoeRoute(const float* logits, int64_t num_tokens, int64_t num_experts,
              const MoeRouting& routing, int32_t* chosen, float* weights) {
  const int64_t top_k = routing.top_k;
  std::vector<int32_t> order(static_cast<size_t>(num_experts));
  std::vector<double> score(static_cast<size_t>(num_experts));
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float* row = logits + t * num_experts;
    // Each expert's score: its softmax probability (exp(logit - max) over the row's sum) or
    // its logit's sigmoid.
    double max = -INFINITY;  // a softmax's shift
    for (int64_t e = 0; e < num_experts && !routing.sigmoid; ++e) {
      if (!std::isnan(row[e])) max = std::max(max, static_cast<double>(row[e]));
    }
    double total = 0.0;
    for (int64_t e = 0; e < num_experts; ++e) {
      const double x = row[e];
      score[e] = routing.sigmoid ? 1.0 / (1.0 + std::exp(-x)) : std::exp(x - max);
      if (!std::isnan(score[e])) total += score[e];
    }
    if (!routing.sigmoid) {
      for (double& s : score) s /= total;  // probabilities
    }
    std::iota(order.begin(), order.end(), 0);
    // NaN ranks last (a strict weak order whatever the logits hold).
    auto key = [&](int32_t e) {
      const double biased =
          score[e] + (routing.selection_bias != nullptr ? routing.selection_bias[e] : 0.0f);
      return std::isnan(biased) ? -INFINITY : biased;
    };
    std::partial_sort(order.begin(), order.begin() + top_k, order.end(), [&](int32_t a, int32_t b) {
      const double ka = key(a), kb = key(b);
      return ka > kb || (ka == kb && a < b);
    });
    double chosen_total = 0.0;
    for (int64_t i = 0; i < top_k; ++i) chosen_total += score[order[static_cast<size_t>(i)]];
    const double divisor = routing.normalize ? chosen_total : 1.0;
    for (int64_t i = 0; i < top_k; ++i) {
      const int32_t e = order[static_cast<size_t>(i)];
      chosen[t * top_k + i] = e;
      weights[t * top_k + i] = static_cast<float>(score[e] / divisor * routing.scale);
    }
  }
}

}  // namespace loom::kernels::cpu
