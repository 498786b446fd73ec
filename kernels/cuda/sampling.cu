// Token sampling: one block of kThreads per row, every pass a sweep over the row.
//
//  1. The raw row's max and sum of exp (the chosen token's logprob).
//  2. Penalties: the row copied into the workspace, the listed tokens rewritten there.
//  3. The argmax of the penalized row (greedy rows stop here).
//  4. Filters as prefixes of the order (logit descending, id ascending), each found by a
//     radix select over order-preserving 32-bit keys (8 bits per pass, a 256-bin
//     histogram in shared memory, then the ties resolved in id order):
//     top-k counts elements; min-p is a per-element test (weights fall with the logit);
//     top-p accumulates fixed-point weights of the top-k / min-p survivors.
//  5. The draw: floor(Philox bits * kept total / 2^64), found in id order by a block-wide
//     ordered scan (warps own contiguous segments).
// Weights are exp2f((x - max) * log2(e) / T) in [0, 1], times 2^40, truncated to integers:
// sums are exact and independent of the order threads add them in, so a row's result
// depends only on its logits, its parameters and (seed, step).
#include <cmath>
#include <cstdint>

#include "common/status_macros.h"
#include "kernels/cuda/block_argmax.cuh"
#include "kernels/cuda/launch_internal.cuh"
#include "kernels/cuda/sampling.h"
#include "kernels/cuda/sampling_internal.h"

namespace loom::kernels::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr float kFixedOne = 1099511627776.0f;  // 2^40: weight 1 in fixed point
constexpr float kLog2e = 1.4426950408889634f;
constexpr int kBins = 256;  // radix digits of 8 bits

struct SampleArgs {
  const float* logits;
  int64_t logits_stride;
  int vocab;
  const SamplingRowParams* rows;
  const int32_t* penalty_indptr;
  const int32_t* penalty_tokens;
  const int32_t* penalty_counts;
  float* workspace;  // [num_rows, vocab] when penalty_indptr is set
  int32_t* tokens;
  float* logprobs;
  float* probs;  // [num_rows, vocab] or null
};

struct SharedState {
  float floats[kWarps];
  uint64_t words[kWarps];
  float best_value[kWarps];
  int best_index[kWarps];
  uint64_t histogram[kBins];
  uint32_t chosen_bin;
  uint64_t chosen_remaining;
  int found;
};

// NaN counts as -inf and -0 as +0, so that equal logits have equal keys.
__device__ __forceinline__ float Canonical(float x) {
  return isnan(x) ? -INFINITY : (x == 0.0f ? 0.0f : x);
}

// Order-preserving: a > b (floats, no NaN) iff OrderedKey(a) > OrderedKey(b). Every
// canonical value maps above 0 (-inf to 0x007fffff).
__device__ __forceinline__ uint32_t OrderedKey(float x) {
  const uint32_t bits = __float_as_uint(x);
  return (bits & 0x80000000u) != 0 ? ~bits : bits | 0x80000000u;
}

// Whether (key, id) comes at or before (bound_key, bound_id) in the order (key
// descending, id ascending). Bound (0, vocab) admits every canonical value.
__device__ __forceinline__ bool AtOrBefore(uint32_t key, int id, uint32_t bound_key, int bound_id) {
  return key > bound_key || (key == bound_key && id <= bound_id);
}

// Reduction over the block; every thread gets the result. `scratch`: kWarps slots.
template <typename T, typename Op>
__device__ T BlockReduce(T value, Op op, T* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    value = op(value, __shfl_xor_sync(kFullMask, value, offset));
  }
  if (lane == 0) scratch[warp] = value;
  __syncthreads();
  T total = scratch[0];
  for (int w = 1; w < kWarps; ++w) total = op(total, scratch[w]);
  __syncthreads();  // the scratch is reused by the next reduction
  return total;
}

__device__ __forceinline__ uint64_t BlockSum64(uint64_t value, SharedState& shared) {
  return BlockReduce(
      value, [](uint64_t a, uint64_t b) { return a + b; }, shared.words);
}

__device__ __forceinline__ void BlockArgmax(float& value, int& index, SharedState& shared) {
  internal::BlockArgmax<kWarps>(value, index, shared.best_value, shared.best_index);
}

// The smallest i in [0, n) where the running sum of weight(0 .. i) exceeds `target`
// (target < the total), or -1. Warp w owns the contiguous segment [w * segment, ...):
// segment totals, their prefix, then the one warp whose segment holds the target scans
// it 32 elements at a time.
template <typename Weight>
__device__ int FindOrdered(int n, Weight weight, uint64_t target, SharedState& shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int segment = ((n + kWarps - 1) / kWarps + 31) / 32 * 32;
  const int begin = warp * segment;
  const int end = min(n, begin + segment);
  uint64_t total = 0;
  for (int i = begin + lane; i < end; i += 32) total += weight(i);
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    total += __shfl_xor_sync(kFullMask, total, offset);
  if (lane == 0) shared.words[warp] = total;
  if (threadIdx.x == 0) shared.found = -1;
  __syncthreads();
  uint64_t base = 0;
  for (int w = 0; w < warp; ++w) base += shared.words[w];
  if (target >= base && target - base < total) {  // uniform over the warp
    for (int tile = begin; tile < end; tile += 32) {
      const int i = tile + lane;
      const uint64_t w = i < end ? weight(i) : 0;
      uint64_t inclusive = w;
#pragma unroll
      for (int offset = 1; offset < 32; offset <<= 1) {
        const uint64_t below = __shfl_up_sync(kFullMask, inclusive, offset);
        if (lane >= offset) inclusive += below;
      }
      // Exactly one lane of the crossing tile holds the target: base + inclusive - w <=
      // target < base + inclusive.
      const bool hit = target - base < inclusive && target - base >= inclusive - w;
      const unsigned hits = __ballot_sync(kFullMask, hit);
      if (hits != 0) {
        if (lane == __ffs(hits) - 1) shared.found = i;
        break;
      }
      base += __shfl_sync(kFullMask, inclusive, 31);
    }
  }
  __syncthreads();
  const int found = shared.found;
  __syncthreads();  // `found` and `words` are rewritten by the next call
  return found;
}

// Radix select: the element (key, id) of the order (key descending, id ascending) at
// which the running weight over the elements `element` admits first reaches `target`
// (1 <= target <= their total weight). element(i, key, weight) -> admitted.
template <typename Element>
__device__ void RadixSelect(int n, Element element, uint64_t target, SharedState& shared,
                            uint32_t& key_out, int& id_out) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  uint32_t prefix = 0;  // the key's digits found so far
  uint64_t remaining = target;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < kBins; b += kThreads) shared.histogram[b] = 0;
    __syncthreads();
    const uint32_t high_mask = shift == 24 ? 0u : ~0u << (shift + 8);
    for (int i = threadIdx.x; i < n; i += kThreads) {
      uint32_t key;
      uint64_t weight;
      if (!element(i, key, weight) || weight == 0 || (key & high_mask) != prefix) continue;
      atomicAdd(reinterpret_cast<unsigned long long*>(&shared.histogram[(key >> shift) & 0xffu]),
                static_cast<unsigned long long>(weight));
    }
    __syncthreads();
    if (warp == 0) {
      if (lane == 0) {  // never used when the invariant below holds
        shared.chosen_bin = 0;
        shared.chosen_remaining = 1;
      }
      __syncwarp();
      // Lane l owns bins 255 - 8l down to 248 - 8l: lanes in descending key order.
      uint64_t lane_total = 0;
#pragma unroll
      for (int k = 0; k < 8; ++k) lane_total += shared.histogram[kBins - 1 - 8 * lane - k];
      uint64_t inclusive = lane_total;
#pragma unroll
      for (int offset = 1; offset < 32; offset <<= 1) {
        const uint64_t below = __shfl_up_sync(kFullMask, inclusive, offset);
        if (lane >= offset) inclusive += below;
      }
      uint64_t above = inclusive - lane_total;
      if (above < remaining && remaining <= inclusive) {
        for (int k = 0; k < 8; ++k) {
          const int bin = kBins - 1 - 8 * lane - k;
          const uint64_t count = shared.histogram[bin];
          if (remaining <= above + count) {
            shared.chosen_bin = static_cast<uint32_t>(bin);
            shared.chosen_remaining = remaining - above;
            break;
          }
          above += count;
        }
      }
    }
    __syncthreads();
    prefix |= shared.chosen_bin << shift;
    remaining = shared.chosen_remaining;
    // The next pass's first __syncthreads comes before anyone rewrites chosen_*.
  }
  key_out = prefix;
  // Among the admitted elements with this key, in id order: where `remaining` is reached.
  const int id = FindOrdered(
      n,
      [&](int i) -> uint64_t {
        uint32_t key;
        uint64_t weight;
        return element(i, key, weight) && key == prefix ? weight : 0;
      },
      remaining - 1, shared);
  id_out = id >= 0 ? id : n - 1;
}

// Steps 4 and 5 for a row with temperature > 0 and a finite max: the sampled id, or -1 (then
// `probs` is not written). `probs` (null: not wanted): the kept weights over their total.
__device__ int SampleFiltered(const float* values, int vocab, const SamplingRowParams& params,
                              float max_value, SharedState& shared, float* probs) {
  const float inverse_temperature = kLog2e / params.temperature;
  const float min_p = params.min_p;
  // Weight relative to the max, in [0, 1] (1 exactly at the max, even for a tiny T).
  auto probability = [&](float x) {
    return x == max_value ? 1.0f : exp2f((x - max_value) * inverse_temperature);
  };

  uint32_t key_k = 0;  // top-k bound: (0, vocab) keeps everything
  int id_k = vocab;
  if (params.top_k > 1 && params.top_k < vocab) {
    RadixSelect(
        vocab,
        [&](int i, uint32_t& key, uint64_t& weight) {
          key = OrderedKey(Canonical(values[i]));
          weight = 1;
          return true;
        },
        static_cast<uint64_t>(params.top_k), shared, key_k, id_k);
  }
  // Members of the top-k that pass min-p, with their fixed-point weights.
  auto candidate = [&](int i, uint32_t& key, uint64_t& weight) {
    const float x = Canonical(values[i]);
    key = OrderedKey(x);
    if (!AtOrBefore(key, i, key_k, id_k)) return false;
    const float p = probability(x);
    if (min_p > 0.0f && !(p >= min_p)) return false;
    weight = static_cast<uint64_t>(p * kFixedOne);
    return true;
  };

  uint32_t key_p = 0;  // top-p bound
  int id_p = vocab;
  if (params.top_p < 1.0f) {
    uint64_t local = 0;
    for (int i = threadIdx.x; i < vocab; i += kThreads) {
      uint32_t key;
      uint64_t weight;
      if (candidate(i, key, weight)) local += weight;
    }
    const uint64_t total = BlockSum64(local, shared);
    if (total == 0) return -1;
    // The shortest prefix whose weight reaches top_p * total.
    const double wanted = ceil(static_cast<double>(params.top_p) * static_cast<double>(total));
    const uint64_t target = !(wanted >= 1.0)                       ? 1
                            : wanted >= static_cast<double>(total) ? total
                                                                   : static_cast<uint64_t>(wanted);
    RadixSelect(vocab, candidate, target, shared, key_p, id_p);
  }

  auto kept_weight = [&](int i) -> uint64_t {
    uint32_t key;
    uint64_t weight;
    if (!candidate(i, key, weight) || !AtOrBefore(key, i, key_p, id_p)) return 0;
    return weight;
  };
  uint64_t local = 0;
  for (int i = threadIdx.x; i < vocab; i += kThreads) local += kept_weight(i);
  const uint64_t total = BlockSum64(local, shared);
  if (total == 0) return -1;
  if (probs != nullptr) {
    const double inverse_total = 1.0 / static_cast<double>(total);
    for (int i = threadIdx.x; i < vocab; i += kThreads) {
      probs[i] = static_cast<float>(static_cast<double>(kept_weight(i)) * inverse_total);
    }
  }
  const uint64_t draw = __umul64hi(internal::SamplingBits(params.seed, params.step), total);
  return FindOrdered(vocab, kept_weight, draw, shared);
}

__global__ void __launch_bounds__(kThreads) SampleTokensKernel(SampleArgs args) {
  __shared__ SharedState shared;
  const int row = blockIdx.x;
  const int vocab = args.vocab;
  const float* raw = args.logits + static_cast<int64_t>(row) * args.logits_stride;
  const SamplingRowParams params = args.rows[row];

  // 1. log Z of the raw logits.
  float local = -INFINITY;
  for (int i = threadIdx.x; i < vocab; i += kThreads) local = fmaxf(local, raw[i]);
  const float raw_max = BlockReduce(
      local, [](float a, float b) { return fmaxf(a, b); }, shared.floats);
  local = 0.0f;
  for (int i = threadIdx.x; i < vocab; i += kThreads) local += expf(raw[i] - raw_max);
  const float log_z = raw_max + logf(BlockReduce(
                                    local, [](float a, float b) { return a + b; }, shared.floats));

  // 2. Penalties, as SequenceSampler::ApplyPenalties (explicit roundings: no FMA).
  const float* values = raw;
  if (args.penalty_indptr != nullptr) {
    const int begin = args.penalty_indptr[row], end = args.penalty_indptr[row + 1];
    const bool repetition = params.repetition_penalty != 1.0f;
    const bool additive = params.presence_penalty != 0.0f || params.frequency_penalty != 0.0f;
    if (end > begin && (repetition || additive)) {  // uniform over the block
      float* work = args.workspace + static_cast<int64_t>(row) * vocab;
      for (int i = threadIdx.x; i < vocab; i += kThreads) work[i] = raw[i];
      __syncthreads();  // block-wide visibility of the copy (global memory)
      for (int e = begin + static_cast<int>(threadIdx.x); e < end; e += kThreads) {
        const int token = args.penalty_tokens[e];
        if (token < 0 || token >= vocab) continue;
        float x = work[token];
        if (repetition) {
          x = x > 0.0f ? __fdiv_rn(x, params.repetition_penalty)
                       : __fmul_rn(x, params.repetition_penalty);
        }
        const int count = args.penalty_counts[e];
        if (additive && count > 0) {
          x = __fsub_rn(x,
                        __fadd_rn(params.presence_penalty,
                                  __fmul_rn(params.frequency_penalty, static_cast<float>(count))));
        }
        work[token] = x;
      }
      __syncthreads();
      values = work;
    }
  }

  // 3. Argmax, lowest id on ties, as the CPU's: NaNs never win (a -inf does), and a row of
  // NaNs answers token 0.
  float best = -INFINITY;
  int best_index = -1;
  for (int i = threadIdx.x; i < vocab; i += kThreads) {
    if (isnan(values[i])) continue;
    const float x = Canonical(values[i]);
    if (best_index < 0 || x > best) {
      best = x;
      best_index = i;
    }
  }
  BlockArgmax(best, best_index, shared);

  int token = best_index < 0 ? 0 : best_index;
  const bool greedy = !(params.temperature > 0.0f) || params.top_k == 1 || !isfinite(best);
  float* probs = args.probs != nullptr ? args.probs + static_cast<int64_t>(row) * vocab : nullptr;
  int sampled = -1;
  if (!greedy) {
    sampled = SampleFiltered(values, vocab, params, best, shared, probs);
    if (sampled >= 0) token = sampled;
  }
  if (probs != nullptr && sampled < 0) {
    // Greedy, or no weight kept: all of it on the argmax (the token chosen).
    for (int i = threadIdx.x; i < vocab; i += kThreads) probs[i] = i == token ? 1.0f : 0.0f;
  }
  if (threadIdx.x == 0) {
    args.tokens[row] = token;
    if (args.logprobs != nullptr) args.logprobs[row] = raw[token] - log_z;
  }
}

}  // namespace

absl::Status LaunchSampleTokens(const SampleTokensParams& p, cudaStream_t stream) {
  LOOM_RETURN_IF_ERROR(CheckSampleTokensParams(p));
  if (p.num_rows == 0) return absl::OkStatus();
  SampleArgs args{};
  args.logits = p.logits;
  args.logits_stride = p.logits_stride != 0 ? p.logits_stride : p.vocab_size;
  args.vocab = static_cast<int>(p.vocab_size);
  args.rows = p.rows;
  args.penalty_indptr = p.penalty_indptr;
  args.penalty_tokens = p.penalty_tokens;
  args.penalty_counts = p.penalty_counts;
  args.workspace = p.workspace;
  args.tokens = p.tokens;
  args.logprobs = p.logprobs;
  args.probs = p.probs;
  SampleTokensKernel<<<static_cast<unsigned>(p.num_rows), kThreads, 0, stream>>>(args);
  return internal::CheckLaunch("SampleTokens");
}

}  // namespace loom::kernels::cuda
