#include "kernels/cpu/cpu_isa.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/cpu/activation.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_internal.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/weights.h"

namespace loom::kernels::cpu {
namespace {

using internal::MatmulIsaChoice;

MatmulIsaChoice ToChoice(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAmx:  // AVX-512's kernels, AMX inside the int8-activation GEMM
    case CpuIsa::kAvx512:
      return MatmulIsaChoice::kAvx512;
    case CpuIsa::kAvx2:
      return MatmulIsaChoice::kAvx2;
    case CpuIsa::kScalar:
      break;
  }
  return MatmulIsaChoice::kScalar;
}

TEST(CpuIsaTest, ParsesEveryNameTheCpuRuns) {
  EXPECT_EQ(*CpuIsaFromValue(""), BestCpuIsa());
  for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAmx}) {
    absl::StatusOr<CpuIsa> parsed = CpuIsaFromValue(CpuIsaName(isa));
    if (CpuSupportsIsa(isa)) {
      ASSERT_TRUE(parsed.ok()) << parsed.status();
      EXPECT_EQ(*parsed, isa);
      EXPECT_LE(static_cast<int>(isa), static_cast<int>(BestCpuIsa()));
    } else {
      EXPECT_EQ(parsed.status().code(), absl::StatusCode::kFailedPrecondition);
      EXPECT_NE(std::string(parsed.status().message()).find("cannot run"), std::string::npos)
          << parsed.status();
    }
  }
  if (CpuSupportsIsa(CpuIsa::kAvx2)) {
    EXPECT_EQ(*CpuIsaFromValue(" AVX2 "), CpuIsa::kAvx2);
  }
  EXPECT_TRUE(CpuSupportsIsa(CpuIsa::kScalar));
}

TEST(CpuIsaTest, RefusesUnknownNamesNamingTheChoices) {
  for (const char* value : {"avx", "avx-512", "sse4", "native", "1"}) {
    absl::StatusOr<CpuIsa> parsed = CpuIsaFromValue(value);
    ASSERT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << value;
    EXPECT_NE(std::string(parsed.status().message()).find("scalar, avx2, avx512 or amx"),
              std::string::npos)
        << parsed.status();
  }
}

// The ISA LOOM_CPU_ISA names (ctest runs this binary under each one the CPU has) is the
// one every dispatch point uses, and nothing above it is offered.
TEST(CpuIsaTest, ForcedIsaIsTheOneTheKernelsRun) {
  // First: a value the CPU cannot run (or an unknown one) ends the process here, with the
  // refusal on stderr (the ctest entries under LOOM_CPU_ISA match it).
  const CpuIsa active = ActiveCpuIsa();
  const char* env = std::getenv("LOOM_CPU_ISA");
  absl::StatusOr<CpuIsa> parsed = CpuIsaFromValue(env == nullptr ? "" : env);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const CpuIsa expected = *parsed;
  ASSERT_EQ(active, expected);
  EXPECT_EQ(internal::IsaSupported(MatmulIsaChoice::kAvx2), expected >= CpuIsa::kAvx2);
  EXPECT_EQ(internal::IsaSupported(MatmulIsaChoice::kAvx512), expected >= CpuIsa::kAvx512);
  EXPECT_EQ(internal::AmxInUse(), expected == CpuIsa::kAmx);
  const std::string reported = MatmulIsa();
  EXPECT_EQ(reported, expected == CpuIsa::kAmx      ? "avx512-vnni+amx"
                      : expected == CpuIsa::kAvx512 ? "avx512-vnni"
                                                    : CpuIsaName(expected));

  // One matmul per weight format and activation precision: each ran the forced ISA.
  ThreadPool pool(2);
  const int64_t n = 48, k = 128;
  std::vector<float> w(n * k), x(3 * k), y(3 * n);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>((i * 7) % 13) - 6.0f;
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 5) % 11) - 5.0f;
  for (WeightFormat format :
       {WeightFormat::kF32, WeightFormat::kF16, WeightFormat::kInt8, WeightFormat::kInt4,
        WeightFormat::kInt5}) {
    absl::StatusOr<PackedWeight> packed = PackFromF32(w.data(), n, k, format, 32);
    ASSERT_TRUE(packed.ok()) << packed.status();
    for (ActivationPrecision precision : {ActivationPrecision::kF32, ActivationPrecision::kInt8}) {
      for (int64_t m : {1, 3}) {
        ASSERT_TRUE(Matmul({x.data(), &*packed, nullptr, y.data(), m, precision}, pool).ok());
        EXPECT_EQ(internal::LastMatmulIsa(), ToChoice(expected));
      }
    }
  }
}

// ctest's kernels/isa_* entries force an ISA below the best (tests/CMakeLists.txt) and set
// LOOM_SKIP_IF_BEST_ISA: where the forced ISA is this CPU's best (AVX2 on an AVX2-only CPU),
// the plain run has just run the same kernels, so the entry says so and stops (ctest reads
// the line as a skip).
class SkipTheBestIsaAgain : public testing::Environment {
 public:
  void SetUp() override {
    if (std::getenv("LOOM_SKIP_IF_BEST_ISA") == nullptr || ActiveCpuIsa() != BestCpuIsa()) return;
    std::printf("LOOM_CPU_ISA=%s is this CPU's best: the plain run covers it\n",
                std::string(CpuIsaName(ActiveCpuIsa())).c_str());
    std::fflush(stdout);
    std::exit(0);
  }
};

[[maybe_unused]] testing::Environment* const skip_the_best_isa_again =
    testing::AddGlobalTestEnvironment(new SkipTheBestIsaAgain);

}  // namespace
}  // namespace loom::kernels::cpu
