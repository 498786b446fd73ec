#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::bench {

/// The median of `values` (the upper one of an even count); `values` must not be empty.
double Median(std::vector<double> values);

/// Memory copy bandwidth in GB/s (bytes read + bytes written per second) of a large
/// memcpy split over `threads` threads; median of `repeats` runs.
double MeasureCopyBandwidthGBs(int threads, int repeats = 7);

/// Read bandwidth in GB/s: summing a large buffer (what a GEMV over weights does), split
/// over `threads` threads; median of `repeats` runs.
double MeasureReadBandwidthGBs(int threads, int repeats = 7);

/// Peak F32 fused multiply-add rate in GFLOP/s (2 flops per FMA lane) on `threads`
/// threads, using the widest vector unit the kernels may use (AVX-512, else AVX2; see
/// LOOM_CPU_ISA in kernels/cpu/cpu_isa.h).
double MeasurePeakGflops(int threads);

/// Peak int8 multiply-accumulate rate in GMAC/s on `threads` threads: u8 x s8 dot
/// products, AVX-512 VNNI (VPDPBUSD) where the kernels use AVX-512, else AVX2
/// (VPMADDUBSW + VPMADDWD + VPADDD); 0 on the scalar ISA.
double MeasurePeakInt8Gmacs(int threads);

/// Peak int8 multiply-accumulate rate of the AMX unit in GMAC/s on `threads` threads:
/// TDPBSUD into four independent 16 x 16 tiles (K = 64); 0 unless the kernels run AMX
/// (ActiveCpuIsa() is kAmx).
double MeasurePeakAmxInt8Gmacs(int threads);

/// Peak BF16 rate of the AMX unit in GFLOP/s (2 flops per multiply-add) on `threads` threads:
/// TDPBF16PS into four independent 16 x 16 F32 tiles (K = 32); 0 unless the kernels may run
/// BF16 activations (kernels/cpu/matmul.h's ActivationPrecisionStatus).
double MeasurePeakAmxBf16Gflops(int threads);

/// Size of the largest CPU cache level in bytes (sysfs), 0 when unknown.
int64_t LastLevelCacheBytes();

/// "AMD EPYC 9R14 (2 threads)": the CPU model from /proc/cpuinfo.
std::string CpuModel();

/// UTC time as ISO 8601, for result files.
std::string UtcNow();

/// Where a figure came from, as a JSON object read now (the fields bench/provenance.py
/// writes for the Python benches): "revision" (`git rev-parse HEAD` of LOOM_SOURCE_DIR, else
/// the current directory, else the checkout holding this executable; "unknown" outside
/// one), "dirty" (tracked files changed), "cpu", "cpu_isa" (the best of avx512_vnni,
/// avx512f, avx2, scalar this CPU has), "cpu_isa_forced" (LOOM_CPU_ISA or null), "gpu"
/// (the first nvidia-smi name or null), "cpus", "load_1min" and "machine_quiet" (the
/// 1-minute load average below 0.5 per logical CPU).
std::string ProvenanceJson();

/// `json` (one JSON object) with "provenance": ProvenanceJson() as its first member.
std::string WithProvenance(const std::string& json);

/// Writes WithProvenance(`json`) to bench/results/<name>.json under the source tree
/// (LOOM_SOURCE_DIR or the current directory) and prints the path.
void WriteResult(const std::string& name, const std::string& json);

/// Writes a GPU benchmark's WithProvenance(`json`) to $OUT/<name>.json when OUT is set
/// (tests/gpu/quick.sh's work folder), else bench/results/gpu/<name>.json under the source
/// tree, creating the folder; prints the path. False when the file could not be written.
bool WriteGpuResult(const std::string& name, const std::string& json);

}  // namespace loom::bench
