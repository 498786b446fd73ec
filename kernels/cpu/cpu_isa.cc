#include "kernels/cpu/cpu_isa.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"

namespace loom::kernels::cpu {
namespace {

// Linux grants a process the AMX tile data (8 KiB of extra XSAVE state per thread) only
// on request; an AMX instruction without it is SIGILL. Asked once; the grant covers every
// thread of the process.
bool AmxPermitted() {
#if defined(__linux__) && defined(__x86_64__)
  static const bool permitted = [] {
    constexpr long kArchReqXcompPerm = 0x1023;
    constexpr long kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return permitted;
#else
  return false;
#endif
}

}  // namespace

const char* CpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAmx:
      return "amx";
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
    case CpuIsa::kAmx:
#if defined(__x86_64__)
      return CpuSupportsIsa(CpuIsa::kAvx512) && __builtin_cpu_supports("amx-tile") &&
             __builtin_cpu_supports("amx-int8") && AmxPermitted();
#else
      return false;
#endif
  }
  return false;
}

CpuIsa BestCpuIsa() {
  static const CpuIsa best = [] {
    if (CpuSupportsIsa(CpuIsa::kAmx)) return CpuIsa::kAmx;
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
  } else if (name == "amx") {
    isa = CpuIsa::kAmx;
  } else {
    return absl::InvalidArgumentError(absl::StrFormat(
        "LOOM_CPU_ISA='%s' is not an instruction set: use scalar, avx2, avx512 or amx (or leave "
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
