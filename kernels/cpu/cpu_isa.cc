#include "kernels/cpu/cpu_isa.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"

namespace loom::kernels::cpu {

const char* CpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx512:
      return "avx512";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kScalar:
      break;
  }
  return "scalar";
}

bool CpuSupportsIsa(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar:
      return true;
    case CpuIsa::kAvx2:
#if defined(__x86_64__)
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
#else
      return false;
#endif
    case CpuIsa::kAvx512:
#if defined(__x86_64__)
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
             CpuSupportsIsa(CpuIsa::kAvx2);
#else
      return false;
#endif
  }
  return false;
}

CpuIsa BestCpuIsa() {
  static const CpuIsa best = [] {
    if (CpuSupportsIsa(CpuIsa::kAvx512)) return CpuIsa::kAvx512;
    if (CpuSupportsIsa(CpuIsa::kAvx2)) return CpuIsa::kAvx2;
    return CpuIsa::kScalar;
  }();
  return best;
}

absl::StatusOr<CpuIsa> CpuIsaFromValue(absl::string_view value) {
  const std::string name = absl::AsciiStrToLower(absl::StripAsciiWhitespace(value));
  if (name.empty()) return BestCpuIsa();
  CpuIsa isa;
  if (name == "scalar") {
    isa = CpuIsa::kScalar;
  } else if (name == "avx2") {
    isa = CpuIsa::kAvx2;
  } else if (name == "avx512") {
    isa = CpuIsa::kAvx512;
  } else {
    return absl::InvalidArgumentError(absl::StrFormat(
        "LOOM_CPU_ISA='%s' is not an instruction set: use scalar, avx2 or avx512 (or leave "
        "it unset for the best this CPU runs, %s)",
        value, CpuIsaName(BestCpuIsa())));
  }
  if (!CpuSupportsIsa(isa)) {
    return absl::FailedPreconditionError(
        absl::StrFormat("LOOM_CPU_ISA=%s: this CPU cannot run it (the best it runs is %s)", name,
                        CpuIsaName(BestCpuIsa())));
  }
  return isa;
}

absl::StatusOr<CpuIsa> CpuIsaFromEnvironment() {
  const char* value = std::getenv("LOOM_CPU_ISA");
  return CpuIsaFromValue(value == nullptr ? "" : value);
}

CpuIsa ActiveCpuIsa() {
  static const CpuIsa active = [] {
    absl::StatusOr<CpuIsa> isa = CpuIsaFromEnvironment();
    if (!isa.ok()) {
      std::fprintf(stderr, "loom: refusing to run the CPU kernels: %s\n",
                   std::string(isa.status().message()).c_str());
      std::fflush(stderr);
      std::exit(2);
    }
    return *isa;
  }();
  return active;
}

}  // namespace loom::kernels::cpu
