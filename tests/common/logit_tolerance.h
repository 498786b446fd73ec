#ifndef LOOM_TESTS_COMMON_LOGIT_TOLERANCE_H_
#define LOOM_TESTS_COMMON_LOGIT_TOLERANCE_H_

// How far a low-precision forward pass (the CUDA forward pass and device: F16 or BF16 GEMM
// inputs, K/V and attention probabilities, F32 accumulation) may move a row of logits from
// the F32 CPU reference, derived from the dtype's unit roundoff and the model's depth, and
// the error measure the CUDA tests share (tests/worker/cuda_forward_pass_test.cc,
// tests/model/cuda_device_test.cc).

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace loom::tolerance {

// Unit roundoff (half an ulp of 1) of the GPU activation dtypes: F16 keeps 11 significant
// bits, BF16 8.
inline constexpr double kF16UnitRoundoff = 0x1p-11;  // 4.9e-4
inline constexpr double kBf16UnitRoundoff = 0x1p-8;  // 3.9e-3

struct LogitTolerance {
  double rel_rms = 0;  // RMS of the difference over the RMS spread of the reference row
  double rel_max = 0;  // the largest difference over the reference row's range (max - min)
};

// Each layer rounds its GEMM inputs, K/V and attention probabilities to the dtype (each a
// relative error of at most u) and adds the result to the F32 residual stream, and the LM
// head rounds once more: L + 1 stages whose errors add, at worst linearly with depth. The
// H100 measured (bench/results/gpu/2026-11-26-h100*, F16, random 2- and 3-layer models of
// MatchesCpuForwardPassOnRandomModels): relative RMS 0.0005 (2 layers; 1.0u) and 0.0008
// (3 layers; 1.6u), max/range 0.0001 (2 layers; 0.2u) and 0.0005 (3 layers; 1.0u). Growth
// factors of 2 (RMS) and 1 (max/range) per stage put the limits at 5-6x the RMS and 4x the
// 3-layer max measured: 2u(L + 1) and u(L + 1). For F16 and L = 2 / 3: RMS 2.9e-3 / 3.9e-3,
// max 1.5e-3 / 2.0e-3; BF16 is 8x. What bugs do to a 2-layer model's logits (on the CPU,
// CudaDeviceGraphTest.MutatedGraphExceedsTheTolerance): a decode token's RoPE position one
// early, relative RMS 0.086-0.095 (~30x the F16 limit); its K/V one slot off, 0.17 (~60x);
// one layer's RMSNorm 2% off, 0.023 (8x; 1% off: 4x, which the former 5e-2 passed).
inline LogitTolerance LowPrecisionLogitTolerance(double unit_roundoff, int64_t layers) {
  const double stages = static_cast<double>(layers + 1);
  return {2.0 * unit_roundoff * stages, unit_roundoff * stages};
}

struct LogitRowError {
  double rel_rms = 0;   // as LogitTolerance::rel_rms
  double rel_max = 0;   // as LogitTolerance::rel_max
  double max_diff = 0;  // the largest absolute difference
};

// One row of `vocab` logits against the reference row. A non-finite logit gives NaN
// figures, which fail every `<=` comparison.
inline LogitRowError CompareLogitRow(const float* reference, const float* got, int64_t vocab) {
  double mean = 0, lo = reference[0], hi = reference[0];
  for (int64_t v = 0; v < vocab; ++v) {
    mean += reference[v];
    lo = std::min<double>(lo, reference[v]);
    hi = std::max<double>(hi, reference[v]);
  }
  mean /= static_cast<double>(vocab);
  double spread = 0, diff2 = 0, max_diff = 0;
  for (int64_t v = 0; v < vocab; ++v) {
    const double d = static_cast<double>(got[v]) - reference[v];
    spread += (reference[v] - mean) * (reference[v] - mean);
    diff2 += d * d;
    max_diff = std::isfinite(d) ? std::max(max_diff, std::abs(d)) : NAN;
  }
  LogitRowError error;
  error.rel_rms = std::sqrt(diff2 / static_cast<double>(vocab)) /
                  std::max(std::sqrt(spread / static_cast<double>(vocab)), 1e-6);
  error.rel_max = max_diff / std::max(hi - lo, 1e-6);
  error.max_diff = max_diff;
  return error;
}

}  // namespace loom::tolerance

#endif  // LOOM_TESTS_COMMON_LOGIT_TOLERANCE_H_
