// The tuning space's launches (quantized_gemm_candidates.h): each candidate instantiated for F16
// activations with INT4 weights in groups of 128 and INT8 weights per channel, the two forms
// quantized_gemm_bench times, and nothing else, so that the space costs the build little.
#include <array>
#include <utility>

#include "absl/strings/str_format.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/quantized_gemm.cuh"
#include "kernels/cuda/quantized_gemm_candidates.h"
#include "kernels/cuda/quantized_gemm_internal.h"

namespace loom::kernels::cuda {
namespace {

using internal::kQuantGemmCandidateBase;
using internal::kQuantGemmCandidates;
using internal::kNumQuantGemmCandidates;
constexpr QuantScaleType kF16 = QuantScaleType::kF16;

template <bool kInt4, int kGroup, int kConfig>
absl::Status RunIfFits(const QuantGemmParams& p, int splits, cudaStream_t stream) {
  if constexpr (internal::qgemm::Shape<kInt4, kGroup, kF16, kConfig>::kFits) {
    return internal::qgemm::RunQuantGemm<__half, kInt4, kGroup, kF16, kConfig>(p, splits, stream);
  } else {
    return absl::UnimplementedError(
        absl::StrFormat("QuantGemm candidate %s: its %s pipeline does not fit 99 KiB",
                        internal::QuantGemmConfigAt(kConfig).name, kInt4 ? "INT4" : "INT8"));
  }
}

using Launch = absl::Status (*)(const QuantGemmParams&, int, cudaStream_t);

// Per candidate index: its launch, and whether it fits, in one format.
template <bool kInt4, int kGroup, int... kIndex>
constexpr std::array<Launch, sizeof...(kIndex)> Launches(std::integer_sequence<int, kIndex...>) {
  return {&RunIfFits<kInt4, kGroup, kQuantGemmCandidateBase + kIndex>...};
}
template <bool kInt4, int kGroup, int... kIndex>
constexpr std::array<bool, sizeof...(kIndex)> Fits(std::integer_sequence<int, kIndex...>) {
  return {internal::qgemm::Shape<kInt4, kGroup, kF16, kQuantGemmCandidateBase + kIndex>::kFits...};
}
using Indices = std::make_integer_sequence<int, kNumQuantGemmCandidates>;

}  // namespace

int QuantGemmCandidateCount() { return kNumQuantGemmCandidates; }

QuantGemmTile QuantGemmCandidateTile(int index) {
  const internal::QuantGemmConfig& c = kQuantGemmCandidates[index];
  return {c.name, c.block_m(), c.block_n(), c.step_k(), c.threads()};
}

int QuantGemmCandidateSplits(int index, int64_t m, int64_t n, int64_t k, int num_sms) {
  return internal::QuantGemmSplitsFor(kQuantGemmCandidates[index], m, n, k, num_sms);
}

absl::Status LaunchQuantGemmCandidate(const QuantGemmParams& p, int index, cudaStream_t stream) {
  LOOM_RETURN_IF_ERROR(CheckQuantGemmParams(p));
  if (index < 0 || index >= kNumQuantGemmCandidates) {
    return absl::InvalidArgumentError(
        absl::StrFormat("QuantGemm candidate %d: not in [0, %d)", index, kNumQuantGemmCandidates));
  }
  const bool int4 = p.format == QuantWeightFormat::kInt4;
  if (p.act_dtype != DataType::kF16 || p.scale_type != kF16 ||
      (int4 ? p.group_size != 128 : QuantGemmGrouped(p))) {
    return absl::InvalidArgumentError(
        "QuantGemm candidate: F16 activations with INT4 in groups of 128 or INT8 per channel only");
  }
  if (!(int4 ? Fits<true, 128>(Indices{}) : Fits<false, 0>(Indices{}))[index]) {
    return absl::UnimplementedError(
        absl::StrFormat("QuantGemm candidate %s: its %s pipeline does not fit 99 KiB",
                        kQuantGemmCandidates[index].name, int4 ? "INT4" : "INT8"));
  }
  if (p.m == 0) return absl::OkStatus();
  LOOM_ASSIGN_OR_RETURN(const int splits,
                        internal::PlanQuantGemmSplits(p, kQuantGemmCandidates[index]));
  return (int4 ? Launches<true, 128>(Indices{}) : Launches<false, 0>(Indices{}))[index](p, splits,
                                                                                     stream);
}

}  // namespace loom::kernels::cuda
