// Speculative verification: one block of kThreads per sequence, walking its rows in
// order; every row a block-wide sweep over the vocabulary (argmax for greedy rows, the
// residual's inverse CDF for the first rejection or the bonus row of sampled ones).
// All control flow after a reduction is uniform over the block: every thread reads the
// same scalars and reduced values.
#include <cstdint>

#include "common/status_macros.h"
#include "kernels/cuda/block_argmax.cuh"
#include "kernels/cuda/launch_internal.cuh"
#include "kernels/cuda/speculative_verify.h"

namespace loom::kernels::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFullMask = 0xffffffffu;

struct VerifyArgs {
  const float* target_probs;
  const float* draft_probs;
  const int32_t* draft_tokens;
  const float* uniforms;
  const float* sample_uniforms;
  const int32_t* row_start;
  const uint8_t* greedy;
  int64_t num_rows;
  int num_seqs;
  int vocab;
  int32_t* num_accepted;
  int32_t* next_token;
};

struct SharedState {
  double sums[kWarps];
  float best_value[kWarps];
  int best_index[kWarps];
  int found;
};

__device__ int BlockArgmax(const float* row, int vocab, SharedState& shared) {
  float value = 0.0f;
  int index = -1;
  for (int i = threadIdx.x; i < vocab; i += kThreads) {
    if (internal::ArgmaxBetter(row[i], i, value, index)) {
      value = row[i];
      index = i;
    }
  }
  internal::BlockArgmax<kWarps>(value, index, shared.best_value, shared.best_index);
  return index;
}

// Inclusive prefix sum over the warp, in a fixed shuffle order.
__device__ __forceinline__ double WarpInclusiveScan(double value) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int offset = 1; offset < 32; offset <<= 1) {
    const double below = __shfl_up_sync(kFullMask, value, offset);
    if (lane >= offset) value += below;
  }
  return value;
}

// The inverse CDF of the unnormalised weights weight(0 .. n-1) (each >= 0, in double) at
// u * total: the smallest i whose running sum exceeds u * total, or -1 when the total is
// 0. Warp w owns the contiguous segment [w * segment, ...), scanned 32 ids at a time; the
// running sum at id i is base(w) + (segment sum of earlier tiles + tile prefix), and
// base(w + 1) = base(w) + segment(w) in warp order. Both passes add in the same order,
// so the running sum is monotone, ends exactly at the total, and does not depend on
// thread timing.
template <typename Weight>
__device__ int DrawInverseCdf(int n, double u, Weight weight, SharedState& shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int segment = ((n + kWarps - 1) / kWarps + 31) / 32 * 32;
  const int begin = warp * segment;
  const int end = min(n, begin + segment);
  double running = 0.0;
  for (int tile = begin; tile < end; tile += 32) {
    const int i = tile + lane;
    const double inclusive = WarpInclusiveScan(i < end ? weight(i) : 0.0);
    running += __shfl_sync(kFullMask, inclusive, 31);
  }
  if (lane == 0) shared.sums[warp] = running;
  if (threadIdx.x == 0) shared.found = -1;
  __syncthreads();
  double base = 0.0, total = 0.0;
  for (int w = 0; w < kWarps; ++w) {
    if (w == warp) base = total;
    total += shared.sums[w];
  }
  const double segment_total = shared.sums[warp];
  const double target = u * total;  // < total for u < 1
  // The one warp whose segment holds the target (none when the total is 0).
  if (total > 0.0 && target >= base && target < base + segment_total) {
    running = 0.0;
    for (int tile = begin; tile < end; tile += 32) {
      const int i = tile + lane;
      const double w = i < end ? weight(i) : 0.0;
      const double inclusive = WarpInclusiveScan(w);
      const bool hit = w > 0.0 && target < base + (running + inclusive);
      const unsigned hits = __ballot_sync(kFullMask, hit);
      if (hits != 0) {
        if (lane == __ffs(hits) - 1) shared.found = i;
        break;
      }
      running += __shfl_sync(kFullMask, inclusive, 31);
    }
  }
  __syncthreads();
  const int found = shared.found;
  __syncthreads();  // `found` and `sums` are rewritten by the next call
  return found;
}

__global__ void __launch_bounds__(kThreads) SpeculativeVerifyKernel(VerifyArgs args) {
  __shared__ SharedState shared;
  const int seq = blockIdx.x;
  const int64_t vocab = args.vocab;
  const int64_t first_row = args.row_start[seq];
  const int64_t end_row = args.row_start[seq + 1];
  // A device row_start that disagrees with the validated host copy: no reads outside
  // (every other sequence needs a row, so these bounds keep the draft rows inside too).
  const bool rows_ok = first_row >= seq && end_row > first_row &&
                       end_row + (args.num_seqs - seq - 1) <= args.num_rows;
  const int k = rows_ok ? static_cast<int>(end_row - first_row - 1) : 0;
  const int64_t first_draft = first_row - seq;
  bool bad = !rows_ok;
  for (int i = threadIdx.x; i < k && !bad; i += kThreads) {
    const int32_t token = args.draft_tokens[first_draft + i];
    bad = token < 0 || token >= vocab;
  }
  if (__syncthreads_or(bad)) {
    if (threadIdx.x == 0) {
      args.num_accepted[seq] = -1;
      args.next_token[seq] = -1;
    }
    return;
  }

  const bool greedy = args.greedy[seq] != 0;
  int accepted = 0;
  int next = -1;
  for (; accepted < k; ++accepted) {
    const float* target = args.target_probs + (first_row + accepted) * vocab;
    const int32_t x = args.draft_tokens[first_draft + accepted];
    if (greedy) {
      const int best = BlockArgmax(target, args.vocab, shared);
      if (x != best) {
        next = best;
        break;
      }
      continue;
    }
    const float* draft =
        args.draft_probs != nullptr ? args.draft_probs + (first_draft + accepted) * vocab : nullptr;
    const double px = target[x];
    const double qx = draft != nullptr ? static_cast<double>(draft[x]) : 1.0;
    // u < p / q as u * q < p, in double: the float product is exact, as on the CPU.
    if (static_cast<double>(args.uniforms[first_row + accepted]) * qx < px) continue;
    const double u = args.sample_uniforms != nullptr ? args.sample_uniforms[first_row + accepted]
                                                     : args.uniforms[first_row + k];
    next = DrawInverseCdf(
        args.vocab, u,
        [&](int v) {
          const double q = draft != nullptr ? static_cast<double>(draft[v]) : (v == x ? 1.0 : 0.0);
          return fmax(0.0, static_cast<double>(target[v]) - q);
        },
        shared);
    // p <= q everywhere (p == q up to rounding): any token of p, as the CPU.
    if (next < 0) {
      next = DrawInverseCdf(
          args.vocab, u, [&](int v) { return static_cast<double>(target[v]); }, shared);
    }
    break;
  }
  if (accepted == k) {
    const float* bonus = args.target_probs + (first_row + k) * vocab;
    if (greedy) {
      next = BlockArgmax(bonus, args.vocab, shared);
    } else {
      const double u = args.sample_uniforms != nullptr ? args.sample_uniforms[first_row + k]
                                                       : args.uniforms[first_row + k];
      next = DrawInverseCdf(
          args.vocab, u, [&](int v) { return static_cast<double>(bonus[v]); }, shared);
    }
  }
  if (threadIdx.x == 0) {
    args.num_accepted[seq] = accepted;
    args.next_token[seq] = next;
  }
}

}  // namespace

absl::Status LaunchSpeculativeVerify(const SpeculativeVerifyParams& p, cudaStream_t stream) {
  LOOM_RETURN_IF_ERROR(CheckSpeculativeVerifyParams(p));
  if (p.num_seqs == 0) return absl::OkStatus();
  VerifyArgs args{};
  args.target_probs = p.target_probs;
  args.draft_probs = p.draft_probs;
  args.draft_tokens = p.draft_tokens;
  args.uniforms = p.uniforms;
  args.sample_uniforms = p.sample_uniforms;
  args.row_start = p.row_start;
  args.greedy = p.greedy;
  args.num_rows = p.row_start_host[p.num_seqs];
  args.num_seqs = static_cast<int>(p.num_seqs);
  args.vocab = static_cast<int>(p.vocab);
  args.num_accepted = p.num_accepted;
  args.next_token = p.next_token;
  SpeculativeVerifyKernel<<<static_cast<unsigned>(p.num_seqs), kThreads, 0, stream>>>(args);
  return internal::CheckLaunch("SpeculativeVerify");
}

}  // namespace loom::kernels::cuda
