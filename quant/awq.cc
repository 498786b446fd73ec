#include "quant/awq.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/quantize.h"

namespace loom::quant {
namespace {

namespace cpu = kernels::cpu;

// AWQ clamps channel magnitudes from below so silent channels do not get zero scales.
constexpr float kMinChannelMagnitude = 1e-4f;

// y = x · Wᵀ for the float weight W [rows, cols], x [n, cols].
absl::StatusOr<std::vector<float>> ReferenceOutput(const float* weight, int64_t rows, int64_t cols,
                                                   const float* x, int64_t n,
                                                   cpu::ThreadPool& pool) {
  LOOM_ASSIGN_OR_RETURN(cpu::PackedWeight packed,
                        cpu::PackFromF32(weight, rows, cols, cpu::WeightFormat::kF32, 0));
  std::vector<float> y(n * rows);
  LOOM_RETURN_IF_ERROR(cpu::Matmul({x, &packed, nullptr, y.data(), n}, pool));
  return y;
}

// Mean squared difference between y_ref and the output of quantize(W · diag(s)) on x / s.
absl::StatusOr<double> ErrorAgainst(const float* weight, int64_t rows, int64_t cols,
                                    const float* scales, const float* x, int64_t n,
                                    const std::vector<float>& y_ref, const AwqOptions& options,
                                    cpu::ThreadPool& pool) {
  std::vector<float> scaled(weight, weight + rows * cols);
  std::vector<float> x_scaled(x, x + n * cols);
  if (scales != nullptr) {
    ScaleColumns(scaled.data(), rows, cols, scales);
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t c = 0; c < cols; ++c) x_scaled[t * cols + c] /= scales[c];
    }
  }
  LOOM_ASSIGN_OR_RETURN(
      cpu::QuantizedMatrix quantized,
      cpu::QuantizeRtn(scaled.data(), rows, cols, options.format, options.group_size));
  LOOM_ASSIGN_OR_RETURN(cpu::PackedWeight packed, cpu::PackQuantized(quantized));
  std::vector<float> y(n * rows);
  LOOM_RETURN_IF_ERROR(cpu::Matmul({x_scaled.data(), &packed, nullptr, y.data(), n}, pool));
  double sum = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    const double d = static_cast<double>(y[i]) - y_ref[i];
    sum += d * d;
  }
  return sum / static_cast<double>(y.size());
}

}  // namespace

ActivationStats::ActivationStats(int64_t in_features, int64_t max_samples, int64_t sample_every)
    : in_features_(std::max<int64_t>(1, in_features)),
      max_samples_(std::max<int64_t>(0, max_samples)),
      sample_every_(std::max<int64_t>(1, sample_every)),
      abs_sum_(in_features_, 0.0) {}

void ActivationStats::Add(const float* x, int64_t num_tokens) {
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float* row = x + t * in_features_;
    for (int64_t c = 0; c < in_features_; ++c) abs_sum_[c] += std::fabs(row[c]);
    if ((num_tokens_ + t) % sample_every_ == 0 && num_samples() < max_samples_) {
      samples_.insert(samples_.end(), row, row + in_features_);
    }
  }
  num_tokens_ += num_tokens;
}

std::vector<float> ActivationStats::MeanAbs() const {
  std::vector<float> mean(in_features_, 0.0f);
  if (num_tokens_ == 0) return mean;
  for (int64_t c = 0; c < in_features_; ++c) {
    mean[c] = static_cast<float>(abs_sum_[c] / static_cast<double>(num_tokens_));
  }
  return mean;
}

absl::StatusOr<double> ScaledQuantizationError(const float* weight, int64_t rows, int64_t cols,
                                               const float* scales, const float* x, int64_t n,
                                               const AwqOptions& options, cpu::ThreadPool& pool) {
  if (weight == nullptr || x == nullptr || rows <= 0 || cols <= 0 || n <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "quantization error needs a weight and samples (rows %d, cols %d, samples %d)", rows, cols,
        n));
  }
  LOOM_ASSIGN_OR_RETURN(std::vector<float> y_ref, ReferenceOutput(weight, rows, cols, x, n, pool));
  return ErrorAgainst(weight, rows, cols, scales, x, n, y_ref, options, pool);
}

absl::StatusOr<AwqResult> SearchAwqScales(const float* weight, int64_t rows, int64_t cols,
                                          const ActivationStats& stats, const AwqOptions& options,
                                          cpu::ThreadPool& pool) {
  if (stats.in_features() != cols) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "AWQ: the weight has %d input channels, its statistics %d", cols, stats.in_features()));
  }
  const int64_t n = stats.num_samples();
  if (n == 0 || weight == nullptr || rows <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "AWQ: no calibration samples (%d tokens seen) or an empty weight", stats.num_tokens()));
  }
  if (options.grid < 1) {
    return absl::InvalidArgumentError(absl::StrFormat("AWQ: grid %d must be >= 1", options.grid));
  }
  const float* x = stats.samples().data();
  LOOM_ASSIGN_OR_RETURN(std::vector<float> y_ref, ReferenceOutput(weight, rows, cols, x, n, pool));
  std::vector<float> magnitude = stats.MeanAbs();
  for (float& m : magnitude) m = std::max(m, kMinChannelMagnitude);

  AwqResult best;
  best.scales.assign(cols, 1.0f);
  std::vector<float> scales(cols);
  for (int i = 0; i < options.grid; ++i) {
    const double alpha = static_cast<double>(i) / options.grid;
    float lo = 0, hi = 0;
    for (int64_t c = 0; c < cols; ++c) {
      scales[c] = static_cast<float>(std::pow(static_cast<double>(magnitude[c]), alpha));
      lo = c == 0 ? scales[c] : std::min(lo, scales[c]);
      hi = c == 0 ? scales[c] : std::max(hi, scales[c]);
    }
    const float norm = std::sqrt(lo * hi);
    for (float& s : scales) s /= norm;
    LOOM_ASSIGN_OR_RETURN(double error,
                          ErrorAgainst(weight, rows, cols, i == 0 ? nullptr : scales.data(), x, n,
                                       y_ref, options, pool));
    if (i == 0) {
      best.rtn_error = error;
      best.error = error;
      continue;
    }
    if (error < best.error) {
      best.error = error;
      best.alpha = alpha;
      best.scales = scales;
    }
  }
  return best;
}

absl::StatusOr<ClipResult> ClipWeights(float* weight, int64_t rows, int64_t cols, const float* x,
                                       int64_t n, int64_t group_size, int grid, double max_shrink,
                                       cpu::ThreadPool& pool) {
  if (weight == nullptr || x == nullptr || rows <= 0 || n <= 0 || grid < 1 || max_shrink < 0 ||
      max_shrink >= 1 || group_size <= 0 || cols % group_size != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "AWQ clip: bad arguments (rows %d, cols %d, samples %d, group %d, grid %d, max shrink %g)",
        rows, cols, n, group_size, grid, max_shrink));
  }
  // Each group's input covariance C_g = x_gᵀ x_g / n, [groups][g, g], in double.
  const int64_t groups = cols / group_size;
  const int64_t g = group_size;
  std::vector<double> covariance(groups * g * g, 0.0);
  pool.ParallelFor(groups, 1, [&](int64_t begin, int64_t end) {
    for (int64_t gi = begin; gi < end; ++gi) {
      double* c = covariance.data() + gi * g * g;
      for (int64_t t = 0; t < n; ++t) {
        const float* xt = x + t * cols + gi * g;
        for (int64_t i = 0; i < g; ++i) {
          const double xi = xt[i];
          for (int64_t j = 0; j <= i; ++j) c[i * g + j] += xi * xt[j];
        }
      }
      for (int64_t i = 0; i < g; ++i) {
        for (int64_t j = 0; j <= i; ++j) {
          c[i * g + j] /= static_cast<double>(n);
          c[j * g + i] = c[i * g + j];
        }
      }
    }
  });
  const int steps = std::max(1, static_cast<int>(std::lround(max_shrink * grid)));
  std::vector<double> row_error(rows, 0.0), row_unclipped(rows, 0.0);
  std::vector<int64_t> row_clipped(rows, 0);
  std::vector<absl::Status> failures(rows);
  pool.ParallelFor(rows, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> candidate(g), dequantized(g), best(g);
    std::vector<double> diff(g);
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t gi = 0; gi < groups; ++gi) {
        float* w = weight + r * cols + gi * g;
        const double* c = covariance.data() + gi * g * g;
        float lo = w[0], hi = w[0];
        for (int64_t j = 1; j < g; ++j) {
          lo = std::min(lo, w[j]);
          hi = std::max(hi, w[j]);
        }
        double best_error = -1;
        int best_step = 0;
        for (int step = 0; step <= steps; ++step) {
          const float ratio = 1.0f - static_cast<float>(step) / static_cast<float>(grid);
          for (int64_t j = 0; j < g; ++j) candidate[j] = std::clamp(w[j], lo * ratio, hi * ratio);
          absl::StatusOr<cpu::QuantizedMatrix> q =
              cpu::QuantizeRtn(candidate.data(), 1, g, cpu::WeightFormat::kInt4, g);
          if (!q.ok()) {
            failures[r] = q.status();
            return;
          }
          cpu::DequantizeMatrix(*q, dequantized.data());
          for (int64_t j = 0; j < g; ++j) diff[j] = static_cast<double>(dequantized[j]) - w[j];
          double error = 0;
          for (int64_t i = 0; i < g; ++i) {
            double dot = 0;
            for (int64_t j = 0; j < g; ++j) dot += c[i * g + j] * diff[j];
            error += diff[i] * dot;
          }
          if (step == 0) row_unclipped[r] += error;
          if (best_error < 0 || error < best_error) {
            best_error = error;
            best_step = step;
            best = candidate;
          }
        }
        row_error[r] += best_error;
        if (best_step > 0) {
          std::copy(best.begin(), best.end(), w);
          ++row_clipped[r];
        }
      }
    }
  });
  for (const absl::Status& failure : failures) LOOM_RETURN_IF_ERROR(failure);
  ClipResult result;
  for (int64_t r = 0; r < rows; ++r) {
    result.error += row_error[r];
    result.unclipped_error += row_unclipped[r];
    result.clipped_groups += row_clipped[r];
  }
  return result;
}

void ScaleColumns(float* w, int64_t rows, int64_t cols, const float* factors) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) w[r * cols + c] *= factors[c];
  }
}

void DivideRows(float* w, int64_t rows, int64_t cols, const float* divisors) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) w[r * cols + c] /= divisors[r];
  }
}

}  // namespace loom::quant
