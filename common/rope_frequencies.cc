#include "common/rope_frequencies.h"

#include <algorithm>
#include <cmath>

namespace loom::common {
namespace {

// YaRN: the (fractional) dimension index whose wavelength fits `rotations` times into
// `context` positions.
double YarnCorrectionDim(double rotations, double rope_dim, double base, double context) {
  return rope_dim * std::log(context / (rotations * 2.0 * M_PI)) / (2.0 * std::log(base));
}

// YaRN's blend of inv_freq / factor (interpolation, long wavelengths) and inv_freq
// (extrapolation, short wavelengths): frequency pair i below `low` keeps its frequency,
// above `high` is divided by the factor, linear in between.
double YarnFrequency(const ModelConfig& config, int64_t i, double freq) {
  const double rope_dim = static_cast<double>(config.rope_dim);
  const double context = static_cast<double>(config.rope_original_context_length);
  double low = YarnCorrectionDim(config.rope_yarn_beta_fast, rope_dim, config.rope_theta, context);
  double high = YarnCorrectionDim(config.rope_yarn_beta_slow, rope_dim, config.rope_theta, context);
  if (config.rope_yarn_truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, rope_dim - 1.0);
  if (low == high) high += 0.001;  // as transformers: no division by zero
  const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
  const double extrapolation = 1.0 - ramp;
  return freq / config.rope_scaling_factor * (1.0 - extrapolation) + freq * extrapolation;
}

}  // namespace

std::vector<float> RopeInverseFrequencies(const ModelConfig& config,
                                          const std::vector<float>& freq_factors) {
  const int64_t half = config.rope_dim / 2;
  std::vector<float> inv_freq(half);
  for (int64_t i = 0; i < half; ++i) {
    double freq = std::pow(config.rope_theta, -2.0 * i / static_cast<double>(config.rope_dim));
    // As llama.cpp: per-frequency factors (llama3 GGUFs store them as a tensor) and
    // linear scaling both apply; llama3 scaling is computed only when no tensor exists.
    if (!freq_factors.empty()) freq /= freq_factors[i];
    if (config.rope_scaling == RopeScalingType::kLinear) {
      freq /= config.rope_scaling_factor;
    } else if (config.rope_scaling == RopeScalingType::kYarn) {
      freq = YarnFrequency(config, i, freq);
    } else if (config.rope_scaling == RopeScalingType::kLlama3 && freq_factors.empty()) {
      // Llama 3.1: long wavelengths are slowed by the factor, short ones kept, with a
      // smooth blend between the two thresholds.
      const double original = static_cast<double>(config.rope_original_context_length);
      const double low_wavelen = original / config.rope_low_freq_factor;
      const double high_wavelen = original / config.rope_high_freq_factor;
      const double wavelen = 2.0 * M_PI / freq;
      if (wavelen > low_wavelen) {
        freq /= config.rope_scaling_factor;
      } else if (wavelen >= high_wavelen) {
        const double smooth = (original / wavelen - config.rope_low_freq_factor) /
                              (config.rope_high_freq_factor - config.rope_low_freq_factor);
        freq = (1.0 - smooth) * freq / config.rope_scaling_factor + smooth * freq;
      }
    }
    inv_freq[i] = static_cast<float>(freq);
  }
  return inv_freq;
}

std::vector<float> LocalRopeInverseFrequencies(const ModelConfig& config) {
  if (config.local_rope_theta <= 0.0) return {};
  ModelConfig local = config;
  local.rope_theta = config.local_rope_theta;
  local.rope_scaling = RopeScalingType::kNone;
  return RopeInverseFrequencies(local, {});
}

}  // namespace loom::common
