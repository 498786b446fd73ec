// Paged attention on the GPU against limits measured in the same run (issue 7's targets):
//  - decode (LaunchPagedDecode): K/V bytes read per second, as a ratio of the device-to-
//    device copy bandwidth (bytes read + bytes written per second of a 1 GiB cudaMemcpy);
//    issue 34's target >= 0.8 at batch 1-64 x context 1k-32k, BF16 and F16 KV. --quick:
//    batch 32 x 4,096 and batch 1 x 32,768 (the split case), BF16; full: batch 1, 8, 32, 64
//    x context 1,024, 4,096, 32,768 in BF16 and F16;
//  - prefill (LaunchPagedPrefill): FLOP/s of one causal 4,096-token prompt, head dim 128
//    (4 * head_dim * num_heads * sum of attended lengths: Q K^T and P V), as a ratio of a
//    cuBLAS GEMM (cublasGemmEx, 8192^3, F32 accumulation) in the same dtype; issue 34's
//    targets >= 0.45, and >= 1.0x PyTorch's flash SDPA on the same shape
//    (tests/gpu/torch_peer.py, same window).
// Llama-3-8B attention shape: 32 query heads, 8 KV heads, head dim 128, blocks of 16 tokens
// in a shuffled pool, random values generated on the device (never zeros).
//
// Timing: CUDA graphs of launches (MedianGraphLaunchUs: the device's time, not the host's
// launch cost), decode's K/V rotated through enough pool copies to miss L2; the figure is the
// median over kRepeats. (Until 2026-12-04 the launches were eager and decode's K/V of small
// batches sat in L2: batch 1 at 1k-4k contexts took 29-40 us whatever the size, a floor the
// graphs tell apart from the kernel's own time.) Writes cuda_attention.json into $OUT when set, else
// bench/results/gpu/ under LOOM_SOURCE_DIR (or the current directory). Exits 0 with a
// message where no GPU is.
//
// --sweep (tests/gpu/sweep.sh) times the tuning spaces instead: decode's tilings, decode's split
// counts, and prefill's tilings, into cuda_attention_sweep.json. --profile: the --quick
// shapes, each launched once more inside a profiler range (bench/profile_range.h).
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "bench/gpu_bench_support.h"
#include "bench/machine_limits.h"
#include "bench/profile_range.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/paged_attention.h"
#include "kernels/cuda/paged_attention_candidates.h"
#include "kernels/cuda/prefill_attention.h"
#include "kernels/cuda/prefill_attention_candidates.h"
#include "kernels/cuda_device.h"

namespace loom::bench {
namespace {

using kernels::cuda::DataType;
using kernels::cuda::DeviceBuffer;

constexpr int kRepeats = 9;
constexpr int64_t kNumHeads = 32, kNumKvHeads = 8, kHeadDim = 128, kBlockSize = 16;

__device__ uint32_t Hash(uint64_t i, uint32_t seed) {
  uint64_t z = i * 0x9E3779B97F4A7C15ull + seed;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return static_cast<uint32_t>(z ^ (z >> 31));
}

// Uniform values in [-1, 1) as F16 or BF16.
template <typename T>
__global__ void FillRandom(T* out, int64_t count, uint32_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float value = (Hash(i, seed) >> 8) * (2.0f / 16777216.0f) - 1.0f;
    if constexpr (std::is_same_v<T, __half>) {
      out[i] = __float2half_rn(value);
    } else {
      out[i] = __float2bfloat16_rn(value);
    }
  }
}

DeviceBuffer Random(DataType dtype, int64_t count, uint32_t seed) {
  DeviceBuffer buffer = AllocateOrExit(count * 2);
  if (dtype == DataType::kF16) {
    FillRandom<<<1024, 256>>>(static_cast<__half*>(buffer.data()), count, seed);
  } else {
    FillRandom<<<1024, 256>>>(static_cast<__nv_bfloat16*>(buffer.data()), count, seed);
  }
  BENCH_CHECK_CUDA(cudaGetLastError());
  return buffer;
}

template <typename T>
DeviceBuffer Upload(const std::vector<T>& values) {
  DeviceBuffer buffer = AllocateOrExit(std::max<size_t>(values.size(), 1) * sizeof(T));
  CheckOk(buffer.CopyFromHost(values.data(), values.size() * sizeof(T)), "upload");
  return buffer;
}

// Seconds one `launch(i)` takes on the device (MedianGraphLaunchUs: a CUDA graph of launches,
// so that host launch costs do not count; i rotates operands past L2).
double TimeSeconds(cudaStream_t stream, const std::function<absl::Status(int)>& launch) {
  return MedianGraphLaunchUs(stream, launch, kRepeats) * 1e-6;
}

// FLOP/s of an 8192^3 cublasGemmEx in `dtype` with F32 accumulation.
double GemmRate(cublasHandle_t cublas, cudaStream_t stream, DataType dtype) {
  constexpr int64_t kSize = 8192;
  const cudaDataType type = dtype == DataType::kF16 ? CUDA_R_16F : CUDA_R_16BF;
  DeviceBuffer a = Random(dtype, kSize * kSize, 2), b = Random(dtype, kSize * kSize, 3);
  DeviceBuffer c = AllocateOrExit(kSize * kSize * 2);
  const float alpha = 1.0f, beta = 0.0f;
  const auto gemm = [&] {
    const cublasStatus_t status =
        cublasGemmEx(cublas, CUBLAS_OP_N, CUBLAS_OP_N, kSize, kSize, kSize, &alpha, a.data(), type,
                     kSize, b.data(), type, kSize, &beta, c.data(), type, kSize, CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT);
    return status == CUBLAS_STATUS_SUCCESS
               ? absl::OkStatus()
               : absl::InternalError(absl::StrFormat("cublasGemmEx: %d", static_cast<int>(status)));
  };
  const double seconds = TimeSeconds(stream, [&](int) { return gemm(); });
  // The limit's own kernel: what the prefill's tensor-pipe and issue figures are read against.
  if (dtype == DataType::kBF16) ProfileRange(stream, "cublas gemm bf16 8192^3 (the limit)", gemm);
  return 2.0 * kSize * kSize * kSize / seconds;
}

// A shuffled pool holding `context` tokens for each of `num_seqs` sequences, and its tables.
struct Pool {
  DeviceBuffer k, v, context_len, indptr, indices;
  int64_t num_blocks = 0;
  kernels::cuda::KvCacheView view(DataType dtype) const {
    return {k.data(), v.data(), dtype, num_blocks, kBlockSize, kNumKvHeads, kHeadDim};
  }
};

Pool MakePool(DataType dtype, int64_t num_seqs, int64_t context, uint32_t seed) {
  Pool pool;
  const int64_t blocks_per_seq = (context + kBlockSize - 1) / kBlockSize;
  pool.num_blocks = num_seqs * blocks_per_seq;
  const int64_t elements = pool.num_blocks * kBlockSize * kNumKvHeads * kHeadDim;
  pool.k = Random(dtype, elements, seed);
  pool.v = Random(dtype, elements, seed + 1);
  std::vector<int32_t> ids(pool.num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(seed));
  std::vector<int32_t> indptr(num_seqs + 1);
  for (int64_t s = 0; s <= num_seqs; ++s) indptr[s] = static_cast<int32_t>(s * blocks_per_seq);
  pool.context_len = Upload(std::vector<int32_t>(num_seqs, static_cast<int32_t>(context)));
  pool.indptr = Upload(indptr);
  pool.indices = Upload(ids);
  return pool;
}

struct DecodeRow {
  DataType dtype;
  int64_t batch, context;
  double seconds, bytes_per_second;
};

// Decode params over `pool` (its tables; the cache view as given) for `batch` sequences of
// `context` tokens, without a workspace.
kernels::cuda::PagedDecodeParams DecodeParams(const Pool& pool, kernels::cuda::KvCacheView view,
                                              const DeviceBuffer& q, DeviceBuffer& out,
                                              DataType q_dtype, int64_t batch, int64_t context) {
  kernels::cuda::PagedDecodeParams p;
  p.q = q.data();
  p.out = out.data();
  p.q_dtype = q_dtype;
  p.cache = view;
  p.context_len = static_cast<const int32_t*>(pool.context_len.data());
  p.block_indptr = static_cast<const int32_t*>(pool.indptr.data());
  p.block_indices = static_cast<const int32_t*>(pool.indices.data());
  p.num_seqs = batch;
  p.num_heads = kNumHeads;
  p.scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
  p.max_context_len = context;
  return p;
}

DecodeRow BenchDecode(cudaStream_t stream, DataType dtype, int64_t batch, int64_t context) {
  const double kv_bytes = 2.0 * batch * context * kNumKvHeads * kHeadDim * 2;  // K and V
  // Pools enough that each launch reads its K/V from device memory, not from L2.
  std::vector<Pool> pools;
  for (int i = 0, copies = RotationCopies(static_cast<size_t>(kv_bytes)); i < copies; ++i) {
    pools.push_back(MakePool(dtype, batch, context, 10 + 2 * i));
  }
  DeviceBuffer q = Random(dtype, batch * kNumHeads * kHeadDim, 20);
  DeviceBuffer out = AllocateOrExit(batch * kNumHeads * kHeadDim * 2);
  std::vector<kernels::cuda::PagedDecodeParams> params;
  for (const Pool& pool : pools) {
    params.push_back(DecodeParams(pool, pool.view(dtype), q, out, dtype, batch, context));
  }
  DeviceBuffer workspace;
  if (const size_t bytes = kernels::cuda::PagedDecodeWorkspaceBytes(params[0]); bytes > 0) {
    workspace = AllocateOrExit(bytes);
    for (kernels::cuda::PagedDecodeParams& p : params) {
      p.workspace = workspace.data();
      p.workspace_bytes = bytes;
    }
  }
  const double seconds = TimeSeconds(stream, [&](int i) {
    return kernels::cuda::LaunchPagedDecode(params[i % params.size()], stream);
  });
  ProfileRange(stream,
               absl::StrFormat("decode %s batch %d context %d", DataTypeName(dtype), batch,
                               context),
               [&] { return kernels::cuda::LaunchPagedDecode(params[0], stream); });
  return {dtype, batch, context, seconds, kv_bytes / seconds};
}

struct PrefillRow {
  DataType dtype;
  int64_t tokens;
  double seconds, flops_per_second;
};

// One sequence's prefill: `q_len` query tokens at the end of a `context`-token pool (a cached
// prefix of context - q_len tokens before them), output in the cache's dtype.
struct PrefillInput {
  Pool pool;
  DeviceBuffer q, out, query_start;
  kernels::cuda::PagedPrefillParams params;
  double flops = 0;  // Q K^T and P V over every query's attended positions
};

PrefillInput MakePrefill(DataType dtype, int64_t q_len, int64_t context, uint32_t seed) {
  PrefillInput in;
  in.pool = MakePool(dtype, 1, context, seed);
  in.q = Random(dtype, q_len * kNumHeads * kHeadDim, seed + 10);
  in.out = AllocateOrExit(q_len * kNumHeads * kHeadDim * 2);
  in.query_start = Upload(std::vector<int32_t>{0, static_cast<int32_t>(q_len)});
  kernels::cuda::PagedPrefillParams& p = in.params;
  p.q = in.q.data();
  p.out = in.out.data();
  p.q_dtype = p.out_dtype = dtype;
  p.cache = in.pool.view(dtype);
  p.query_start = static_cast<const int32_t*>(in.query_start.data());
  p.context_len = static_cast<const int32_t*>(in.pool.context_len.data());
  p.block_indptr = static_cast<const int32_t*>(in.pool.indptr.data());
  p.block_indices = static_cast<const int32_t*>(in.pool.indices.data());
  p.num_seqs = 1;
  p.num_heads = kNumHeads;
  p.scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
  p.max_query_len = q_len;
  // Causal: query j sits at position context - q_len + j and attends to that many + 1
  // positions; 2 flops per multiply-add, two products.
  const double attended =
      static_cast<double>(q_len) * (context - q_len) + q_len * (q_len + 1) / 2.0;
  in.flops = 4.0 * kHeadDim * kNumHeads * attended;
  return in;
}

PrefillRow BenchPrefill(cudaStream_t stream, DataType dtype, int64_t tokens) {
  const PrefillInput in = MakePrefill(dtype, tokens, tokens, 30);
  const auto launch = [&] { return kernels::cuda::LaunchPagedPrefill(in.params, stream); };
  const double seconds = TimeSeconds(stream, [&](int) { return launch(); });
  ProfileRange(stream, absl::StrFormat("prefill %s %d tokens", DataTypeName(dtype), tokens),
               launch);
  return {dtype, tokens, seconds, in.flops / seconds};
}

// --sweep, second part: the dispatched decode kernel (F16 K/V) at small batches and short
// contexts with the context cut into 1, 2, 4, ... 64 splits (partitions of at least 16 tokens)
// against the split heuristic's choice (kPagedDecodeMinPartition keeps its partitions at 256
// tokens or more, so batch 1 at 1k runs 32 blocks on the whole GPU): the JSON rows of
// cuda_attention_sweep.json's "splits".
std::string SweepSplits(cudaStream_t stream, double copy) {
  std::printf("\nsweep: decode splits (f16 K/V, the dispatched tiling); heuristic against the best\n");
  std::printf("%6s %8s | %9s %7s | %6s %9s %7s %6s\n", "batch", "context", "heur us", "/copy",
              "splits", "us", "/copy", "x");
  std::string rows_json;
  for (const int64_t batch : {1, 4, 16}) {
    for (const int64_t context : {512, 1024, 4096}) {
      const double kv_bytes = 2.0 * batch * context * kNumKvHeads * kHeadDim * 2;
      std::vector<Pool> pools;
      for (int i = 0, copies = RotationCopies(static_cast<size_t>(kv_bytes)); i < copies; ++i) {
        pools.push_back(MakePool(DataType::kF16, batch, context, 60 + 2 * i));
      }
      DeviceBuffer q = Random(DataType::kF16, batch * kNumHeads * kHeadDim, 70);
      DeviceBuffer out = AllocateOrExit(batch * kNumHeads * kHeadDim * 2);
      std::vector<kernels::cuda::PagedDecodeParams> params;
      for (const Pool& pool : pools) {
        params.push_back(DecodeParams(pool, pool.view(DataType::kF16), q, out, DataType::kF16,
                                      batch, context));
      }
      kernels::cuda::PagedDecodeParams most = params[0];
      most.num_splits = kernels::cuda::kPagedDecodeMaxSplits;
      DeviceBuffer workspace = AllocateOrExit(kernels::cuda::PagedDecodeWorkspaceBytes(most));
      for (kernels::cuda::PagedDecodeParams& p : params) {
        p.workspace = workspace.data();
        p.workspace_bytes = workspace.bytes();
      }
      auto time = [&](int splits) {
        return TimeSeconds(stream, [&](int i) {
          kernels::cuda::PagedDecodeParams p = params[i % params.size()];
          p.num_splits = splits;
          return kernels::cuda::LaunchPagedDecode(p, stream);
        });
      };
      const double heuristic = time(0);
      std::string us_json;
      int best_splits = 0;
      double best = heuristic;
      for (int splits = 1; splits <= kernels::cuda::kPagedDecodeMaxSplits && context / splits >= 16;
           splits *= 2) {
        const double seconds = time(splits);
        us_json += absl::StrFormat("%s\"%d\": %.2f", us_json.empty() ? "" : ", ", splits,
                                   seconds * 1e6);
        if (seconds < best) {
          best = seconds;
          best_splits = splits;
        }
      }
      std::printf("%6ld %8ld | %9.1f %7.3f | %6d %9.1f %7.3f %5.2fx\n", static_cast<long>(batch),
                  static_cast<long>(context), heuristic * 1e6, kv_bytes / heuristic / copy,
                  best_splits, best * 1e6, kv_bytes / best / copy, heuristic / best);
      std::fflush(stdout);
      if (!rows_json.empty()) rows_json += ",\n";
      rows_json += absl::StrFormat(
          "    {\"batch\": %d, \"context\": %d, \"heuristic_us\": %.2f, \"us\": {%s}}", batch,
          context, heuristic * 1e6, us_json);
    }
  }
  return rows_json;
}

// --sweep, third part: BF16 prefill through every tiling of its tuning space
// (prefill_attention_candidates.h; index 0 is the dispatched one): whole prompts of 1k, 4k and
// 8k tokens and a 2k-token chunk after a 6k-token cached prefix; per row the dispatched tiling
// against the fastest, as a share of the BF16 GEMM rate: the JSON rows of
// cuda_attention_sweep.json's "prefill".
std::string SweepPrefill(cudaStream_t stream, double gemm_bf16) {
  std::printf("\nsweep: prefill tilings (bf16, causal, 32/8 heads, d 128); dispatched against "
              "the fastest\n%6s %8s | %9s %7s | %-14s %9s %7s %6s\n",
              "query", "context", "t0 us", "/gemm", "best", "us", "/gemm", "x");
  std::string rows_json;
  for (const auto [q_len, context] : {std::pair<int64_t, int64_t>{1024, 1024},
                                      {4096, 4096},
                                      {8192, 8192},
                                      {2048, 8192}}) {
    const PrefillInput in = MakePrefill(DataType::kBF16, q_len, context, 80);
    const double flops = in.flops;
    std::vector<double> seconds;
    for (int c = 0; c < kernels::cuda::PagedPrefillCandidateCount(); ++c) {
      seconds.push_back(TimeSeconds(stream, [&](int) {
        return kernels::cuda::LaunchPagedPrefillCandidate(in.params, c, stream);
      }));
    }
    const int best = static_cast<int>(std::min_element(seconds.begin(), seconds.end()) -
                                      seconds.begin());
    std::printf("%6ld %8ld | %9.1f %7.3f | %-14s %9.1f %7.3f %5.2fx\n", static_cast<long>(q_len),
                static_cast<long>(context), seconds[0] * 1e6, flops / seconds[0] / gemm_bf16,
                std::string(kernels::cuda::PagedPrefillCandidateName(best)).c_str(),
                seconds[best] * 1e6, flops / seconds[best] / gemm_bf16, seconds[0] / seconds[best]);
    std::fflush(stdout);
    if (!rows_json.empty()) rows_json += ",\n";
    rows_json += absl::StrFormat("    {\"query\": %d, \"context\": %d, \"tflop\": %.4f, \"us\": {",
                                 q_len, context, flops / 1e12);
    for (size_t c = 0; c < seconds.size(); ++c) {
      rows_json += absl::StrFormat(
          "%s\"%s\": %.2f", c ? ", " : "",
          std::string(kernels::cuda::PagedPrefillCandidateName(static_cast<int>(c))),
          seconds[c] * 1e6);
    }
    rows_json += "}}";
  }
  return rows_json;
}

// --sweep: decode through every tiling of the tuning space (paged_attention_candidates.h;
// index 0 is the dispatched kernel) at batch 1-128 x context 1k-16k, F16, BF16 (the served
// checkpoints' dtype: the dispatched kernel against the tensor-core member, the only others
// that take it) and INT8 K/V; per row the dispatched tiling against the fastest, K/V bytes per
// second over the copy bandwidth; every timing into cuda_attention_sweep.json.
int Sweep(cudaStream_t stream, double copy, double gemm_bf16, const std::string& device) {
  std::printf("\nsweep: decode tilings (32/8 heads, d 128); dispatched against the fastest\n");
  std::printf("%5s %6s %8s | %9s %7s | %-12s %9s %7s %6s\n", "kv", "batch", "context",
              "t0 us", "/copy", "best", "us", "/copy", "x");
  std::string rows_json;
  for (const char* kv_name : {"f16", "bf16", "int8"}) {
    const bool int8 = std::string_view(kv_name) == "int8";
    // INT8 codes live in an F16 pool's bytes (below).
    const DataType kv = std::string_view(kv_name) == "bf16" ? DataType::kBF16 : DataType::kF16;
    for (const int64_t batch : {1, 8, 32, 64, 128}) {
      for (const int64_t context : {1024, 4096, 16384}) {
        if (batch * context > 64 * 16384) continue;  // KV past 8 GiB: nothing new
        // INT8: an F16 pool's bytes as codes of twice the tokens (any byte is a valid code),
        // and one BF16 scale per row. Copies enough that each launch reads from device memory.
        const int64_t rows = batch * ((context + kBlockSize - 1) / kBlockSize) * kBlockSize *
                             kNumKvHeads;
        const double kv_bytes = 2.0 * batch * context * kNumKvHeads * kHeadDim * (int8 ? 1 : 2);
        const int copies = RotationCopies(static_cast<size_t>(kv_bytes));
        std::vector<Pool> pools;
        std::vector<DeviceBuffer> scales;
        for (int i = 0; i < copies; ++i) {
          pools.push_back(
              MakePool(DataType::kF16, batch, int8 ? (context + 1) / 2 : context, 10 + 2 * i));
          scales.push_back(AllocateOrExit(2 * rows * 2));
          BENCH_CHECK_CUDA(cudaMemset(scales.back().data(), 0x3c, 2 * rows * 2));
        }
        DeviceBuffer q = AllocateOrExit(batch * kNumHeads * kHeadDim * 4);
        BENCH_CHECK_CUDA(cudaMemset(q.data(), 0x3c, batch * kNumHeads * kHeadDim * 4));
        DeviceBuffer out = AllocateOrExit(batch * kNumHeads * kHeadDim * 4);
        std::vector<kernels::cuda::PagedDecodeParams> params;
        for (int i = 0; i < copies; ++i) {
          Pool& pool = pools[i];
          kernels::cuda::KvCacheView view = pool.view(kv);
          if (int8) {
            view.num_blocks *= 2;  // blocks of one-byte codes
            view.quant = kernels::cuda::KvQuant::kInt8;
            view.k_scale = static_cast<uint16_t*>(scales[i].data());
            view.v_scale = view.k_scale + rows;
            pool.context_len = Upload(std::vector<int32_t>(batch, static_cast<int32_t>(context)));
            std::vector<int32_t> ids(batch * ((context + kBlockSize - 1) / kBlockSize));
            std::iota(ids.begin(), ids.end(), 0);
            std::shuffle(ids.begin(), ids.end(), std::mt19937(10));
            std::vector<int32_t> indptr(batch + 1);
            for (int64_t s = 0; s <= batch; ++s) {
              indptr[s] = static_cast<int32_t>(s * ids.size() / batch);
            }
            pool.indptr = Upload(indptr);
            pool.indices = Upload(ids);
          }
          params.push_back(
              DecodeParams(pool, view, q, out, int8 ? DataType::kF32 : kv, batch, context));
        }
        DeviceBuffer workspace;
        if (const size_t bytes = kernels::cuda::PagedDecodeWorkspaceBytes(params[0]); bytes > 0) {
          workspace = AllocateOrExit(bytes);
          for (kernels::cuda::PagedDecodeParams& p : params) {
            p.workspace = workspace.data();
            p.workspace_bytes = bytes;
          }
        }
        std::vector<double> seconds;  // infinity: the member does not take this cache
        for (int c = 0; c < kernels::cuda::PagedDecodeCandidateCount(); ++c) {
          kernels::cuda::PagedDecodeParams probe = params[0];
          probe.num_seqs = 0;  // checks the member takes it, launches nothing
          if (!kernels::cuda::LaunchPagedDecodeCandidate(probe, c, stream).ok()) {
            seconds.push_back(INFINITY);
            continue;
          }
          seconds.push_back(TimeSeconds(stream, [&](int i) {
            return kernels::cuda::LaunchPagedDecodeCandidate(params[i % copies], c, stream);
          }));
        }
        const int best = static_cast<int>(std::min_element(seconds.begin(), seconds.end()) -
                                          seconds.begin());
        std::printf("%5s %6ld %8ld | %9.1f %7.3f | %-12s %9.1f %7.3f %5.2fx\n", kv_name,
                    static_cast<long>(batch), static_cast<long>(context), seconds[0] * 1e6,
                    kv_bytes / seconds[0] / copy,
                    std::string(kernels::cuda::PagedDecodeCandidateName(best)).c_str(),
                    seconds[best] * 1e6, kv_bytes / seconds[best] / copy,
                    seconds[0] / seconds[best]);
        std::fflush(stdout);
        if (!rows_json.empty()) rows_json += ",\n";
        rows_json +=
            absl::StrFormat("    {\"kv\": \"%s\", \"batch\": %d, \"context\": %d, \"us\": {",
                            kv_name, batch, context);
        for (size_t c = 0; c < seconds.size(); ++c) {
          const std::string name(kernels::cuda::PagedDecodeCandidateName(static_cast<int>(c)));
          rows_json += std::isinf(seconds[c])
                           ? absl::StrFormat("%s\"%s\": null", c ? ", " : "", name)
                           : absl::StrFormat("%s\"%s\": %.2f", c ? ", " : "", name,
                                             seconds[c] * 1e6);
        }
        rows_json += "}}";
      }
    }
  }
  const std::string splits_json = SweepSplits(stream, copy);
  const std::string prefill_json = SweepPrefill(stream, gemm_bf16);
  std::string json = "{\n";
  json += absl::StrFormat(
      "  \"bench\": \"cuda_attention_sweep\",\n  \"date\": \"%s\",\n  \"device\": \"%s\",\n"
      "  \"copy_bandwidth_gbs\": %.1f,\n  \"gemm_bf16_tflops\": %.2f,\n",
      UtcNow(), device, copy / 1e9, gemm_bf16 / 1e12);
  json += "  \"rows\": [\n" + rows_json + "\n  ],\n";
  json += "  \"splits\": [\n" + splits_json + "\n  ],\n";
  json += "  \"prefill\": [\n" + prefill_json + "\n  ]\n}\n";
  return loom::bench::WriteGpuResult("cuda_attention_sweep", json) ? 0 : 1;
}

int Run(bool quick, bool sweep) {
  if (kernels::CudaDeviceCount() == 0) {
    std::printf("cuda_attention_bench: no CUDA device (%s): nothing measured\n",
                kernels::CudaDeviceDescription(0).c_str());
    return 0;
  }
  const std::string device = kernels::CudaDeviceDescription(0);
  std::printf("cuda_attention_bench on %s\n", device.c_str());
  cudaStream_t stream;
  BENCH_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cublasHandle_t cublas;
  if (cublasCreate(&cublas) != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "cublasCreate failed\n");
    return 1;
  }
  cublasSetStream(cublas, stream);

  const double copy = MeasureDeviceCopyBandwidth(stream);
  if (sweep) {
    const double gemm_bf16 = GemmRate(cublas, stream, DataType::kBF16);
    std::printf("limits: copy %.0f GB/s (read + write), cuBLAS GEMM BF16 %.1f TFLOP/s\n",
                copy / 1e9, gemm_bf16 / 1e12);
    const int status = Sweep(stream, copy, gemm_bf16, device);
    cublasDestroy(cublas);
    BENCH_CHECK_CUDA(cudaStreamDestroy(stream));
    return status;
  }
  const double gemm_f16 = GemmRate(cublas, stream, DataType::kF16);
  const double gemm_bf16 = GemmRate(cublas, stream, DataType::kBF16);
  std::printf(
      "limits: copy %.0f GB/s (read + write), cuBLAS GEMM F16 %.1f TFLOP/s, BF16 %.1f TFLOP/s\n",
      copy / 1e9, gemm_f16 / 1e12, gemm_bf16 / 1e12);

  // --quick: decode batch 32 x 4096 and the split case batch 1 x 32k, BF16 prefill of 4096
  // tokens.
  std::vector<DecodeRow> decode;
  if (quick) {
    decode = {BenchDecode(stream, DataType::kBF16, 32, 4096),
              BenchDecode(stream, DataType::kBF16, 1, 32768)};
  } else {
    for (const DataType dtype : {DataType::kBF16, DataType::kF16}) {
      for (const int64_t batch : {1, 8, 32, 64}) {
        for (const int64_t context : {1024, 4096, 32768}) {
          decode.push_back(BenchDecode(stream, dtype, batch, context));
        }
      }
    }
  }
  std::printf("\ndecode (32/8 heads, d 128)\n%6s %6s %8s %10s %10s %8s\n", "dtype", "batch",
              "context", "us", "GB/s", "/copy");
  for (const DecodeRow& r : decode) {
    std::printf("%6s %6ld %8ld %10.1f %10.0f %8.3f\n", std::string(DataTypeName(r.dtype)).c_str(),
                static_cast<long>(r.batch), static_cast<long>(r.context), r.seconds * 1e6,
                r.bytes_per_second / 1e9, r.bytes_per_second / copy);
  }
  std::vector<PrefillRow> prefill = {BenchPrefill(stream, DataType::kBF16, 4096)};
  if (!quick) prefill.push_back(BenchPrefill(stream, DataType::kF16, 4096));
  std::printf("\nprefill (causal, 32/8 heads, d 128)\n%6s %8s %10s %10s %8s\n", "dtype", "tokens",
              "us", "TFLOP/s", "/gemm");
  for (const PrefillRow& r : prefill) {
    const double gemm = r.dtype == DataType::kF16 ? gemm_f16 : gemm_bf16;
    std::printf("%6s %8ld %10.1f %10.1f %8.3f\n", std::string(DataTypeName(r.dtype)).c_str(),
                static_cast<long>(r.tokens), r.seconds * 1e6, r.flops_per_second / 1e12,
                r.flops_per_second / gemm);
  }
  std::printf("targets: decode >= 0.8 of copy; prefill 4096 >= 0.45 of GEMM\n");

  std::string json = "{\n";
  json += absl::StrFormat("  \"bench\": \"cuda_attention\",\n  \"date\": \"%s\",\n", UtcNow());
  json += absl::StrFormat("  \"device\": \"%s\",\n  \"quick\": %s,\n", device,
                          quick ? "true" : "false");
  json += absl::StrFormat(
      "  \"shape\": {\"num_heads\": %d, \"num_kv_heads\": %d, \"head_dim\": %d, "
      "\"block_size\": %d},\n",
      kNumHeads, kNumKvHeads, kHeadDim, kBlockSize);
  json += absl::StrFormat(
      "  \"copy_bandwidth_gbs\": %.1f,\n  \"gemm_f16_tflops\": %.2f,\n"
      "  \"gemm_bf16_tflops\": %.2f,\n",
      copy / 1e9, gemm_f16 / 1e12, gemm_bf16 / 1e12);
  json += "  \"timing\": \"median of 9 CUDA-graph runs / launches per graph, decode K/V rotated "
          "past L2\",\n";
  json +=
      "  \"targets\": {\"decode_copy_ratio\": 0.8, \"prefill_4096_gemm_ratio\": 0.45},\n";
  json += "  \"decode\": [\n";
  for (size_t i = 0; i < decode.size(); ++i) {
    const DecodeRow& r = decode[i];
    json += absl::StrFormat(
        "    {\"batch\": %d, \"context\": %d, \"dtype\": \"%s\", \"us\": %.2f, "
        "\"kv_gbs\": %.1f, \"copy_ratio\": %.3f}%s\n",
        r.batch, r.context, DataTypeName(r.dtype), r.seconds * 1e6, r.bytes_per_second / 1e9, r.bytes_per_second / copy,
        i + 1 < decode.size() ? "," : "");
  }
  json += "  ],\n  \"prefill\": [\n";
  for (size_t i = 0; i < prefill.size(); ++i) {
    const PrefillRow& r = prefill[i];
    const double gemm = r.dtype == DataType::kF16 ? gemm_f16 : gemm_bf16;
    json += absl::StrFormat(
        "    {\"tokens\": %d, \"dtype\": \"%s\", \"us\": %.2f, \"tflops\": %.2f, "
        "\"gemm_ratio\": %.3f}%s\n",
        r.tokens, DataTypeName(r.dtype), r.seconds * 1e6, r.flops_per_second / 1e12,
        r.flops_per_second / gemm, i + 1 < prefill.size() ? "," : "");
  }
  json += "  ]\n}\n";

  const bool written = loom::bench::WriteGpuResult("cuda_attention", json);
  cublasDestroy(cublas);
  BENCH_CHECK_CUDA(cudaStreamDestroy(stream));
  return written ? 0 : 1;
}

}  // namespace
}  // namespace loom::bench

int main(int argc, char** argv) {
  // --sweep (alone): the decode tilings' sweep instead of the table.
  if (argc == 2 && std::string_view(argv[1]) == "--sweep") return loom::bench::Run(false, true);
  return loom::bench::Run(loom::bench::QuickMode(argc, argv), false);
}
