// The tuning space's launches (prefill_attention_candidates.h): each tiling instantiated for
// head dim 128 with a BF16 cache, query and output, the shape cuda_attention_bench times and
// PyTorch's flash attention is held against, and nothing else, so that the space costs the
// build little.
#include <cuda_bf16.h>

#include <array>

#include "absl/strings/str_format.h"
#include "kernels/cuda/prefill_attention.cuh"
#include "kernels/cuda/prefill_attention_candidates.h"

namespace loom::kernels::cuda {
namespace {

namespace prefill = internal::prefill;
using prefill::Tiling;

template <typename Tile>
absl::Status LaunchBf16(const PagedPrefillParams& p, cudaStream_t stream) {
  return prefill::LaunchKernel<__nv_bfloat16, __nv_bfloat16, 128, __nv_bfloat16, Tile>(
      p, prefill::MakePrefillArgs(p), stream);
}

struct Candidate {
  const char* name;
  absl::Status (*launch)(const PagedPrefillParams&, cudaStream_t);
};

// Registers and spills on sm_90a (nvcc 13, -Xptxas -v) beside each; at most 255 registers a
// thread, so 128-thread blocks fit two a multiprocessor, 256-thread blocks one.
constexpr std::array<Candidate, 7> kCandidates = {{
    // The dispatched tiling: 4 warps x 2 M-tiles (128 rows), 32-token KV tiles.
    {"w4_m2_n32", &LaunchBf16<prefill::DispatchedTiling<128>>},
    // FlashAttention-2's forward tiling at head dim 128 (128 x 64, 4 warps): half the syncs
    // and softmax passes per token, twice the score registers.
    {"w4_m2_n64", &LaunchBf16<Tiling<4, 2, 64>>},
    // 8 warps of one M-tile each (128 rows): more warps to hide latency, each K/V fragment
    // feeding one MMA.
    {"w8_m1_n64", &LaunchBf16<Tiling<8, 1, 64>>},
    // ... held to 128 registers, so that two blocks (16 warps) fit a multiprocessor.
    {"w8_m1_n64_b2", &LaunchBf16<Tiling<8, 1, 64, 2>>},
    {"w8_m1_n32", &LaunchBf16<Tiling<8, 1, 32>>},
    // 8 warps x 2 M-tiles (256 rows): each K/V tile read from L2 for twice the rows.
    {"w8_m2_n32", &LaunchBf16<Tiling<8, 2, 32>>},
    // 4 warps of one M-tile (64 rows): twice the blocks, light registers.
    {"w4_m1_n64", &LaunchBf16<Tiling<4, 1, 64>>},
}};
static_assert(std::is_same_v<prefill::DispatchedTiling<128>, Tiling<4, 2, 32>>,
              "index 0 is the dispatched tiling");

}  // namespace

int PagedPrefillCandidateCount() { return static_cast<int>(kCandidates.size()); }

std::string_view PagedPrefillCandidateName(int index) { return kCandidates[index].name; }

absl::Status LaunchPagedPrefillCandidate(const PagedPrefillParams& p, int index,
                                         cudaStream_t stream) {
  LOOM_RETURN_IF_ERROR(CheckPagedPrefillParams(p));
  if (index < 0 || index >= PagedPrefillCandidateCount()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "PagedPrefill candidate %d: not in [0, %d)", index, PagedPrefillCandidateCount()));
  }
  if (p.cache.head_dim != 128 || p.cache.quant != KvQuant::kNone ||
      p.cache.dtype != DataType::kBF16 || p.out_dtype != DataType::kBF16) {
    return absl::InvalidArgumentError(
        "PagedPrefill candidate: head dim 128 with a BF16 cache and output only");
  }
  if (p.num_seqs == 0) return absl::OkStatus();
  return kCandidates[index].launch(p, stream);
}

}  // namespace loom::kernels::cuda
