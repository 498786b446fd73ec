#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/weights.h"

namespace loom::quant {

/// Calibration statistics of one linear layer's input (AWQ): the mean |x| of every input
/// channel over all tokens seen, and a deterministic subsample of whole token rows
/// (every `sample_every`-th token, at most `max_samples`) on which the scale search
/// measures output error. Not thread-safe.
class ActivationStats {
 public:
  ActivationStats(int64_t in_features, int64_t max_samples, int64_t sample_every);

  /// Adds x [num_tokens, in_features].
  void Add(const float* x, int64_t num_tokens);

  int64_t in_features() const { return in_features_; }
  int64_t num_tokens() const { return num_tokens_; }
  int64_t num_samples() const { return static_cast<int64_t>(samples_.size()) / in_features_; }
  /// Mean |x| per input channel, [in_features] (zeros before any Add).
  std::vector<float> MeanAbs() const;
  /// The kept token rows, [num_samples, in_features].
  const std::vector<float>& samples() const { return samples_; }

 private:
  int64_t in_features_;
  int64_t max_samples_;
  int64_t sample_every_;
  int64_t num_tokens_ = 0;
  std::vector<double> abs_sum_;  // [in_features]
  std::vector<float> samples_;   // [num_samples, in_features]
};

struct AwqOptions {
  kernels::cpu::WeightFormat format = kernels::cpu::WeightFormat::kInt4;
  int64_t group_size = 128;
  /// alpha takes the values 0, 1/grid, ..., (grid - 1)/grid (alpha 0 is plain RTN).
  int grid = 20;
};

struct AwqResult {
  /// Per input channel, [in_features]: W's columns are multiplied by it, and the op
  /// producing the input (RMSNorm weight, `up` rows) divided by it. All ones when
  /// alpha == 0 wins.
  std::vector<float> scales;
  double alpha = 0;
  double error = 0;      // mean squared output error of the chosen scales
  double rtn_error = 0;  // the same for alpha 0 (round to nearest, no scaling)
};

/// AWQ's scale search (Lin et al., 2023) for a weight W [rows, cols] whose input
/// statistics are `stats` (several matrices reading the same input, e.g. Q, K and V,
/// stacked by rows): for each alpha of the grid, s = mean|x|^alpha normalised by
/// sqrt(max s * min s), W·diag(s) quantized with round-to-nearest, and the error
/// ||Q(W·diag(s))·(x / s) - W·x||² measured on the sampled rows through the same
/// Matmul kernel inference uses; the alpha with the smallest error wins.
/// InvalidArgument when there are no samples or the shapes disagree.
absl::StatusOr<AwqResult> SearchAwqScales(const float* weight, int64_t rows, int64_t cols,
                                          const ActivationStats& stats, const AwqOptions& options,
                                          kernels::cpu::ThreadPool& pool);

/// Mean squared output error of quantizing W [rows, cols] (RTN, `options`' format and
/// group) after scaling its columns by `scales` (nullptr: none), on rows x [n, cols].
absl::StatusOr<double> ScaledQuantizationError(const float* weight, int64_t rows, int64_t cols,
                                               const float* scales, const float* x, int64_t n,
                                               const AwqOptions& options,
                                               kernels::cpu::ThreadPool& pool);

struct ClipResult {
  double error = 0;  // summed over rows and groups: (x·(Q(w_clipped) - w))² averaged over samples
  double unclipped_error = 0;  // the same without clipping
  int64_t clipped_groups = 0;  // (row, group) pairs whose range shrank
};

/// AWQ's clipping search (INT4 only): for every row and group of W [rows, cols], the range
/// [min w, max w] shrunk by a factor r in {1, 1 - 1/grid, ..., 1 - max_shrink} that
/// minimises the group's output error E(r) = mean over samples of (x_g · (Q(clamp(w_g, r))
/// - w_g))², measured through the group's input covariance x_gᵀx_g / n; W is clamped to
/// the winners in place (r = 1 leaves a group as it was, so no group gets worse). `x` is
/// [n, cols], the input as the (already scaled) W sees it. Parallel over rows on `pool`.
absl::StatusOr<ClipResult> ClipWeights(float* weight, int64_t rows, int64_t cols, const float* x,
                                       int64_t n, int64_t group_size, int grid, double max_shrink,
                                       kernels::cpu::ThreadPool& pool);

/// w[r, c] *= factors[c] for a row-major [rows, cols] matrix.
void ScaleColumns(float* w, int64_t rows, int64_t cols, const float* factors);
/// w[r, c] /= divisors[r] for a row-major [rows, cols] matrix.
void DivideRows(float* w, int64_t rows, int64_t cols, const float* divisors);

}  // namespace loom::quant
