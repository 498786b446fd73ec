#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/weights.h"

namespace loom::kernels::cpu {

/// How the weights meet the activations. kF32 and kInt8 concern INT8/INT4 weights only (F32/F16
/// weights always use float x); kBf16 concerns every weight format.
enum class ActivationPrecision {
  // Exact float activations: weights are dequantized to float (in registers; for
  // batches of tokens once per call) and multiplied with float FMA ("W4A32" / "W8A32");
  // float rounding only. The default.
  kF32,
  // Activations quantized to int8 per 32 columns (round to nearest, scale max|x|/127)
  // and multiplied with integer dot products (VNNI): faster GEMM, but the result differs
  // from MatmulReference by up to sum_j |w_j| * scale_x(j) / 2.
  kInt8,
  // Activations and weights (any format, dequantized) rounded to BF16, products summed in
  // F32 on Intel AMX tiles (matmul_bf16act_amx.cc): what PyTorch and vLLM's CPU backend
  // compute for a BF16 model, at several times kF32's speed for batches of tokens. Needs
  // AMX-BF16 (ActivationPrecisionStatus); MatmulReference rounds its inputs the same way.
  kBf16,
};

/// "f32" / "int8" / "bf16" (the spelling of the --activations flags) and back.
/// InvalidArgument naming the choices for anything else.
absl::StatusOr<ActivationPrecision> ParseActivationPrecision(absl::string_view name);
const char* ActivationPrecisionName(ActivationPrecision precision);

/// OK when Matmul can run `precision` here: kBf16 needs a CPU with AMX-BF16 and AVX-512 BF16,
/// the kernel's permission for the tile state, and LOOM_CPU_ISA not capped below amx;
/// FailedPrecondition saying which is missing otherwise. Every other precision: OK.
absl::Status ActivationPrecisionStatus(ActivationPrecision precision);

/// y = x · Wᵀ (+ bias): the projection every linear layer runs.
struct MatmulParams {
  const float* x = nullptr;       // [m, weight->cols], row stride weight->cols
  const PackedWeight* weight = nullptr;  // [n = rows, k = cols]
  const float* bias = nullptr;    // [n] or nullptr
  float* y = nullptr;             // [m, n], row stride n
  int64_t m = 0;                  // activation rows (tokens)
  // INT8/INT4 weights only; ignored for F32/F16 weights.
  ActivationPrecision activations = ActivationPrecision::kF32;
};

/// The fast path: picks the kernel for the weight format, `params.activations` and the
/// CPU (AVX-512/VNNI, AVX2/FMA, scalar; chosen once at run time) and splits the work
/// over `pool`. With float activations (F32/F16 weights, or INT8/INT4 with kF32) the
/// result differs from MatmulReference by float rounding only; with kInt8 see above.
/// InvalidArgument for inconsistent sizes or null pointers (checked before running).
/// Not re-entrant on one pool; `params.y` must not alias `params.x`.
absl::Status Matmul(const MatmulParams& params, ThreadPool& pool);

/// Scalar reference of Matmul: dequantizes and accumulates in double (kBf16: the dequantized
/// weights and x rounded to BF16 first, to nearest even; on any CPU).
absl::Status MatmulReference(const MatmulParams& params);

/// Name of the instruction set Matmul uses on this CPU ("avx512-vnni+amx", "avx512-vnni",
/// "avx2", "scalar").
const char* MatmulIsa();

}  // namespace loom::kernels::cpu
