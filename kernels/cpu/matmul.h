#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/weights.h"

namespace loom::kernels::cpu {

/// y = x · Wᵀ (+ bias): the projection every linear layer runs.
struct MatmulParams {
  const float* x = nullptr;       // [m, weight->cols], row stride weight->cols
  const PackedWeight* weight = nullptr;  // [n = rows, k = cols]
  const float* bias = nullptr;    // [n] or nullptr
  float* y = nullptr;             // [m, n], row stride n
  int64_t m = 0;                  // activation rows (tokens)
};

/// The fast path: picks the kernel for the weight format and the CPU (AVX-512/VNNI,
/// AVX2/FMA, scalar; chosen once at run time) and splits the work over `pool`.
/// INT8/INT4 weights: the activations are quantized to int8 per 32 columns (round to
/// nearest, scale max|x|/127) and multiplied with integer dot products, so the result
/// differs from MatmulReference by at most sum_j |w_j| * scale_x(j) / 2 plus float
/// rounding. F32/F16 weights: float FMA, float rounding only.
/// InvalidArgument for inconsistent sizes or null pointers (checked before running).
/// Not re-entrant on one pool; `params.y` must not alias `params.x`.
absl::Status Matmul(const MatmulParams& params, ThreadPool& pool);

/// Scalar reference of Matmul: dequantizes and accumulates in double.
absl::Status MatmulReference(const MatmulParams& params);

/// Name of the instruction set Matmul uses on this CPU ("avx512-vnni", "avx2", "scalar").
const char* MatmulIsa();

}  // namespace loom::kernels::cpu
