#pragma once

#include <vector>

#include "common/formats/model_config.h"

namespace loom::common {

/// Inverse frequencies of RoPE for `config`, [rope_dim / 2]: theta^(-2i/rope_dim) with the
/// config's scaling applied (linear: divided by the factor; llama3: Llama 3.1's smooth
/// blend; yarn: transformers' `_compute_yarn_parameters`, a linear ramp between
/// interpolated and extrapolated frequencies over the dimensions whose number of rotations
/// in the original context lies between beta_slow and beta_fast), divided elementwise by
/// `freq_factors` when non-empty (the `rope_freqs.weight` tensor of llama3 GGUFs, which
/// replaces computed llama3 scaling). YaRN's attention factor is
/// `config.rope_attention_factor`, applied by the RoPE kernels. Thread-safe (pure).
std::vector<float> RopeInverseFrequencies(const ModelConfig& config,
                                          const std::vector<float>& freq_factors);

/// The inverse frequencies of local (sliding-window) layers that rotate with their own base
/// `config.local_rope_theta` and no scaling (Gemma 3); empty when every layer rotates alike.
std::vector<float> LocalRopeInverseFrequencies(const ModelConfig& config);

}  // namespace loom::common
