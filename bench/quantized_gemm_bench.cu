// Quantized GEMM on the GPU: W4A16 (INT4 group 128), W8A16 (INT8 per channel) and W8A16 in
// GGUF Q6_K's form (INT8, F32 scales per 16 columns) against cuBLAS F16 (cublasGemmEx) at the
// same shape, in the same run, for the linear layers of a Llama-3-8B shape (N
// x K = 4096 x 4096, 14336 x 4096, 4096 x 14336) at M = 1, 4, 16, 64, 256; FP8 (E4M3 through
// cuBLASLt, with and without the activation quantizer) on devices of compute capability >= 8.9. For
// W4A16 and the Q6_K form at M = 1 the weight bytes read per second are held against the
// device-to-device copy bandwidth measured here.
//
// Timing: each kernel sequence is captured in a CUDA graph of `inner` launches and timed with CUDA
// events; the figure is the median over repeats divided by `inner`. Weights rotate over enough
// copies that every launch reads them from device memory, not from L2. Writes quantized_gemm.json
// into $OUT when set, else bench/results/gpu/ under LOOM_SOURCE_DIR (or the current directory).
// Exits 0 with a message where no GPU is.
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "bench/gpu_bench_support.h"
#include "bench/machine_limits.h"
#include "bench/profile_range.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/quantized_gemm.h"
#include "kernels/cuda/quantized_gemm_candidates.h"
#include "kernels/cuda_device.h"

namespace loom::bench {
namespace {

using kernels::cuda::DataType;
using kernels::cuda::DeviceBuffer;

constexpr int64_t kGroup = 128;
constexpr int64_t kKQuantGroup = 16;  // Q6_K's sub-blocks

__device__ uint32_t Hash(uint64_t i, uint32_t seed) {
  uint64_t z = i * 0x9E3779B97F4A7C15ull + seed;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return static_cast<uint32_t>(z ^ (z >> 31));
}

__device__ float Uniform(uint64_t i, uint32_t seed, float low, float high) {
  return low + (high - low) * (Hash(i, seed) >> 8) * (1.0f / 16777216.0f);
}

__global__ void FillHalf(__half* out, int64_t count, float low, float high, uint32_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = __float2half_rn(Uniform(i, seed, low, high));
  }
}

__global__ void FillBytes(uint8_t* out, int64_t count, uint32_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = static_cast<uint8_t>(Hash(i, seed));
  }
}

__global__ void FillE4m3(uint8_t* out, int64_t count, uint32_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = __nv_cvt_float_to_fp8(Uniform(i, seed, -448.0f, 448.0f), __NV_SATFINITE, __NV_E4M3);
  }
}

DeviceBuffer RandomHalf(int64_t count, float low, float high, uint32_t seed) {
  DeviceBuffer buffer = AllocateOrExit(count * 2);
  FillHalf<<<1024, 256>>>(static_cast<__half*>(buffer.data()), count, low, high, seed);
  BENCH_CHECK_CUDA(cudaGetLastError());
  return buffer;
}

__global__ void FillFloat(float* out, int64_t count, float low, float high, uint32_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = Uniform(i, seed, low, high);
  }
}

DeviceBuffer RandomFloat(int64_t count, float low, float high, uint32_t seed) {
  DeviceBuffer buffer = AllocateOrExit(count * 4);
  FillFloat<<<1024, 256>>>(static_cast<float*>(buffer.data()), count, low, high, seed);
  BENCH_CHECK_CUDA(cudaGetLastError());
  return buffer;
}

DeviceBuffer RandomBytes(int64_t count, uint32_t seed) {
  DeviceBuffer buffer = AllocateOrExit(count);
  FillBytes<<<1024, 256>>>(static_cast<uint8_t*>(buffer.data()), count, seed);
  BENCH_CHECK_CUDA(cudaGetLastError());
  return buffer;
}

// Copies of one weight matrix, enough that a rotation through them exceeds L2.
struct Rotation {
  std::vector<DeviceBuffer> weights, scales;
  const void* weight(int i) const { return weights[i % weights.size()].data(); }
  const void* scale(int i) const {
    return scales.empty() ? nullptr : scales[i % scales.size()].data();
  }
};

struct Row {
  int64_t n, k, m;
  double cublas_us, w4_us, w8_us, fp8_us = -1, fp8_quant_us = -1;
  double w8k_us = -1;  // INT8 with F32 scales per 16 columns (Q6_K as Loom holds it)
  double w4_weight_gbs, w8k_weight_gbs = 0;
};

// One weight shape's operands: its weights in every format, each rotated past L2, and the
// activations (up to M = 256), output and FP8 scales every M shares.
struct ShapeOperands {
  Rotation f16, w4, w8, e4m3;  // e4m3 empty without FP8
  Rotation w8k;                // scales only: F32 per 16 columns for w8's weights
  DeviceBuffer x, y, x_fp8, scales;
  float* x_scale = nullptr;        // in `scales`
  const float* w_scale = nullptr;  // in `scales`
};

// Random operands for an [n, k] weight; `seed` advances past every fill.
ShapeOperands MakeOperands(int64_t n, int64_t k, bool fp8, uint32_t& seed) {
  ShapeOperands o;
  // Weights, rotated.
  for (int i = 0, copies = RotationCopies(n * k * 2); i < copies; ++i) {
    o.f16.weights.push_back(RandomHalf(n * k, -0.05f, 0.05f, seed++));
  }
  for (int i = 0, copies = RotationCopies(n * k / 2); i < copies; ++i) {
    o.w4.weights.push_back(RandomBytes(n * k / 2, seed++));
    // F16 scale and min interleaved; values in [0.004, 0.02] keep the outputs finite.
    o.w4.scales.push_back(RandomHalf(n * k / kGroup * 2, 0.004f, 0.02f, seed++));
  }
  for (int i = 0, copies = RotationCopies(n * k); i < copies; ++i) {
    o.w8.weights.push_back(RandomBytes(n * k, seed++));
    o.w8.scales.push_back(RandomHalf(n, 0.001f, 0.004f, seed++));
    o.w8k.scales.push_back(RandomFloat(n * k / kKQuantGroup, 0.0001f, 0.0004f, seed++));
    if (fp8) {
      DeviceBuffer buffer = AllocateOrExit(n * k);
      FillE4m3<<<1024, 256>>>(static_cast<uint8_t*>(buffer.data()), n * k, seed++);
      BENCH_CHECK_CUDA(cudaGetLastError());
      o.e4m3.weights.push_back(std::move(buffer));
    }
  }
  o.x = RandomHalf(256 * k, -1.0f, 1.0f, seed++);
  o.y = AllocateOrExit(256 * n * 2);
  o.x_fp8 = AllocateOrExit(256 * k);
  o.scales = AllocateOrExit(2 * sizeof(float));  // x scale, w scale
  const float one_scale[2] = {0.01f, 0.001f};
  CheckOk(o.scales.CopyFromHost(one_scale, sizeof(one_scale)), "scale upload");
  o.x_scale = static_cast<float*>(o.scales.data());
  o.w_scale = o.x_scale + 1;
  return o;
}

// cuBLAS F16 (cublasGemmEx) at row's [m, n, k], the figure the others are held against.
void TimeCublas(cudaStream_t stream, cublasHandle_t cublas, const ShapeOperands& o, Row& row) {
  const int64_t n = row.n, k = row.k, m = row.m;
  const float alpha = 1.0f, beta = 0.0f;
  const auto gemm = [&](int i) {
    // Row-major Y[m, n] = X[m, k] W[n, k]^T as column-major Y^T = W^T(op T) X^T.
    const cublasStatus_t status =
        cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                     static_cast<int>(k), &alpha, o.f16.weight(i), CUDA_R_16F, static_cast<int>(k),
                     o.x.data(), CUDA_R_16F, static_cast<int>(k), &beta, o.y.data(), CUDA_R_16F,
                     static_cast<int>(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    return status == CUBLAS_STATUS_SUCCESS
               ? absl::OkStatus()
               : absl::InternalError(absl::StrFormat("cublasGemmEx: %d", static_cast<int>(status)));
  };
  row.cublas_us = MedianGraphLaunchUs(stream, gemm);
  ProfileRange(stream, absl::StrFormat("cublas f16 m %d n %d k %d", m, n, k),
               [&] { return gemm(0); });
}

// W4A16 (INT4, group kGroup) and W8A16 (INT8 per channel) through LaunchQuantGemm at row's
// [m, n, k], with one split-K workspace that fits both; and W4A16's weight bytes per second.
void TimeQuantized(cudaStream_t stream, const ShapeOperands& o, Row& row) {
  const int64_t n = row.n, k = row.k, m = row.m;
  kernels::cuda::QuantGemmParams p;
  p.x = o.x.data();
  p.y = o.y.data();
  p.act_dtype = DataType::kF16;
  p.m = m;
  p.n = n;
  p.k = k;
  p.format = kernels::cuda::QuantWeightFormat::kInt4;
  p.group_size = kGroup;
  size_t workspace_bytes = kernels::cuda::QuantGemmWorkspaceBytes(p);
  p.format = kernels::cuda::QuantWeightFormat::kInt8;
  p.group_size = 0;
  workspace_bytes = std::max(workspace_bytes, kernels::cuda::QuantGemmWorkspaceBytes(p));
  DeviceBuffer workspace = AllocateOrExit(std::max<size_t>(workspace_bytes, 256));
  p.workspace = workspace.data();
  p.workspace_bytes = workspace.bytes();

  p.format = kernels::cuda::QuantWeightFormat::kInt4;
  p.group_size = kGroup;
  const auto w4 = [&](int i) {
    kernels::cuda::QuantGemmParams q = p;
    q.weight = o.w4.weight(i);
    q.scales = o.w4.scale(i);
    return kernels::cuda::LaunchQuantGemm(q, stream);
  };
  row.w4_us = MedianGraphLaunchUs(stream, w4);
  ProfileRange(stream, absl::StrFormat("w4a16 g%d m %d n %d k %d", kGroup, m, n, k),
               [&] { return w4(0); });
  // Under --profile, beside the table's member: the tuning space's direct member for this m
  // (weights straight to registers, never run on a GPU before its first sweep).
  const char* direct = m <= 8 ? "d_m8_w8_u8" : (m <= 16 ? "d_m16_w8_u4" : nullptr);
  for (int c = 0; ProfileRangesEnabled() && direct != nullptr &&
                  c < kernels::cuda::QuantGemmCandidateCount();
       ++c) {
    if (std::string_view(kernels::cuda::QuantGemmCandidateTile(c).name) != direct) continue;
    kernels::cuda::QuantGemmParams q = p;
    q.weight = o.w4.weight(0);
    q.scales = o.w4.scale(0);
    ProfileRange(stream, absl::StrFormat("w4a16 g%d m %d n %d k %d, candidate %s", kGroup, m, n,
                                         k, direct),
                 [&] { return kernels::cuda::LaunchQuantGemmCandidate(q, c, stream); });
  }
  const double w4_bytes = static_cast<double>(n * k / 2 + n * k / kGroup * 4);
  row.w4_weight_gbs = w4_bytes / (row.w4_us * 1e-6) / 1e9;

  p.format = kernels::cuda::QuantWeightFormat::kInt8;
  p.group_size = 0;
  const auto w8 = [&](int i) {
    kernels::cuda::QuantGemmParams q = p;
    q.weight = o.w8.weight(i);
    q.scales = o.w8.scale(i);
    return kernels::cuda::LaunchQuantGemm(q, stream);
  };
  row.w8_us = MedianGraphLaunchUs(stream, w8);
  ProfileRange(stream, absl::StrFormat("w8a16 per channel m %d n %d k %d", m, n, k),
               [&] { return w8(0); });

  p.group_size = kKQuantGroup;
  p.scale_type = kernels::cuda::QuantScaleType::kF32;
  row.w8k_us = MedianGraphLaunchUs(stream, [&](int i) {
    kernels::cuda::QuantGemmParams q = p;
    q.weight = o.w8.weight(i);
    q.scales = o.w8k.scale(i);
    return kernels::cuda::LaunchQuantGemm(q, stream);
  });
  const double w8k_bytes = static_cast<double>(n * k + n * k / kKQuantGroup * 4);
  row.w8k_weight_gbs = w8k_bytes / (row.w8k_us * 1e-6) / 1e9;
}

// FP8 (E4M3 through cuBLASLt) at row's [m, n, k] over activations quantized once, and with
// the activation quantizer in every launch.
void TimeFp8(cudaStream_t stream, const ShapeOperands& o, Row& row) {
  const int64_t n = row.n, k = row.k, m = row.m;
  kernels::cuda::Fp8GemmParams f;
  f.x = o.x_fp8.data();
  f.x_scale = o.x_scale;
  f.w_scale = o.w_scale;
  f.y = o.y.data();
  f.out_dtype = DataType::kF16;
  f.m = m;
  f.n = n;
  f.k = k;
  DeviceBuffer fp8_workspace = AllocateOrExit(kernels::cuda::Fp8GemmWorkspaceBytes(f));
  f.workspace = fp8_workspace.data();
  f.workspace_bytes = fp8_workspace.bytes();
  kernels::cuda::QuantizeFp8Params qp;
  qp.x = o.x.data();
  qp.out = o.x_fp8.data();
  qp.scale = o.x_scale;
  qp.dynamic_scale = false;  // a calibrated static scale; dynamic adds two tiny kernels
  qp.in_dtype = DataType::kF16;
  qp.count = m * k;
  CheckOk(kernels::cuda::LaunchQuantizeFp8(qp, stream), "quantize");
  row.fp8_us = MedianGraphLaunchUs(stream, [&](int i) {
    kernels::cuda::Fp8GemmParams g = f;
    g.weight = o.e4m3.weight(i);
    return kernels::cuda::LaunchFp8Gemm(g, stream);
  });
  row.fp8_quant_us = MedianGraphLaunchUs(stream, [&](int i) {
    kernels::cuda::Fp8GemmParams g = f;
    g.weight = o.e4m3.weight(i);
    absl::Status status = kernels::cuda::LaunchQuantizeFp8(qp, stream);
    return status.ok() ? kernels::cuda::LaunchFp8Gemm(g, stream) : status;
  });
}

// One row of the table: every GEMM at [m, n, k] (FP8 where the device has it), printed.
Row MeasureRow(cudaStream_t stream, cublasHandle_t cublas, const ShapeOperands& o, bool fp8,
               int64_t n, int64_t k, int64_t m) {
  Row row{n, k, m, 0, 0, 0};
  TimeCublas(stream, cublas, o, row);
  TimeQuantized(stream, o, row);
  if (fp8) TimeFp8(stream, o, row);
  BENCH_CHECK_CUDA(cudaStreamSynchronize(stream));
  std::printf("%6ld %6ld %4ld | %9.1f | %9.1f %5.2fx | %9.1f %5.2fx | %9.1f %5.2fx | ",
              static_cast<long>(n), static_cast<long>(k), static_cast<long>(m), row.cublas_us,
              row.w4_us, row.cublas_us / row.w4_us, row.w8_us, row.cublas_us / row.w8_us,
              row.w8k_us, row.cublas_us / row.w8k_us);
  if (row.fp8_us > 0) {
    std::printf("%9.1f %5.2fx %9.1f\n", row.fp8_us, row.cublas_us / row.fp8_us, row.fp8_quant_us);
  } else {
    std::printf("%9s %6s %9s\n", "-", "-", "-");
  }
  return row;
}

// W4A16's weight bytes per second at M = 1 against the copy bandwidth, and the targets.
void PrintBandwidthSummary(const std::vector<Row>& rows, double copy_gbs) {
  std::printf(
      "\nW4A16 at M = 1: weight bytes / time vs copy bandwidth %.0f "
      "GB/s (target >= 0.75)\n",
      copy_gbs);
  for (const Row& r : rows) {
    if (r.m != 1) continue;
    std::printf("  %6ld x %-6ld %7.0f GB/s  ratio %.2f   (Q6_K form: %7.0f GB/s  ratio %.2f)\n",
                static_cast<long>(r.n), static_cast<long>(r.k), r.w4_weight_gbs,
                r.w4_weight_gbs / copy_gbs, r.w8k_weight_gbs, r.w8k_weight_gbs / copy_gbs);
  }
  std::printf(
      "targets: W4A16 >= 3.0x cuBLAS F16 at M <= 16 and >= 1.0x at M = 256; "
      "W8A16 >= 1.7x at M <= 16\n");
}

// quantized_gemm.json: the run's device and limits, the targets, one object per row.
std::string ResultJson(const std::vector<Row>& rows, const std::string& device, int sms, bool fp8,
                       bool quick, double copy_gbs) {
  std::string json = "{\n";
  json += absl::StrFormat("  \"bench\": \"quantized_gemm\",\n  \"date\": \"%s\",\n", UtcNow());
  json += absl::StrFormat("  \"device\": \"%s\",\n  \"sms\": %d,\n  \"fp8\": %s,\n", device, sms,
                          fp8 ? "true" : "false");
  json += absl::StrFormat("  \"quick\": %s,\n", quick ? "true" : "false");
  json += absl::StrFormat("  \"copy_bandwidth_gbs\": %.1f,\n  \"w4a16_group\": %d,\n", copy_gbs,
                          kGroup);
  json +=
      "  \"timing\": \"median of 11 CUDA-graph runs / launches per graph, "
      "weights rotated past L2\",\n";
  json +=
      "  \"targets\": {\"w4a16_speedup_m_le_16\": 3.0, "
      "\"w4a16_speedup_m_256\": 1.0, "
      "\"w8a16_speedup_m_le_16\": 1.7, \"w4a16_m1_bandwidth_ratio\": 0.75},\n";
  json += "  \"results\": [\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    json += absl::StrFormat(
        "    {\"n\": %d, \"k\": %d, \"m\": %d, \"cublas_f16_us\": %.2f, "
        "\"w4a16_us\": %.2f, "
        "\"w4a16_speedup\": %.3f, \"w8a16_us\": %.2f, \"w8a16_speedup\": %.3f, "
        "\"w4a16_weight_gbs\": %.1f, \"w4a16_bandwidth_ratio\": %.3f, "
        "\"w8a16_q6k_form_us\": %.2f, \"w8a16_q6k_form_speedup\": %.3f, "
        "\"w8a16_q6k_form_weight_gbs\": %.1f, \"w8a16_q6k_form_bandwidth_ratio\": %.3f",
        r.n, r.k, r.m, r.cublas_us, r.w4_us, r.cublas_us / r.w4_us, r.w8_us, r.cublas_us / r.w8_us,
        r.w4_weight_gbs, r.w4_weight_gbs / copy_gbs, r.w8k_us, r.cublas_us / r.w8k_us,
        r.w8k_weight_gbs, r.w8k_weight_gbs / copy_gbs);
    if (r.fp8_us > 0) {
      json += absl::StrFormat(
          ", \"fp8_us\": %.2f, \"fp8_speedup\": %.3f, "
          "\"fp8_with_quantize_us\": %.2f",
          r.fp8_us, r.cublas_us / r.fp8_us, r.fp8_quant_us);
    }
    json += i + 1 < rows.size() ? "},\n" : "}\n";
  }
  json += "  ]\n}\n";
  return json;
}

// --sweep: W4A16 (group 128) and W8A16 (per channel) through the dispatch table's member and
// every candidate of the tuning space (quantized_gemm_candidates.h) at each m, a candidate at its
// own split-K heuristic and, where that splits, at one split too; prints the fastest candidate
// per row against the table's member and writes every timing to quantized_gemm_sweep.json.
struct SweepTiming {
  int candidate;  // -1: the dispatch table's member
  int splits;     // 0: the heuristic's
  double us;
};

std::string SweepRowJson(const char* format, int64_t n, int64_t k, int64_t m,
                         std::string_view table, const std::vector<SweepTiming>& timings) {
  std::string json = absl::StrFormat(
      "    {\"format\": \"%s\", \"n\": %d, \"k\": %d, \"m\": %d, \"table\": \"%s\", \"timings\": [",
      format, n, k, m, std::string(table));
  for (size_t i = 0; i < timings.size(); ++i) {
    const SweepTiming& t = timings[i];
    const std::string name = t.candidate < 0
                                 ? "table"
                                 : std::string(kernels::cuda::QuantGemmCandidateTile(t.candidate).name);
    json += absl::StrFormat("%s{\"config\": \"%s\", \"splits\": %d, \"us\": %.2f}", i ? ", " : "",
                            name, t.splits, t.us);
  }
  return json + "]}";
}

int Sweep(cudaStream_t stream, int sms, const std::string& device) {
  constexpr int kSweepRepeats = 5;
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{4096, 4096}, {14336, 4096},
                                                           {4096, 14336}};
  const std::vector<int64_t> ms = {1, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256};
  const size_t workspace_bytes = size_t{kernels::cuda::kQuantGemmMaxSplits} * 256 * 14336 * 4;
  DeviceBuffer workspace = AllocateOrExit(workspace_bytes);
  std::string rows_json;
  uint32_t seed = 500;
  std::printf("\nsweep: table member against the fastest candidate (us; splits in brackets)\n");
  std::printf("%6s %6s %6s %4s | %-13s %8s | %-20s %8s %6s\n", "format", "N", "K", "M", "table",
              "us", "best candidate", "us", "x");
  for (const auto& [n, k] : shapes) {
    Rotation w4, w8;
    for (int i = 0, copies = RotationCopies(n * k / 2); i < copies; ++i) {
      w4.weights.push_back(RandomBytes(n * k / 2, seed++));
      w4.scales.push_back(RandomHalf(n * k / kGroup * 2, 0.004f, 0.02f, seed++));
    }
    for (int i = 0, copies = RotationCopies(n * k); i < copies; ++i) {
      w8.weights.push_back(RandomBytes(n * k, seed++));
      w8.scales.push_back(RandomHalf(n, 0.001f, 0.004f, seed++));
    }
    const DeviceBuffer x = RandomHalf(256 * k, -1.0f, 1.0f, seed++);
    const DeviceBuffer y = AllocateOrExit(256 * n * 2);
    for (const bool int4 : {true, false}) {
      const Rotation& w = int4 ? w4 : w8;
      for (const int64_t m : ms) {
        kernels::cuda::QuantGemmParams p;
        p.x = x.data();
        p.y = y.data();
        p.act_dtype = DataType::kF16;
        p.format = int4 ? kernels::cuda::QuantWeightFormat::kInt4
                        : kernels::cuda::QuantWeightFormat::kInt8;
        p.group_size = int4 ? kGroup : 0;
        p.m = m;
        p.n = n;
        p.k = k;
        p.workspace = workspace.data();
        p.workspace_bytes = workspace.bytes();
        auto time = [&](int candidate, int splits) {
          return MedianGraphLaunchUs(
              stream,
              [&](int i) {
                kernels::cuda::QuantGemmParams q = p;
                q.weight = w.weight(i);
                q.scales = w.scale(i);
                q.num_splits = splits;
                return candidate < 0 ? kernels::cuda::LaunchQuantGemm(q, stream)
                                     : kernels::cuda::LaunchQuantGemmCandidate(q, candidate, stream);
              },
              kSweepRepeats);
        };
        std::vector<SweepTiming> timings = {{-1, 0, time(-1, 0)}};
        SweepTiming best{-1, 0, 1e30};
        for (int c = 0; c < kernels::cuda::QuantGemmCandidateCount(); ++c) {
          const kernels::cuda::QuantGemmTile tile = kernels::cuda::QuantGemmCandidateTile(c);
          // Tiles far from m: many blocks re-reading the weights, or most of a tile empty.
          if (tile.block_m * 4 < m || (tile.block_m >= 8 * m && tile.block_m > 16)) continue;
          kernels::cuda::QuantGemmParams probe = p;
          probe.m = 0;  // checks the format and the fit without launching
          if (!kernels::cuda::LaunchQuantGemmCandidate(probe, c, stream).ok()) continue;
          const int heuristic = kernels::cuda::QuantGemmCandidateSplits(c, m, n, k, sms);
          std::vector<int> options = {heuristic};
          if (heuristic != 1) options.push_back(1);
          for (const int splits : options) {
            const SweepTiming t{c, splits, time(c, splits)};
            timings.push_back(t);
            if (t.us < best.us) best = t;
          }
        }
        BENCH_CHECK_CUDA(cudaStreamSynchronize(stream));
        const char* format = int4 ? "w4a16" : "w8a16";
        const std::string table(kernels::cuda::QuantGemmTileFor(m, p.format).name);
        const std::string best_name =
            best.candidate < 0
                ? "-"
                : std::string(kernels::cuda::QuantGemmCandidateTile(best.candidate).name);
        std::printf("%6s %6ld %6ld %4ld | %-13s %8.1f | %-16s [%2d] %8.1f %5.2fx\n", format,
                    static_cast<long>(n), static_cast<long>(k), static_cast<long>(m),
                    table.c_str(), timings.front().us, best_name.c_str(), best.splits, best.us,
                    timings.front().us / best.us);
        std::fflush(stdout);
        if (!rows_json.empty()) rows_json += ",\n";
        rows_json += SweepRowJson(format, n, k, m, table, timings);
      }
    }
  }
  std::string json = "{\n";
  json += absl::StrFormat(
      "  \"bench\": \"quantized_gemm_sweep\",\n  \"date\": \"%s\",\n  \"device\": \"%s\",\n  "
      "\"sms\": %d,\n",
      UtcNow(), device, sms);
  json += absl::StrFormat(
      "  \"timing\": \"median of %d CUDA-graph runs / launches per graph, weights rotated past "
      "L2; splits 0 = the table's heuristic\",\n",
      kSweepRepeats);
  json += "  \"rows\": [\n" + rows_json + "\n  ]\n}\n";
  return loom::bench::WriteGpuResult("quantized_gemm_sweep", json) ? 0 : 1;
}

int Run(bool quick, bool sweep) {
  if (kernels::CudaDeviceCount() == 0) {
    std::printf("quantized_gemm_bench: no CUDA device (%s): nothing measured\n",
                kernels::CudaDeviceDescription(0).c_str());
    return 0;
  }
  const std::string device = kernels::CudaDeviceDescription(0);
  const absl::StatusOr<int> sms = kernels::cuda::CurrentDeviceSmCount();
  CheckOk(sms.status(), "SM count");
  const bool fp8 = kernels::cuda::Fp8GemmSupported();
  std::printf("quantized_gemm_bench on %s, %d SMs, FP8 %s\n", device.c_str(), *sms,
              fp8 ? "yes" : "no (compute capability < 8.9)");
  cudaStream_t stream;
  BENCH_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const double copy_gbs = MeasureDeviceCopyBandwidth(stream) / 1e9;
  std::printf("device-to-device copy: %.0f GB/s (read + write)\n", copy_gbs);

  if (sweep) {
    const int status = Sweep(stream, *sms, device);
    BENCH_CHECK_CUDA(cudaStreamDestroy(stream));
    return status;
  }

  cublasHandle_t cublas;
  if (cublasCreate(&cublas) != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "cublasCreate failed\n");
    return 1;
  }
  DeviceBuffer cublas_workspace = AllocateOrExit(size_t{32} << 20);
  cublasSetStream(cublas, stream);
  cublasSetWorkspace(cublas, cublas_workspace.data(), cublas_workspace.bytes());

  // --quick: Llama-3-8B's gate/up projection (N 14336, K 4096) at m = 1, 16, 64.
  const std::vector<std::pair<int64_t, int64_t>> shapes =
      quick ? std::vector<std::pair<int64_t, int64_t>>{{14336, 4096}}
            : std::vector<std::pair<int64_t, int64_t>>{{4096, 4096}, {14336, 4096}, {4096, 14336}};
  const std::vector<int64_t> ms =
      quick ? std::vector<int64_t>{1, 16, 64} : std::vector<int64_t>{1, 4, 16, 64, 256};
  std::vector<Row> rows;
  std::printf("\n%6s %6s %4s | %9s | %9s %6s | %9s %6s | %9s %6s | %9s %6s %9s\n", "N", "K", "M",
              "cuBLAS us", "W4A16 us", "x", "W8A16 us", "x", "Q6_K us", "x", "FP8 us", "x",
              "+quant us");
  uint32_t seed = 10;
  for (const auto& [n, k] : shapes) {
    const ShapeOperands operands = MakeOperands(n, k, fp8, seed);
    for (int64_t m : ms) rows.push_back(MeasureRow(stream, cublas, operands, fp8, n, k, m));
  }
  PrintBandwidthSummary(rows, copy_gbs);

  const bool written = loom::bench::WriteGpuResult(
      "quantized_gemm", ResultJson(rows, device, *sms, fp8, quick, copy_gbs));
  cublasDestroy(cublas);
  BENCH_CHECK_CUDA(cudaStreamDestroy(stream));
  return written ? 0 : 1;
}

}  // namespace
}  // namespace loom::bench

int main(int argc, char** argv) {
  // --sweep (alone): the tuning sweep instead of the table.
  if (argc == 2 && std::string_view(argv[1]) == "--sweep") return loom::bench::Run(false, true);
  return loom::bench::Run(loom::bench::QuickMode(argc, argv), false);
}
