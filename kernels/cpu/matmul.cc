#include "kernels/cpu/matmul.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <vector>

#include "absl/strings/str_format.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/matmul_internal.h"
#include "kernels/cpu/weights_internal.h"

namespace loom::kernels::cpu {
namespace {

using internal::kActGroup;
using internal::kRowBlock;
using internal::MatmulIsaChoice;

std::atomic<MatmulIsaChoice> forced_isa{MatmulIsaChoice::kAuto};
std::atomic<int64_t> f32act_gemm_min_tokens{internal::kF32ActGemmMinTokens};
std::atomic<int64_t> int8act_gemm_min_tokens{internal::kInt8ActGemmMinTokens};
std::atomic<bool> int8act_gemm_moved{false};
std::atomic<bool> amx_allowed{true};
std::atomic<MatmulIsaChoice> last_isa{MatmulIsaChoice::kAuto};

// From this many tokens a row block is compute-bound: the threads take several chunks
// each, which balances them (a chunk still reads its weight bytes once).
constexpr int64_t kBalancedMinTokens = 8;
constexpr int kBalancedChunksPerThread = 4;

// ActiveCpuIsa(): LOOM_CPU_ISA or the best this CPU runs.
MatmulIsaChoice BestIsa() {
  switch (ActiveCpuIsa()) {
    case CpuIsa::kAmx:  // the AVX-512 kernels, AMX for the int8-activation GEMM (AmxActive)
    case CpuIsa::kAvx512:
      return MatmulIsaChoice::kAvx512;
    case CpuIsa::kAvx2:
      return MatmulIsaChoice::kAvx2;
    case CpuIsa::kScalar:
      break;
  }
  return MatmulIsaChoice::kScalar;
}

MatmulIsaChoice ActiveIsa() {
  const MatmulIsaChoice forced = forced_isa.load(std::memory_order_relaxed);
  return forced == MatmulIsaChoice::kAuto ? BestIsa() : forced;
}

// Whether the AVX-512 int8-activation GEMM runs its 16-token tiles on AMX.
bool AmxActive() {
  return ActiveIsa() == MatmulIsaChoice::kAvx512 && ActiveCpuIsa() >= CpuIsa::kAmx &&
         amx_allowed.load(std::memory_order_relaxed);
}

absl::Status CheckParams(const MatmulParams& p) {
  if (p.weight == nullptr || p.x == nullptr || p.y == nullptr) {
    return absl::InvalidArgumentError("Matmul: null weight, x or y");
  }
  const PackedWeight& w = *p.weight;
  if (p.m <= 0 || w.rows <= 0 || w.cols <= 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("Matmul: m %d, weight [%d, %d] must be positive", p.m, w.rows, w.cols));
  }
  const int64_t blocks = internal::NumRowBlocks(w.rows);
  if (static_cast<int64_t>(w.data.size()) != blocks * internal::BlockDataBytes(w.format, w.cols)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "Matmul: weight data holds %d bytes, not the %d its [%d, %d] shape packs to",
        w.data.size(), blocks * internal::BlockDataBytes(w.format, w.cols), w.rows, w.cols));
  }
  if (p.activations != ActivationPrecision::kF32 && p.activations != ActivationPrecision::kInt8 &&
      p.activations != ActivationPrecision::kBf16) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "Matmul: unknown activation precision %d", static_cast<int>(p.activations)));
  }
  if (internal::IsInteger(w.format)) {
    const int64_t unit = w.f32_scaled() ? internal::kF32ScaledGroupUnit : kActGroup;
    if (w.group_size <= 0 || w.group_size % unit != 0 || w.cols % w.group_size != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "Matmul: group size %d must be a positive multiple of %d dividing cols %d",
          w.group_size, unit, w.cols));
    }
    const size_t groups = static_cast<size_t>(blocks * (w.cols / w.group_size) * kRowBlock);
    const bool sizes_match =
        w.f32_scaled()
            ? w.scales_f32.size() == groups && w.mins_f32.size() == groups && w.scales.empty()
            : w.scales.size() == groups &&
                  w.mins.size() == (internal::HasMins(w.format) ? groups : 0);
    if (!sizes_match) {
      return absl::InvalidArgumentError("Matmul: weight scales/mins do not match its shape");
    }
  }
  return absl::OkStatus();
}

}  // namespace

namespace internal {

bool IsaSupported(MatmulIsaChoice isa) {
  switch (isa) {
    case MatmulIsaChoice::kAuto:
    case MatmulIsaChoice::kScalar:
      return true;
    case MatmulIsaChoice::kAvx2:
      return ActiveCpuIsa() >= CpuIsa::kAvx2;
    case MatmulIsaChoice::kAvx512:
      return ActiveCpuIsa() >= CpuIsa::kAvx512;
  }
  return false;
}

MatmulIsaChoice LastMatmulIsa() { return last_isa.load(std::memory_order_relaxed); }

bool AmxInUse() { return AmxActive(); }

void SetAmxAllowedForTesting(bool allowed) {
  amx_allowed.store(allowed, std::memory_order_relaxed);
}

void SetMatmulIsaForTesting(MatmulIsaChoice isa) {
  forced_isa.store(isa, std::memory_order_relaxed);
}

int64_t F32ActGemmMinTokens() { return f32act_gemm_min_tokens.load(std::memory_order_relaxed); }

void SetF32ActGemmMinTokensForTesting(int64_t min_tokens) {
  f32act_gemm_min_tokens.store(min_tokens <= 0 ? kF32ActGemmMinTokens : min_tokens,
                               std::memory_order_relaxed);
}

int64_t Int8ActGemmMinTokens() {
  return int8act_gemm_min_tokens.load(std::memory_order_relaxed);
}

void SetInt8ActGemmMinTokensForTesting(int64_t min_tokens) {
  int8act_gemm_min_tokens.store(min_tokens <= 0 ? kInt8ActGemmMinTokens : min_tokens,
                                std::memory_order_relaxed);
  int8act_gemm_moved.store(min_tokens > 0, std::memory_order_relaxed);
}

void QuantizeActivationRows(const float* x, int64_t num_rows, int64_t k, int8_t* q,
                            float* scale, int32_t* qsum) {
  QuantizeActivationRowsInGroups(x, num_rows, k, kActGroup, q, scale, qsum);
}

void QuantizeActivationRowsInGroups(const float* x, int64_t num_rows, int64_t k, int64_t group,
                                    int8_t* q, float* scale, int32_t* qsum) {
  const int64_t groups = k / group;
  for (int64_t row = 0; row < num_rows; ++row) {
    for (int64_t g = 0; g < groups; ++g) {
      const float* src = x + row * k + g * group;
      int8_t* dst = q + row * k + g * group;
      float amax = 0.0f;
      for (int64_t j = 0; j < group; ++j) amax = std::max(amax, std::fabs(src[j]));
      const float inverse = amax > 0.0f ? 127.0f / amax : 0.0f;
      int32_t sum = 0;
      for (int64_t j = 0; j < group; ++j) {
        // Round to nearest even without a libm call: adding and subtracting 1.5 * 2^23
        // rounds any |v| < 2^22 to an integer in the current (default) rounding mode.
        // |src * inverse| <= 127 up to one rounding, so the value stays within int8.
        const float rounded = (src[j] * inverse + 12582912.0f) - 12582912.0f;
        const int32_t value = static_cast<int32_t>(rounded);
        dst[j] = static_cast<int8_t>(value);
        sum += value;
      }
      scale[row * groups + g] = amax / 127.0f;
      qsum[row * groups + g] = sum;
    }
  }
}

void ExpandNl4BlocksScalar(const PackedWeight& w, int64_t block_begin, int64_t block_end,
                           uint8_t* out) {
  // A 64-byte line of codes (8 columns x 16 rows) becomes two INT8 lines (4 columns each):
  // the low nibbles' and the high nibbles', each byte at the same place in its line.
  const int64_t lines = BlockDataBytes(WeightFormat::kNl4, w.cols) / 64;
  const uint8_t* src = w.data.data() + block_begin * lines * 64;
  for (int64_t line = 0; line < (block_end - block_begin) * lines; ++line) {
    for (int i = 0; i < 64; ++i) {
      const uint8_t byte = src[line * 64 + i];
      out[line * 128 + i] = static_cast<uint8_t>(w.levels[byte & 0x0f] + 128);
      out[line * 128 + 64 + i] = static_cast<uint8_t>(w.levels[byte >> 4] + 128);
    }
  }
}

// Scalar kernel over the packed layout; the integer formats use the same quantized
// activations and integer dot products as the SIMD kernels.
void MatmulBlocksScalar(const MatmulArgs& a, int64_t block_begin, int64_t block_end) {
  const PackedWeight& w = *a.weight;
  const int64_t k = w.cols, n = w.rows;
  const WeightFormat format = KernelFormat(a);
  for (int64_t b = block_begin; b < block_end; ++b) {
    const uint8_t* data = KernelBlockData(a, b);
    const int64_t valid = std::min<int64_t>(kRowBlock, n - b * kRowBlock);
    const float* bias = a.bias ? a.bias + b * kRowBlock : nullptr;
    for (int64_t t = 0; t < a.m; ++t) {
      float acc[kRowBlock] = {};
      switch (format) {
        case WeightFormat::kF32: {
          const float* wf = reinterpret_cast<const float*>(data);
          const float* x = a.x + t * k;
          for (int64_t c = 0; c < k; ++c) {
            for (int r = 0; r < kRowBlock; ++r) acc[r] += wf[c * kRowBlock + r] * x[c];
          }
          break;
        }
        case WeightFormat::kF16: {
          const uint16_t* wh = reinterpret_cast<const uint16_t*>(data);
          const float* x = a.x + t * k;
          for (int64_t c = 0; c < k; ++c) {
            for (int r = 0; r < kRowBlock; ++r) acc[r] += HalfToFloat(wh[c * kRowBlock + r]) * x[c];
          }
          break;
        }
        case WeightFormat::kBf16: {
          const uint16_t* wb = reinterpret_cast<const uint16_t*>(data);
          const float* x = a.x + t * k;
          for (int64_t c = 0; c < k; ++c) {
            for (int r = 0; r < kRowBlock; ++r) {
              acc[r] += Bf16ToFloat(wb[internal::Bf16Index(r, c)]) * x[c];
            }
          }
          break;
        }
        case WeightFormat::kNl4:  // read as INT8 (KernelFormat)
          break;
        case WeightFormat::kInt8:
        case WeightFormat::kInt4:
        case WeightFormat::kInt5: {
          const bool int8 = format == WeightFormat::kInt8;
          const int64_t groups_per_scale = w.group_size / kActGroup;
          const int64_t x_groups = k / kActGroup;
          const int8_t* xq = a.xq.q + t * k;
          for (int64_t g = 0; g < x_groups; ++g) {
            int32_t dot[kRowBlock] = {};
            AddScalarIntegerDots(data, format, k, xq, g * kActGroup, (g + 1) * kActGroup, dot);
            const float x_scale = a.xq.scale[t * x_groups + g];
            const int32_t x_sum = a.xq.qsum[t * x_groups + g];
            const int64_t scale_index =
                (b * (k / w.group_size) + g / groups_per_scale) * kRowBlock;
            for (int r = 0; r < kRowBlock; ++r) {
              const float scale = HalfToFloat(w.scales[scale_index + r]);
              float partial = static_cast<float>(dot[r]) * scale;
              if (!int8) partial += HalfToFloat(w.mins[scale_index + r]) * static_cast<float>(x_sum);
              acc[r] += partial * x_scale;
            }
          }
          break;
        }
      }
      StoreBlockOutput(acc, bias, valid, a.y + t * n + b * kRowBlock);
    }
  }
}

// Scalar float-activation kernel: the tile kernels' grouping and centring.
void MatmulF32ActBlocksScalar(const MatmulArgs& a, int64_t block_begin, int64_t block_end) {
  const PackedWeight& w = *a.weight;
  const int64_t k = w.cols, n = w.rows;
  const WeightFormat format = KernelFormat(a);
  const bool int8 = format == WeightFormat::kInt8;
  // INT4/INT5 q are centred on their middle (8, 16); the min takes it back.
  const int centre = int8 ? 0 : format == WeightFormat::kInt5 ? 16 : 8;
  const int64_t scale_groups = k / w.group_size;
  for (int64_t b = block_begin; b < block_end; ++b) {
    const uint8_t* data = KernelBlockData(a, b);
    const int64_t valid = std::min<int64_t>(kRowBlock, n - b * kRowBlock);
    const float* bias = a.bias ? a.bias + b * kRowBlock : nullptr;
    for (int64_t t = 0; t < a.m; ++t) {
      const float* x = a.x + t * k;
      float acc[kRowBlock] = {};
      for (int64_t sg = 0; sg < scale_groups; ++sg) {
        float group_acc[kRowBlock] = {};
        for (int64_t c = sg * w.group_size; c < (sg + 1) * w.group_size; ++c) {
          for (int r = 0; r < kRowBlock; ++r) {
            const int q = BlockQ(data, format, k, r, c) - centre;
            group_acc[r] += static_cast<float>(q) * x[c];
          }
        }
        const int64_t scale_index = (b * scale_groups + sg) * kRowBlock;
        for (int r = 0; r < kRowBlock; ++r) {
          const float scale = w.f32_scaled() ? w.scales_f32[scale_index + r]
                                             : HalfToFloat(w.scales[scale_index + r]);
          acc[r] += group_acc[r] * scale;
          if (w.f32_scaled()) {
            // INT8 may carry a min here; -0 (none) adds nothing.
            const float min = w.mins_f32[scale_index + r] + static_cast<float>(centre) * scale;
            acc[r] += min * a.x_group_sum[t * scale_groups + sg];
          } else if (!int8) {
            const float centred_min =
                HalfToFloat(w.mins[scale_index + r]) + static_cast<float>(centre) * scale;
            acc[r] += centred_min * a.x_group_sum[t * scale_groups + sg];
          }
        }
      }
      StoreBlockOutput(acc, bias, valid, a.y + t * n + b * kRowBlock);
    }
  }
}

}  // namespace internal

absl::Status Matmul(const MatmulParams& params, ThreadPool& pool) {
  if (absl::Status status = CheckParams(params); !status.ok()) return status;
  if (absl::Status status = ActivationPrecisionStatus(params.activations); !status.ok()) {
    return status;
  }
  const PackedWeight& w = *params.weight;
  internal::MatmulArgs args;
  args.weight = &w;
  args.x = params.x;
  args.bias = params.bias;
  args.y = params.y;
  args.m = params.m;

  const int64_t k = w.cols;
  // BF16 activations: one AMX kernel for every format and m (NL4 widened below as for the
  // others).
  const bool bf16 = params.activations == ActivationPrecision::kBf16;
  const bool integer = internal::IsInteger(w.format) && !bf16;
  const bool int5 = w.format == WeightFormat::kInt5;
  // NL4 runs the INT8 kernels on its row blocks widened a few at a time (below).
  const bool nl4 = w.format == WeightFormat::kNl4;
  const WeightFormat kernel_format = nl4 ? WeightFormat::kInt8 : w.format;
  // F32-scaled weights (K-quants) take float activations through the GEMM kernels on
  // AVX2/AVX-512 (whatever the threshold) and the scalar kernel otherwise, and int8 ones
  // through their own kernels (matmul_kquant_int8act*.cc): the other int8-activation and
  // tile kernels read F16 scales in groups of 32.
  const bool int8_activations = integer && params.activations == ActivationPrecision::kInt8;
  const bool kquant_int8 = int8_activations && w.f32_scaled();
  // Batches of tokens with float activations: dequantize each weight panel once and run
  // a float GEMM over it (no group sums of x needed). INT5 has no float tile kernel.
  const bool f32act_gemm =
      integer && !int8_activations &&
      (ActiveIsa() == MatmulIsaChoice::kAvx512 || ActiveIsa() == MatmulIsaChoice::kAvx2) &&
      (w.f32_scaled() || int5 || params.m >= internal::F32ActGemmMinTokens());
  // Per-call buffers, reused (thread_local: one pool per thread calls Matmul).
  thread_local std::vector<int8_t> xq;
  thread_local std::vector<float> x_scale;
  thread_local std::vector<int32_t> x_sum;
  thread_local std::vector<float> x_group_sum;
  thread_local std::vector<int32_t> x_sum16;
  // K-quant weights meet llama.cpp's Q8_K arithmetic: one activation scale per 256 columns
  // (per 32 where a widened legacy matrix is not a multiple of 256 wide).
  const int64_t act_group = kquant_int8 && k % 256 == 0 ? 256 : kActGroup;
  if (int8_activations) {
    // Quantize the activations once per call (K-quant weights also take each 16 columns'
    // integer sum, for their mins).
    xq.resize(params.m * k);
    x_scale.resize(params.m * (k / act_group));
    x_sum.resize(params.m * (k / act_group));
    if (kquant_int8) x_sum16.resize(params.m * (k / 16));
    const int64_t groups = k / act_group;
    // Raw pointers: inside the lambda the thread_local names would mean the worker's own.
    int8_t* q_out = xq.data();
    float* scale_out = x_scale.data();
    int32_t* sum_out = x_sum.data();
    int32_t* sum16_out = kquant_int8 ? x_sum16.data() : nullptr;
    const float* x = params.x;
    const bool avx512 = ActiveIsa() == MatmulIsaChoice::kAvx512 && act_group == kActGroup;
    auto quantize = [=](int64_t begin, int64_t end) {
      if (avx512) {
        internal::QuantizeActivationRowsAvx512(x + begin * k, end - begin, k, q_out + begin * k,
                                               scale_out + begin * groups,
                                               sum_out + begin * groups);
      } else {
        internal::QuantizeActivationRowsInGroups(x + begin * k, end - begin, k, act_group,
                                                 q_out + begin * k, scale_out + begin * groups,
                                                 sum_out + begin * groups);
      }
      if (sum16_out == nullptr) return;
      for (int64_t j = begin * (k / 16); j < end * (k / 16); ++j) {
        int32_t sum = 0;
        for (int64_t c = 0; c < 16; ++c) sum += q_out[j * 16 + c];
        sum16_out[j] = sum;
      }
    };
    // ~0.3 us per row: below a few dozen rows a thread wake-up costs more than it saves.
    if (params.m >= 64) {
      pool.ParallelFor(params.m, 16, quantize);
    } else {
      quantize(0, params.m);
    }
    args.xq = {xq.data(), x_scale.data(), x_sum.data()};
    args.xq_group = act_group;
    args.xq_sum16 = sum16_out;
  } else if ((w.format == WeightFormat::kInt4 || int5 || w.f32_scaled()) && !f32act_gemm &&
             !bf16) {
    // The group sums of x apply each group's min once (summed in double: k adds per
    // token, negligible next to the matmul).
    const int64_t groups = k / w.group_size;
    x_group_sum.resize(params.m * groups);
    for (int64_t t = 0; t < params.m; ++t) {
      for (int64_t g = 0; g < groups; ++g) {
        const float* src = params.x + t * k + g * w.group_size;
        double sum = 0.0;
        for (int64_t c = 0; c < w.group_size; ++c) sum += src[c];
        x_group_sum[t * groups + g] = static_cast<float>(sum);
      }
    }
    args.x_group_sum = x_group_sum.data();
  }

  internal::MatmulBlocksFn kernel = kquant_int8 ? internal::MatmulKQuantInt8ActBlocksScalar
                                     : integer && !int8_activations
                                         ? internal::MatmulF32ActBlocksScalar
                                         : internal::MatmulBlocksScalar;
  const MatmulIsaChoice isa = ActiveIsa();
  last_isa.store(isa, std::memory_order_relaxed);
  // Int8 activations: the GEMM and the tile kernel give the same bits (matmul_internal.h),
  // so the choice is by speed: AVX2 INT8 stays on the tile kernel unless a test/bench
  // moved the threshold. INT5's GEMM is AVX-512's (its tiles are the tile kernel's); AVX2
  // runs it on the tile kernel.
  const bool int8act_gemm =
      int8_activations && !kquant_int8 && !(int5 && isa != MatmulIsaChoice::kAvx512) &&
      params.m >= internal::Int8ActGemmMinTokens() &&
      (int8act_gemm_moved.load(std::memory_order_relaxed) ||
       !(ActiveIsa() == MatmulIsaChoice::kAvx2 && kernel_format == WeightFormat::kInt8));
  // AMX (AmxActive) runs batches of 16 tokens or more of both int8-activation GEMMs, with
  // the AVX-512 kernels' bits.
  const bool amx = int8_activations && params.m >= internal::kAmxMinTokens && AmxActive() &&
                   (!kquant_int8 || internal::KQuantAmxSupports(w));
  switch (isa) {
    case MatmulIsaChoice::kAvx512:
      kernel = kquant_int8 && amx             ? internal::MatmulKQuantInt8ActBlocksAmx
               : kquant_int8                  ? internal::MatmulKQuantInt8ActBlocksAvx512
               : f32act_gemm                  ? internal::MatmulF32ActGemmBlocksAvx512
               : int8act_gemm && amx          ? internal::MatmulInt8ActGemmBlocksAmx
               : int8act_gemm                 ? internal::MatmulInt8ActGemmBlocksAvx512
               : integer && !int8_activations ? internal::MatmulF32ActBlocksAvx512
                                              : internal::MatmulBlocksAvx512;
      break;
    case MatmulIsaChoice::kAvx2:
      kernel = kquant_int8                      ? internal::MatmulKQuantInt8ActBlocksAvx2
               : f32act_gemm                    ? internal::MatmulF32ActGemmBlocksAvx2
               : int8act_gemm                   ? internal::MatmulInt8ActGemmBlocksAvx2
               : integer && !int8_activations ? internal::MatmulF32ActBlocksAvx2
                                              : internal::MatmulBlocksAvx2;
      break;
    default:
      break;
  }
  if (bf16) {
    kernel = internal::MatmulBf16ActBlocksAmx;
    internal::PrepareBf16Activations(args);
  }
  if (kernel == internal::MatmulInt8ActGemmBlocksAmx ||
      kernel == internal::MatmulKQuantInt8ActBlocksAmx) {
    internal::PrepareAmxActivations(args);
  }
  const int64_t blocks = internal::NumRowBlocks(w.rows);
  // Threads split the output columns, so each weight byte is read by one thread only.
  // A chunk must be worth a thread wake-up: about 64 KiB of weights at least.
  const int64_t block_bytes = internal::BlockDataBytes(w.format, k) * std::max<int64_t>(1, params.m);
  const int64_t grain = std::max<int64_t>(1, (int64_t{64} << 10) / std::max<int64_t>(1, block_bytes));
  const int chunks_per_thread = params.m >= kBalancedMinTokens ? kBalancedChunksPerThread : 1;
  // The AVX2 int8-activation tile kernel reads NL4's codes itself (a byte shuffle per line):
  // GEMV at 1.3-1.5x the weights/s of widening first (1.7-1.9x INT8's), batches even. With
  // float activations both ways ran even (bench/results/cpu_kernels_avx2_gemv.json).
  const bool direct = kernel == internal::MatmulBlocksAvx2;
  if (!nl4 || direct) {
    pool.ParallelFor(
        blocks, grain, [&](int64_t begin, int64_t end) { kernel(args, begin, end); },
        chunks_per_thread);
    return absl::OkStatus();
  }
  // NL4: each thread widens its blocks to INT8 a few at a time, about 128 KiB (the
  // thread's L2 keeps them between the widening and the kernel), and runs the kernel
  // over them. DRAM gives half of INT8's bytes; a byte shuffle per 32 codes does the rest.
  const int64_t wide_block_bytes = internal::BlockDataBytes(WeightFormat::kInt8, k);
  const int64_t run = std::clamp<int64_t>((int64_t{128} << 10) / wide_block_bytes, 2, 64);
  const bool avx2 = isa != MatmulIsaChoice::kScalar;
  pool.ParallelFor(
      blocks, grain,
      [&](int64_t begin, int64_t end) {
        thread_local std::vector<uint8_t> wide;
        wide.resize(static_cast<size_t>(run * wide_block_bytes));
        internal::MatmulArgs widened = args;
        widened.expanded = wide.data();
        for (int64_t b = begin; b < end; b += run) {
          const int64_t b_end = std::min(end, b + run);
          if (avx2) {
            internal::ExpandNl4BlocksAvx2(w, b, b_end, wide.data());
          } else {
            internal::ExpandNl4BlocksScalar(w, b, b_end, wide.data());
          }
          widened.expanded_begin = b;
          kernel(widened, b, b_end);
        }
      },
      chunks_per_thread);
  return absl::OkStatus();
}

absl::Status MatmulReference(const MatmulParams& params) {
  if (absl::Status status = CheckParams(params); !status.ok()) return status;
  const PackedWeight& w = *params.weight;
  const int64_t n = w.rows, k = w.cols;
  const bool bf16 = params.activations == ActivationPrecision::kBf16;
  std::vector<float> row(k);
  std::vector<float> x_rounded;
  if (bf16) {
    x_rounded.resize(static_cast<size_t>(params.m * k));
    for (size_t i = 0; i < x_rounded.size(); ++i) x_rounded[i] = RoundToBf16(params.x[i]);
  }
  const float* x_all = bf16 ? x_rounded.data() : params.x;
  for (int64_t j = 0; j < n; ++j) {
    DequantizeRows(w, j, j + 1, row.data());
    if (bf16) {
      for (float& value : row) value = RoundToBf16(value);
    }
    for (int64_t t = 0; t < params.m; ++t) {
      const float* x = x_all + t * k;
      double sum = params.bias ? params.bias[j] : 0.0;
      for (int64_t c = 0; c < k; ++c) sum += static_cast<double>(row[c]) * x[c];
      params.y[t * n + j] = static_cast<float>(sum);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ActivationPrecision> ParseActivationPrecision(absl::string_view name) {
  if (name == "f32") return ActivationPrecision::kF32;
  if (name == "int8") return ActivationPrecision::kInt8;
  if (name == "bf16") return ActivationPrecision::kBf16;
  return absl::InvalidArgumentError(
      absl::StrFormat("activation precision must be f32, int8 or bf16, got '%s'", name));
}

const char* ActivationPrecisionName(ActivationPrecision precision) {
  switch (precision) {
    case ActivationPrecision::kInt8:
      return "int8";
    case ActivationPrecision::kBf16:
      return "bf16";
    case ActivationPrecision::kF32:
      break;
  }
  return "f32";
}

absl::Status ActivationPrecisionStatus(ActivationPrecision precision) {
  if (precision != ActivationPrecision::kBf16) return absl::OkStatus();
  // Decided once (cpuid and ActiveCpuIsa() do not change): Matmul asks on every call.
  static const absl::Status bf16 = []() -> absl::Status {
    // cpuid first: LOOM_CPU_ISA only caps what the CPU has.
    if (!__builtin_cpu_supports("amx-bf16") || !__builtin_cpu_supports("avx512bf16") ||
        !CpuSupportsIsa(CpuIsa::kAmx)) {
      return absl::FailedPreconditionError(
          "--activations bf16 needs Intel AMX-BF16 (Sapphire Rapids or later, with the kernel's "
          "permission for the tile state), which this CPU does not offer: use f32 or int8");
    }
    if (ActiveCpuIsa() < CpuIsa::kAmx) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "--activations bf16 runs on AMX tiles, but LOOM_CPU_ISA=%s caps the kernels below amx",
          CpuIsaName(ActiveCpuIsa())));
    }
    return absl::OkStatus();
  }();
  return bf16;
}

const char* MatmulIsa() {
  switch (ActiveIsa()) {
    case MatmulIsaChoice::kAvx512:
      return AmxActive() ? "avx512-vnni+amx" : "avx512-vnni";
    case MatmulIsaChoice::kAvx2:
      return "avx2";
    default:
      return "scalar";
  }
}

}  // namespace loom::kernels::cpu
