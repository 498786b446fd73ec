#include "kernels/cpu/moe_routing.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace loom::kernels::cpu {
namespace {

// Grouped routing's state for one row, sized once per call of MoeRoute.
struct GroupScratch {
  std::vector<double> score;   // [groups]
  std::vector<int32_t> order;  // [groups]
  std::vector<bool> allowed;   // [num_experts]: in one of the chosen groups
};

// Grouped routing: scratch.allowed[e] <- whether expert e lies in one of the
// routing.groups_used groups of the best score (MoeRouting::groups), from `biased_score(e)`.
template <typename Score>
void ChooseGroups(const MoeRouting& routing, int64_t num_experts, const Score& biased_score,
                  GroupScratch& scratch) {
  const int64_t size = num_experts / routing.groups;
  std::vector<double>& group_score = scratch.score;
  std::vector<int32_t>& groups = scratch.order;
  std::vector<bool>& allowed = scratch.allowed;
  for (int64_t g = 0; g < routing.groups; ++g) {
    double best = -INFINITY, second = -INFINITY;
    for (int64_t e = g * size; e < (g + 1) * size; ++e) {
      const double s = biased_score(static_cast<int32_t>(e));
      if (s > best) {
        second = best;
        best = s;
      } else if (s > second) {
        second = s;
      }
    }
    group_score[static_cast<size_t>(g)] =
        routing.sigmoid && size > 1 ? best + second : best;  // -inf + -inf stays -inf
  }
  std::iota(groups.begin(), groups.end(), 0);
  std::partial_sort(groups.begin(), groups.begin() + routing.groups_used, groups.end(),
                    [&](int32_t a, int32_t b) {
                      const double ka = group_score[a], kb = group_score[b];
                      return ka > kb || (ka == kb && a < b);
                    });
  std::fill(allowed.begin(), allowed.end(), false);
  for (int64_t i = 0; i < routing.groups_used; ++i) {
    const int64_t g = groups[static_cast<size_t>(i)];
    std::fill(allowed.begin() + g * size, allowed.begin() + (g + 1) * size, true);
  }
}

}  // namespace

void MoeRoute(const float* logits, int64_t num_tokens, int64_t num_experts,
              const MoeRouting& routing, int32_t* chosen, float* weights) {
  const int64_t top_k = routing.top_k;
  std::vector<int32_t> order(static_cast<size_t>(num_experts));
  std::vector<double> score(static_cast<size_t>(num_experts));
  GroupScratch groups;
  if (routing.groups > 1) {
    groups.score.resize(static_cast<size_t>(routing.groups));
    groups.order.resize(static_cast<size_t>(routing.groups));
    groups.allowed.resize(static_cast<size_t>(num_experts));
  }
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
    auto biased_score = [&](int32_t e) {
      const double biased =
          score[e] + (routing.selection_bias != nullptr ? routing.selection_bias[e] : 0.0f);
      return std::isnan(biased) ? -INFINITY : biased;
    };
    if (routing.groups > 1) ChooseGroups(routing, num_experts, biased_score, groups);
    auto key = [&](int32_t e) {
      return routing.groups > 1 && !groups.allowed[static_cast<size_t>(e)] ? -INFINITY
                                                                           : biased_score(e);
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
