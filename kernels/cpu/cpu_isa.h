#pragma once

// The instruction set the CPU kernels run: the best this CPU supports, or the one named by
// the environment variable LOOM_CPU_ISA (scalar, avx2, avx512, amx), so that every ISA path can
// be tested and benchmarked on any machine that has it. Read once, at the first kernel
// call; every dispatch point (matmul, activation quantization, SiLU·mul, paged attention
// and its vector math) asks ActiveCpuIsa(), so a forced ISA makes the process behave as on
// a CPU that has nothing above it.

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace loom::kernels::cpu {

/// Ordered: each ISA implies the ones below it.
enum class CpuIsa {
  kScalar = 0,
  kAvx2 = 1,    // AVX2 + FMA + F16C
  kAvx512 = 2,  // AVX-512 F/BW/VL + VNNI
  // kAvx512 + AMX-TILE and AMX-INT8, with the kernel's permission to use the tile data
  // (Linux arch_prctl ARCH_REQ_XCOMP_PERM, requested by CpuSupportsIsa). Only the
  // int8-activation GEMM of batches differs (kernels/cpu/matmul_int8act_gemm_amx.cc): it
  // gives the AVX-512 kernels' bits, so kAmx and kAvx512 compute the same results.
  kAmx = 3,
};

/// "scalar", "avx2", "avx512", "amx": the spelling LOOM_CPU_ISA takes.
const char* CpuIsaName(CpuIsa isa);

/// True when this CPU can run `isa` (cpuid, and for kAmx the kernel's permission, asked
/// for once per process; ignores LOOM_CPU_ISA).
bool CpuSupportsIsa(CpuIsa isa);

/// The best ISA this CPU can run (ignores LOOM_CPU_ISA).
CpuIsa BestCpuIsa();

/// The ISA for a LOOM_CPU_ISA value: an empty value means BestCpuIsa(). InvalidArgument
/// naming the choices for an unknown value; FailedPrecondition when this CPU cannot run
/// the named ISA.
absl::StatusOr<CpuIsa> CpuIsaFromValue(absl::string_view value);

/// CpuIsaFromValue(getenv("LOOM_CPU_ISA")), read now.
absl::StatusOr<CpuIsa> CpuIsaFromEnvironment();

/// The ISA the kernels use, fixed at the first call from CpuIsaFromEnvironment(). A value
/// the CPU cannot run, or an unknown one, is refused: the error is printed to stderr and
/// the process exits with status 2 (kernels have no caller to return it to; loom-worker
/// reports the ISA at start-up, so it exits there, before serving).
CpuIsa ActiveCpuIsa();

}  // namespace loom::kernels::cpu
