#include "kernels/cpu/speculative_verify.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace loom::kernels::cpu {
namespace {

int32_t Argmax(const float* row, int64_t vocab) {
  return static_cast<int32_t>(std::max_element(row, row + vocab) - row);
}

// Inverse CDF of the (unnormalised) weights w[v] = weight(v) at u * total, in double.
template <typename Weight>
int32_t SampleFrom(int64_t vocab, double u, Weight&& weight) {
  double total = 0.0;
  for (int64_t v = 0; v < vocab; ++v) total += weight(v);
  if (total <= 0.0) return -1;
  const double target = u * total;
  double cumulative = 0.0;
  int32_t last_positive = -1;
  for (int64_t v = 0; v < vocab; ++v) {
    const double w = weight(v);
    if (w <= 0.0) continue;
    last_positive = static_cast<int32_t>(v);
    cumulative += w;
    if (target < cumulative) return last_positive;
  }
  return last_positive;  // rounding at the top end
}

}  // namespace

absl::Status SpeculativeVerify(const SpeculativeVerifyParams& p) {
  if (p.num_seqs < 0 || p.vocab <= 0 || p.row_start == nullptr || p.row_start[0] != 0) {
    return absl::InvalidArgumentError("speculative verify: bad batch shape");
  }
  for (int64_t s = 0; s < p.num_seqs; ++s) {
    const int32_t rows = p.row_start[s + 1] - p.row_start[s];
    if (rows < 1) {
      return absl::InvalidArgumentError(
          absl::StrFormat("speculative verify: sequence %d has %d target rows (needs k + 1)", s,
                          rows));
    }
    for (int32_t i = 0; i + 1 < rows; ++i) {
      const int32_t token = p.draft_tokens[p.row_start[s] - s + i];
      if (token < 0 || token >= p.vocab) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "speculative verify: sequence %d draft %d is token %d, outside [0, %d)", s, i, token,
            p.vocab));
      }
    }
  }
  for (int64_t s = 0; s < p.num_seqs; ++s) {
    const int32_t first_row = p.row_start[s];
    const int32_t k = p.row_start[s + 1] - first_row - 1;
    const int32_t first_draft = first_row - static_cast<int32_t>(s);
    int32_t accepted = 0;
    int32_t next = -1;
    for (; accepted < k; ++accepted) {
      const float* target = p.target_probs + (first_row + accepted) * p.vocab;
      const int32_t x = p.draft_tokens[first_draft + accepted];
      if (p.greedy[s]) {
        const int32_t best = Argmax(target, p.vocab);
        if (x != best) {
          next = best;
          break;
        }
        continue;
      }
      const float* draft =
          p.draft_probs != nullptr ? p.draft_probs + (first_draft + accepted) * p.vocab : nullptr;
      const double px = target[x];
      const double qx = draft != nullptr ? draft[x] : 1.0;
      // Accept with probability min(1, p/q): u < p / q, as u * q < p (no division by 0).
      if (static_cast<double>(p.uniforms[first_row + accepted]) * qx < px) continue;
      // Rejected: the residual norm(max(0, p - q)). With q one-hot at x that is p without x.
      const double u = p.sample_uniforms != nullptr ? p.sample_uniforms[first_row + accepted]
                                                    : p.uniforms[first_row + k];
      next = SampleFrom(p.vocab, u, [&](int64_t v) {
        const double q = draft != nullptr ? draft[v] : (v == x ? 1.0 : 0.0);
        return std::max(0.0, static_cast<double>(target[v]) - q);
      });
      // p <= q everywhere happens only through rounding when p == q; then any token of p.
      if (next < 0) next = SampleFrom(p.vocab, u, [&](int64_t v) { return target[v]; });
      break;
    }
    if (accepted == k) {
      const float* bonus = p.target_probs + (first_row + k) * p.vocab;
      const double u = p.sample_uniforms != nullptr ? p.sample_uniforms[first_row + k]
                                                    : p.uniforms[first_row + k];
      next = p.greedy[s] ? Argmax(bonus, p.vocab)
                         : SampleFrom(p.vocab, u, [&](int64_t v) { return bonus[v]; });
    }
    p.num_accepted[s] = accepted;
    p.next_token[s] = next;
  }
  return absl::OkStatus();
}

absl::StatusOr<VerifiedDrafts> VerifySampledDrafts(const float* target_probs,
                                                   const float* draft_probs,
                                                   absl::Span<const int32_t> drafts,
                                                   const float* uniforms,
                                                   const float* sample_uniforms, int64_t vocab) {
  const int32_t row_start[2] = {0, static_cast<int32_t>(drafts.size()) + 1};
  const uint8_t greedy = 0;
  VerifiedDrafts verified;
  SpeculativeVerifyParams p;
  p.target_probs = target_probs;
  p.draft_probs = draft_probs;
  p.draft_tokens = drafts.data();
  p.uniforms = uniforms;
  p.sample_uniforms = sample_uniforms;
  p.row_start = row_start;
  p.greedy = &greedy;
  p.num_seqs = 1;
  p.vocab = vocab;
  p.num_accepted = &verified.accepted;
  p.next_token = &verified.next;
  if (absl::Status status = SpeculativeVerify(p); !status.ok()) return status;
  return verified;
}

}  // namespace loom::kernels::cpu
