// CPU kernel benchmark: GEMV weight-read bandwidth against the machine's memcpy
// bandwidth, batched-decode speedup, and GEMM GFLOP/s against the FMA peak (limits from
// bench/machine_limits.h, measured in the same run). INT8/INT4 weights run with both
// activation precisions: f32 ("a32", the default) and int8 ("a8"); for a32 a sweep over
// m compares the tile kernel with the GEMM kernel Matmul takes for batches. Writes
// bench/results/cpu_kernels.json (cpu_kernels_<isa>.json when LOOM_CPU_ISA forces the ISA).
// The a8gemm table compares the int8-activation tile kernel and GEMM (1 thread, CPU time)
// against the int8 dot peak (bench/machine_limits.h), weights in cache; the bf16gemm table
// BF16 activations on AMX against the f32 path and the AMX BF16 peak.
//
//   build/bench/cpu_kernels_bench [--quick] [--footprint-mib N]
//                                 [--section gemv|sweep|a8gemm|bf16gemm|gemm]
//   LOOM_BENCH_FORMAT=INT4 (or INT8,INT5) restricts the run to those weight formats.

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "bench/machine_limits.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_internal.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/weights.h"

namespace loom::bench {
namespace {

using kernels::cpu::ActivationPrecision;
using kernels::cpu::Matmul;
using kernels::cpu::MatmulParams;
using kernels::cpu::PackedWeight;
using kernels::cpu::ThreadPool;
using kernels::cpu::WeightFormat;

// A weight format and, for INT8/INT4, the activation precision it is multiplied with.
struct Format {
  const char* name;  // format name, e.g. "INT4"
  WeightFormat format;
  int64_t group;
  ActivationPrecision activations;
  const char* activation_name;  // "f32" or "int8"
};

const Format kFormats[] = {{"F32", WeightFormat::kF32, 0, ActivationPrecision::kF32, "f32"},
                           {"F16", WeightFormat::kF16, 0, ActivationPrecision::kF32, "f32"},
                           {"BF16", WeightFormat::kBf16, 0, ActivationPrecision::kF32, "f32"},
                           {"INT8", WeightFormat::kInt8, 32, ActivationPrecision::kF32, "f32"},
                           {"INT8", WeightFormat::kInt8, 32, ActivationPrecision::kInt8, "int8"},
                           {"INT4", WeightFormat::kInt4, 32, ActivationPrecision::kF32, "f32"},
                           {"INT4", WeightFormat::kInt4, 32, ActivationPrecision::kInt8, "int8"},
                           {"INT5", WeightFormat::kInt5, 32, ActivationPrecision::kF32, "f32"},
                           {"INT5", WeightFormat::kInt5, 32, ActivationPrecision::kInt8, "int8"},
                           // IQ4_NL / MXFP4 as packed by default (INT8 rows above: their
                           // wide form, the same values at twice the bytes)
                           {"NL4", WeightFormat::kNl4, 32, ActivationPrecision::kF32, "f32"},
                           {"NL4", WeightFormat::kNl4, 32, ActivationPrecision::kInt8, "int8"}};

// "INT4/a32": format and activation precision, as the tables print it.
std::string Label(const Format& f) {
  return absl::StrFormat("%s/a%s", f.name,
                         f.activations == ActivationPrecision::kF32 ? "32" : "8");
}

struct Shape {
  int64_t rows, cols;
  const char* what;
};

// SmolLM2-135M: hidden 576, FFN 1536, vocab 49152.
const Shape kShapes[] = {{576, 576, "attn o"},
                         {1536, 576, "ffn gate/up"},
                         {576, 1536, "ffn down"},
                         {49152, 576, "lm head"}};

double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::vector<float> RandomValues(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// Random IQ4_NL blocks (an F16 scale, 16 bytes of codes per 32 weights): NL4 has no rounding
// from floats, only GGUF's table formats.
absl::StatusOr<PackedWeight> RandomNl4(const Shape& s) {
  std::mt19937 rng(42);
  std::uniform_int_distribution<int> byte(0, 255);
  std::vector<uint8_t> blocks(s.rows * s.cols / 32 * 18);
  for (size_t b = 0; b < blocks.size(); b += 18) {
    const uint16_t scale = 0x2000 + static_cast<uint16_t>(byte(rng));  // ~0.008
    std::memcpy(&blocks[b], &scale, 2);
    for (size_t i = 2; i < 18; ++i) blocks[b + i] = static_cast<uint8_t>(byte(rng));
  }
  return kernels::cpu::PackWeight(common::GgmlType::kIQ4_NL, blocks.data(), s.rows, s.cols);
}

PackedWeight MakeWeight(const Format& f, const Shape& s) {
  const std::vector<float> values = RandomValues(s.rows * s.cols, 42);
  absl::StatusOr<PackedWeight> w =
      f.format == WeightFormat::kNl4
          ? RandomNl4(s)
          : kernels::cpu::PackFromF32(values.data(), s.rows, s.cols, f.format, f.group);
  if (!w.ok()) {
    std::fprintf(stderr, "pack failed: %s\n", w.status().ToString().c_str());
    std::exit(1);
  }
  return *std::move(w);
}

// Runs y = x W^T over `copies` (distinct weights, so a pass streams them from memory the
// way a decode step streams a model's layers); returns the median seconds per matmul.
double TimeMatmul(const std::vector<PackedWeight>& copies, ActivationPrecision activations,
                  int64_t m, ThreadPool& pool, int repeats) {
  const int64_t n = copies[0].rows, k = copies[0].cols;
  const std::vector<float> x = RandomValues(m * k, 7);
  std::vector<float> y(m * n);
  auto pass = [&] {
    for (const PackedWeight& w : copies) {
      const absl::Status status = Matmul(MatmulParams{x.data(), &w, nullptr, y.data(), m, activations}, pool);
      if (!status.ok()) {
        std::fprintf(stderr, "matmul failed: %s\n", status.ToString().c_str());
        std::exit(1);
      }
    }
  };
  pass();  // warm up (page faults, thread wake-up)
  std::vector<double> times;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    pass();
    times.push_back(Seconds(start) / static_cast<double>(copies.size()));
  }
  return Median(times);
}

// Process CPU seconds per Matmul on a 1-thread pool (runs on this thread): the least of 5
// timings of enough calls for ~0.2 G multiply-adds.
double CpuSecondsPerMatmul(const PackedWeight& w, ActivationPrecision activations, int64_t m,
                           ThreadPool& pool) {
  const std::vector<float> x = RandomValues(m * w.cols, 7);
  std::vector<float> y(m * w.rows);
  const MatmulParams params{x.data(), &w, nullptr, y.data(), m, activations};
  const int64_t calls = std::max<int64_t>(1, 200'000'000 / (m * w.rows * w.cols));
  auto cpu_now = [] {
    timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
  };
  if (!Matmul(params, pool).ok()) std::exit(1);  // warm up
  double best = 1e30;
  for (int r = 0; r < 5; ++r) {
    const double start = cpu_now();
    for (int64_t i = 0; i < calls; ++i) {
      if (!Matmul(params, pool).ok()) std::exit(1);
    }
    best = std::min(best, (cpu_now() - start) / static_cast<double>(calls));
  }
  return best;
}

// Enough copies of `w` that one pass reads `footprint` bytes (far beyond the LLC).
std::vector<PackedWeight> Copies(const PackedWeight& w, int64_t footprint) {
  const int64_t count = std::max<int64_t>(2, (footprint + w.bytes() - 1) / w.bytes());
  return std::vector<PackedWeight>(count, w);
}

// The run's command line: --quick, --footprint-mib N, --section NAME; LOOM_BENCH_FORMAT.
struct Options {
  bool quick = false;
  std::string section;                     // empty: every table
  int64_t footprint = int64_t{256} << 20;  // 8x a 32 MiB L3
  int repeats = 7;                         // 3 with --quick
  const char* only = nullptr;  // LOOM_BENCH_FORMAT, e.g. INT4 or INT8,INT5: those formats only
  bool Includes(const char* format) const {
    if (only == nullptr) return true;
    for (absl::string_view name : absl::StrSplit(only, ',')) {
      if (name == format) return true;
    }
    return false;
  }
  // Whether the table `name` runs (--section).
  bool Runs(const char* name) const { return section.empty() || section == name; }
};

Options ParseOptions(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) options.quick = true;
    // --footprint-mib 1: weights stay in cache (kernel compute rate, not memory).
    if (std::strcmp(argv[i], "--footprint-mib") == 0 && i + 1 < argc) {
      options.footprint = std::atoll(argv[++i]) << 20;
    }
    // --section sweep: run one table only (written to cpu_kernels[_<isa>]_sweep.json).
    if (std::strcmp(argv[i], "--section") == 0 && i + 1 < argc) options.section = argv[++i];
  }
  options.repeats = options.quick ? 3 : 7;
  options.only = std::getenv("LOOM_BENCH_FORMAT");
  return options;
}

constexpr int kThreadCounts[] = {1, 2};

// The machine's limits per thread count (indexed by 1 and 2), measured in this run.
struct Limits {
  double copy_bw[3] = {}, read_bw[3] = {}, peak[3] = {}, int8_peak[3] = {};
  double amx_int8_peak[3] = {};  // 0 unless the kernels run AMX
  double amx_bf16_peak[3] = {};  // GFLOP/s; 0 unless the kernels may run BF16 activations
};

Limits MeasureLimits() {
  Limits limits;
  for (int t : kThreadCounts) {
    limits.copy_bw[t] = MeasureCopyBandwidthGBs(t);
    limits.read_bw[t] = MeasureReadBandwidthGBs(t);
    limits.peak[t] = MeasurePeakGflops(t);
    limits.int8_peak[t] = MeasurePeakInt8Gmacs(t);
    limits.amx_int8_peak[t] = MeasurePeakAmxInt8Gmacs(t);
    limits.amx_bf16_peak[t] = MeasurePeakAmxBf16Gflops(t);
    std::printf(
        "threads %d: memcpy %.1f GB/s (read + write), read %.1f GB/s, FMA peak %.0f "
        "GFLOP/s, int8 dot peak %.0f GMAC/s, AMX int8 peak %.0f GMAC/s, AMX BF16 peak %.0f "
        "GFLOP/s\n",
        t, limits.copy_bw[t], limits.read_bw[t], limits.peak[t], limits.int8_peak[t],
        limits.amx_int8_peak[t], limits.amx_bf16_peak[t]);
  }
  return limits;
}

// GEMV (m = 1) of every format and shape, weights streamed from memory, 1 and 2 threads,
// against memcpy; the m = 16 batched speedup on 2 threads. Appends the "gemv" rows.
void RunGemv(const Options& options, const Limits& limits, std::string& json) {
  const int64_t footprint = options.footprint;
  const int repeats = options.repeats;
  std::printf("\nGEMV (m = 1), weights streamed from memory (%lld MiB per pass): GB/s of weight "
              "bytes read, ratio to memcpy of the same thread count; m=16 batched speedup\n",
              static_cast<long long>(footprint >> 20));
  std::printf("%-9s %-14s %7s | %8s %6s %8s %6s | %11s\n", "fmt", "shape", "MiB", "1T GB/s",
              "ratio", "2T GB/s", "ratio", "m16 speedup");
  bool first = true;
  for (const Format& f : kFormats) {
    if (!options.Includes(f.name)) continue;
    if (!options.Runs("gemv")) break;
    for (const Shape& s : kShapes) {
      const PackedWeight w = MakeWeight(f, s);
      const std::vector<PackedWeight> copies = Copies(w, footprint);
      double gbs[3] = {};
      double batched_speedup = 0.0;
      for (int t : kThreadCounts) {
        ThreadPool pool(t);
        const double seconds = TimeMatmul(copies, f.activations, 1, pool, repeats);
        gbs[t] = static_cast<double>(w.bytes()) / seconds / 1e9;
        if (t == 2) {
          const double seconds16 =
              TimeMatmul(copies, f.activations, 16, pool, std::max(3, repeats / 2));
          batched_speedup = 16.0 * seconds / seconds16;
        }
      }
      std::printf("%-9s %-14s %7.2f | %8.1f %6.2f %8.1f %6.2f | %10.1fx\n", Label(f).c_str(),
                  absl::StrFormat("%dx%d", s.rows, s.cols).c_str(), w.bytes() / 1048576.0, gbs[1],
                  gbs[1] / limits.copy_bw[1], gbs[2], gbs[2] / limits.copy_bw[2], batched_speedup);
      absl::StrAppendFormat(
          &json,
          "%s    {\"format\": \"%s\", \"activations\": \"%s\", \"rows\": %d, \"cols\": %d, "
          "\"what\": \"%s\", \"weight_bytes\": %d, \"gbs_1t\": %.2f, \"ratio_memcpy_1t\": %.3f, "
          "\"ratio_read_1t\": %.3f, \"gbs_2t\": %.2f, \"ratio_memcpy_2t\": %.3f, "
          "\"ratio_read_2t\": %.3f, \"m16_vs_m1_throughput_2t\": %.2f}",
          first ? "" : ",\n", f.name, f.activation_name, s.rows, s.cols, s.what, w.bytes(), gbs[1],
          gbs[1] / limits.copy_bw[1], gbs[1] / limits.read_bw[1], gbs[2],
          gbs[2] / limits.copy_bw[2], gbs[2] / limits.read_bw[2], batched_speedup);
      first = false;
    }
  }
}

// INT8/INT4 with float activations: the tile kernel (decodes in registers, per token
// tile) against the GEMM kernel (dequantizes each weight panel once per call) over m,
// weights streamed from memory, 2 threads; Matmul switches at F32ActGemmMinTokens().
// Appends the "f32act_kernel_sweep" rows.
void RunSweep(const Options& options, std::string& json) {
  namespace internal = loom::kernels::cpu::internal;
  const int repeats = options.repeats;
  std::printf(
      "\nINT8/INT4 a32 kernels over m, 2 threads, weights from memory: tokens/s "
      "relative to m = 1 on the tile kernel (Matmul takes GEMM at m >= %lld)\n",
      static_cast<long long>(internal::F32ActGemmMinTokens()));
  std::printf("%-9s %-14s %-5s |", "fmt", "shape", "kern");
  const int64_t sweep_ms[] = {1, 2, 4, 5, 8, 16, 32, 64};
  for (int64_t m : sweep_ms) std::printf(" %6s", absl::StrFormat("m%d", m).c_str());
  std::printf("\n");
  ThreadPool pool(2);
  bool first = true;
  for (const Format& f : kFormats) {
    if (!options.Includes(f.name)) continue;
    if (f.format != WeightFormat::kInt8 && f.format != WeightFormat::kInt4) continue;
    if (f.activations != ActivationPrecision::kF32) continue;
    for (const Shape& s : {kShapes[1], kShapes[3]}) {
      const PackedWeight w = MakeWeight(f, s);
      const std::vector<PackedWeight> copies = Copies(w, options.footprint);
      double single = 0.0;
      for (const char* kernel : {"tile", "gemm"}) {
        const bool gemm = std::strcmp(kernel, "gemm") == 0;
        internal::SetF32ActGemmMinTokensForTesting(gemm ? 1 : int64_t{1} << 40);
        std::printf("%-9s %-14s %-5s |", Label(f).c_str(),
                    absl::StrFormat("%dx%d", s.rows, s.cols).c_str(), kernel);
        std::string ratios;
        for (int64_t m : sweep_ms) {
          const double seconds =
              TimeMatmul(copies, f.activations, m, pool, std::max(3, repeats / 2));
          if (!gemm && m == 1) single = seconds;
          const double ratio = m * single / seconds;
          std::printf(" %6.2f", ratio);
          absl::StrAppendFormat(&ratios, "%s\"m%d\": %.3f", ratios.empty() ? "" : ", ", m, ratio);
        }
        std::printf("\n");
        absl::StrAppendFormat(&json,
                              "%s    {\"format\": \"%s\", \"rows\": %d, \"cols\": %d, "
                              "\"kernel\": \"%s\", \"tokens_per_s_vs_tile_m1\": {%s}}",
                              first ? "" : ",\n", f.name, s.rows, s.cols, kernel, ratios);
        first = false;
      }
      internal::SetF32ActGemmMinTokensForTesting(0);
    }
  }
}

// INT8/INT4 with int8 activations: the tile kernel against the int8-activation GEMM
// (same bits), weights in cache (one copy), 1 thread (the pool runs on the calling
// thread) timed in process CPU time, which a shared machine's other load disturbs far
// less than wall time: GMAC per CPU-second and the ratio to the 1-thread int8 dot peak
// measured above (VNNI on AVX-512, vpmaddubsw + vpmaddwd on AVX2; wall time). On an AMX
// CPU (LOOM_CPU_ISA unset or amx) the GEMM runs twice, on VNNI and on AMX (16-token tiles,
// m >= 16; the same bits): the AMX column's ratio is to the 1-thread AMX int8 peak (TDPBSUD
// at K = 64; the kernel's tiles are K = 32, one activation group), its speedup over the
// VNNI GEMM. Appends the "int8act_gemm" rows.
void RunA8Gemm(const Options& options, const Limits& limits, std::string& json) {
  namespace internal = loom::kernels::cpu::internal;
  const double* int8_peak = limits.int8_peak;
  std::printf(
      "\nINT8/INT4 a8 GEMM, 1 thread, weights in cache: GMAC per CPU-second and "
      "ratio to the 1-thread int8 dot peak (%.0f GMAC/s); Matmul takes the GEMM at "
      "m >= %lld\n",
      int8_peak[1], static_cast<long long>(internal::Int8ActGemmMinTokens()));
  const int64_t a8_ms[] = {1, 8, 64, 256};
  const bool amx = kernels::cpu::ActiveCpuIsa() >= kernels::cpu::CpuIsa::kAmx;
  const int num_kernels = amx ? 3 : 2;  // tile, gemm (VNNI), gemm on AMX
  std::printf("%-9s %-14s |", "fmt", "shape");
  for (int64_t m : a8_ms) {
    std::printf(" %-7s %5s %7s %5s %6s", absl::StrFormat("m%d tile", m).c_str(), "ratio", "gemm",
                "ratio", "speed");
    if (amx) std::printf(" %7s %5s %6s", "amx", "ratio", "/gemm");
    std::printf(" |");
  }
  std::printf("\n");
  ThreadPool pool(1);
  bool first = true;
  for (const Format& f : kFormats) {
    if (!options.Includes(f.name)) continue;
    // INT5 has the tile kernels only.
    if (f.activations != ActivationPrecision::kInt8 || f.format == WeightFormat::kInt5) continue;
    for (const Shape& s : {kShapes[1], kShapes[2]}) {
      const std::vector<PackedWeight> one = {MakeWeight(f, s)};
      // The two kernels alternate, round by round (this machine may be shared): medians
      // of each kernel's rounds, and of the per-round speedups.
      std::string cells[3], speedups, amx_speedups;
      std::printf("%-9s %-14s |", Label(f).c_str(),
                  absl::StrFormat("%dx%d", s.rows, s.cols).c_str());
      for (int64_t m : a8_ms) {
        std::vector<double> seconds[3], speedup, amx_speedup;
        for (int round = 0; round < (options.quick ? 3 : 7); ++round) {
          for (int kernel = 0; kernel < num_kernels; ++kernel) {  // 0 tile, 1 gemm, 2 amx
            internal::SetInt8ActGemmMinTokensForTesting(kernel >= 1 ? 1 : int64_t{1} << 40);
            internal::SetAmxAllowedForTesting(kernel == 2);
            seconds[kernel].push_back(CpuSecondsPerMatmul(one[0], f.activations, m, pool));
          }
          speedup.push_back(seconds[0].back() / seconds[1].back());
          if (amx) amx_speedup.push_back(seconds[1].back() / seconds[2].back());
        }
        internal::SetAmxAllowedForTesting(true);
        for (int kernel = 0; kernel < num_kernels; ++kernel) {
          const double gmacs =
              static_cast<double>(m) * s.rows * s.cols / Median(seconds[kernel]) / 1e9;
          const double limit = kernel == 2 ? limits.amx_int8_peak[1] : int8_peak[1];
          const double ratio = limit > 0 ? gmacs / limit : 0.0;
          std::printf(" %7.1f %5.2f", gmacs, ratio);
          if (kernel == 1) std::printf(" %5.2fx", Median(speedup));
          if (kernel == 2) std::printf(" %5.2fx", Median(amx_speedup));
          absl::StrAppendFormat(&cells[kernel], "%s\"gmacs_m%d\": %.1f, \"ratio_%s_m%d\": %.3f",
                                cells[kernel].empty() ? "" : ", ", m, gmacs,
                                kernel == 2 ? "amx_int8_peak" : "int8_peak", m, ratio);
        }
        std::printf(" |");
        absl::StrAppendFormat(&speedups, "%s\"m%d\": %.3f", speedups.empty() ? "" : ", ", m,
                              Median(speedup));
        if (amx) {
          absl::StrAppendFormat(&amx_speedups, "%s\"m%d\": %.3f", amx_speedups.empty() ? "" : ", ",
                                m, Median(amx_speedup));
        }
      }
      std::printf("\n");
      absl::StrAppendFormat(&json,
                            "%s    {\"format\": \"%s\", \"rows\": %d, \"cols\": %d, "
                            "\"threads\": 1, \"clock\": \"process_cpu_time\", "
                            "\"tile\": {%s}, \"gemm\": {%s}, "
                            "\"gemm_speedup_median\": {%s}%s}",
                            first ? "" : ",\n", f.name, s.rows, s.cols, cells[0], cells[1],
                            speedups,
                            amx ? absl::StrFormat(", \"amx\": {%s}, "
                                                  "\"amx_speedup_over_gemm_median\": {%s}",
                                                  cells[2], amx_speedups)
                                : "");
      first = false;
      internal::SetInt8ActGemmMinTokensForTesting(0);
    }
  }
}

// BF16 activations (AMX-BF16; skipped where the CPU lacks it) against the float-activation
// kernels Matmul takes by default, on F16, BF16 (read by the tiles as stored), INT8 and INT4
// weights: 1 thread, weights in cache,
// process CPU time as in RunA8Gemm; GFLOP per CPU-second, the BF16 column's ratio to the
// 1-thread AMX BF16 peak (TDPBF16PS) and its speedup over f32 (median of per-round ratios, the
// two alternating). Appends the "bf16_gemm" rows.
void RunBf16Gemm(const Options& options, const Limits& limits, std::string& json) {
  if (limits.amx_bf16_peak[1] <= 0) {
    std::printf(
        "\nBF16 GEMM: skipped (%s)\n",
        std::string(kernels::cpu::ActivationPrecisionStatus(ActivationPrecision::kBf16).message())
            .c_str());
    return;
  }
  std::printf(
      "\nBF16 activations on AMX, 1 thread, weights in cache: GFLOP per CPU-second of the f32 "
      "path and the bf16 one, bf16's ratio to the 1-thread AMX BF16 peak (%.0f GFLOP/s) and "
      "its speedup\n",
      limits.amx_bf16_peak[1]);
  const int64_t ms[] = {1, 16, 64, 256};
  std::printf("%-9s %-14s |", "fmt", "shape");
  for (int64_t m : ms) {
    std::printf(" %-8s %7s %5s %6s |", absl::StrFormat("m%d f32", m).c_str(), "bf16", "ratio",
                "speed");
  }
  std::printf("\n");
  ThreadPool pool(1);
  bool first = true;
  for (const Format& f : kFormats) {
    if (!options.Includes(f.name)) continue;
    if (f.activations != ActivationPrecision::kF32 || f.format == WeightFormat::kF32 ||
        f.format == WeightFormat::kInt5 || f.format == WeightFormat::kNl4) {
      continue;
    }
    for (const Shape& s : {kShapes[1], kShapes[2]}) {
      const PackedWeight w = MakeWeight(f, s);
      std::printf("%-9s %-14s |", Label(f).c_str(),
                  absl::StrFormat("%dx%d", s.rows, s.cols).c_str());
      std::string cells;
      for (int64_t m : ms) {
        std::vector<double> f32, bf16, speedup;
        for (int round = 0; round < (options.quick ? 3 : 7); ++round) {
          f32.push_back(CpuSecondsPerMatmul(w, ActivationPrecision::kF32, m, pool));
          bf16.push_back(CpuSecondsPerMatmul(w, ActivationPrecision::kBf16, m, pool));
          speedup.push_back(f32.back() / bf16.back());
        }
        const double flops = 2.0 * m * s.rows * s.cols;
        const double f32_gflops = flops / Median(f32) / 1e9,
                     bf16_gflops = flops / Median(bf16) / 1e9;
        const double ratio = bf16_gflops / limits.amx_bf16_peak[1];
        std::printf(" %8.1f %7.1f %5.3f %5.2fx |", f32_gflops, bf16_gflops, ratio, Median(speedup));
        absl::StrAppendFormat(&cells,
                              "%s\"m%d\": {\"f32_gflops\": %.1f, \"bf16_gflops\": %.1f, "
                              "\"ratio_amx_bf16_peak\": %.4f, \"speedup_median\": %.3f}",
                              cells.empty() ? "" : ", ", m, f32_gflops, bf16_gflops, ratio,
                              Median(speedup));
      }
      std::printf("\n");
      absl::StrAppendFormat(&json,
                            "%s    {\"format\": \"%s\", \"rows\": %d, \"cols\": %d, "
                            "\"threads\": 1, \"clock\": \"process_cpu_time\", %s}",
                            first ? "" : ",\n", f.name, s.rows, s.cols, cells);
      first = false;
    }
  }
}

// GEMM at m = 64 and 256 of every format and shape, 2 threads, against the 2-thread FMA
// peak. Appends the "gemm" rows.
void RunGemm(const Options& options, const Limits& limits, std::string& json) {
  const double* peak = limits.peak;
  std::printf("\nGEMM, 2 threads: GFLOP/s and ratio to the 2-thread FMA peak (%.0f GFLOP/s)\n",
              peak[2]);
  std::printf("%-9s %-14s | %9s %6s | %9s %6s\n", "fmt", "shape", "m64", "ratio", "m256",
              "ratio");
  bool first = true;
  ThreadPool pool(2);
  for (const Format& f : kFormats) {
    if (!options.Includes(f.name)) continue;
    if (!options.Runs("gemm")) break;
    for (const Shape& s : kShapes) {
      const std::vector<PackedWeight> one = {MakeWeight(f, s)};
      double gflops[2];
      const int64_t ms[2] = {64, 256};
      for (int i = 0; i < 2; ++i) {
        const double seconds = TimeMatmul(one, f.activations, ms[i], pool, options.quick ? 2 : 3);
        gflops[i] = 2.0 * ms[i] * s.rows * s.cols / seconds / 1e9;
      }
      std::printf("%-9s %-14s | %9.1f %6.2f | %9.1f %6.2f\n", Label(f).c_str(),
                  absl::StrFormat("%dx%d", s.rows, s.cols).c_str(), gflops[0],
                  gflops[0] / peak[2], gflops[1], gflops[1] / peak[2]);
      absl::StrAppendFormat(&json,
                            "%s    {\"format\": \"%s\", \"activations\": \"%s\", "
                            "\"rows\": %d, \"cols\": %d, \"threads\": 2, "
                            "\"gflops_m64\": %.1f, \"ratio_peak_m64\": %.3f, \"gflops_m256\": "
                            "%.1f, \"ratio_peak_m256\": %.3f}",
                            first ? "" : ",\n", f.name, f.activation_name, s.rows, s.cols,
                            gflops[0], gflops[0] / peak[2], gflops[1], gflops[1] / peak[2]);
      first = false;
    }
  }
}

}  // namespace
}  // namespace loom::bench

int main(int argc, char** argv) {
  using namespace loom::bench;
  const Options options = ParseOptions(argc, argv);
  const std::string cpu = CpuModel();
  std::printf("CPU kernels benchmark on %s, matmul ISA %s\n", cpu.c_str(),
              loom::kernels::cpu::MatmulIsa());
  const Limits limits = MeasureLimits();

  std::string json = absl::StrFormat(
      "{\n  \"benchmark\": \"cpu_kernels\",\n  \"time\": \"%s\",\n  \"cpu\": \"%s\",\n"
      "  \"matmul_isa\": \"%s\",\n  \"threads\": [1, 2],\n  \"repeats\": %d,\n"
      "  \"statistic\": \"median\",\n  \"limits\": {\n",
      UtcNow(), cpu, loom::kernels::cpu::MatmulIsa(), options.repeats);
  for (int t : kThreadCounts) {
    absl::StrAppendFormat(&json,
                          "    \"threads_%d\": {\"memcpy_gbs\": %.2f, \"read_gbs\": %.2f, "
                          "\"fma_peak_gflops\": %.1f, \"int8_peak_gmacs\": %.1f, "
                          "\"amx_int8_peak_gmacs\": %.1f, \"amx_bf16_peak_gflops\": %.1f}%s\n",
                          t, limits.copy_bw[t], limits.read_bw[t], limits.peak[t],
                          limits.int8_peak[t], limits.amx_int8_peak[t], limits.amx_bf16_peak[t],
                          t == 2 ? "" : ",");
  }
  json += "  },\n  \"gemv\": [\n";
  RunGemv(options, limits, json);
  json += "\n  ],\n  \"f32act_kernel_sweep\": [\n";
  if (options.Runs("sweep")) RunSweep(options, json);
  json += "\n  ],\n  \"int8act_gemm\": [\n";
  if (options.Runs("a8gemm")) RunA8Gemm(options, limits, json);
  json += "\n  ],\n  \"bf16_gemm\": [\n";
  if (options.Runs("bf16gemm")) RunBf16Gemm(options, limits, json);
  json += "\n  ],\n  \"gemm\": [\n";
  RunGemm(options, limits, json);
  json += "\n  ]\n}";
  const char* isa_env = std::getenv("LOOM_CPU_ISA");
  // One section only: its own file (cpu_kernels_avx2_a8gemm.json), not the full run's.
  WriteResult((isa_env != nullptr && *isa_env != '\0'
                   ? std::string("cpu_kernels_") +
                         loom::kernels::cpu::CpuIsaName(loom::kernels::cpu::ActiveCpuIsa())
                   : std::string("cpu_kernels")) +
                  (options.section.empty() ? "" : "_" + options.section),
              json);
  return 0;
}
