#include "bench/machine_limits.h"

#include <immintrin.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "kernels/cpu/amx_tile_config.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/matmul.h"

namespace loom::bench {
namespace {

constexpr size_t kBufferBytes = size_t{512} << 20;  // far beyond any cache

template <typename Fn>
double TimeOnThreads(int threads, Fn&& fn) {
  std::vector<std::thread> pool;
  const auto start = std::chrono::steady_clock::now();
  for (int t = 1; t < threads; ++t) pool.emplace_back(fn, t);
  fn(0);
  for (std::thread& thread : pool) thread.join();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

__attribute__((target("avx512f"))) float FmaLoopAvx512(int64_t iterations) {
  __m512 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(0.001f * i);
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (int64_t it = 0; it < iterations; ++it) {
    // Fully unrolled so the 12 accumulators live in registers (12 independent chains
    // cover the FMA latency x throughput of current cores).
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  }
  __m512 sum = acc[0];
  for (int i = 1; i < 12; ++i) sum = _mm512_add_ps(sum, acc[i]);
  float lanes[16];
  _mm512_storeu_ps(lanes, sum);
  return lanes[0] + lanes[15];
}

__attribute__((target("avx2,fma"))) float FmaLoopAvx2(int64_t iterations) {
  __m256 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(0.001f * i);
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (int64_t it = 0; it < iterations; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  }
  float lanes[8];
  __m256 sum = acc[0];
  for (int i = 1; i < 12; ++i) sum = _mm256_add_ps(sum, acc[i]);
  _mm256_storeu_ps(lanes, sum);
  return lanes[0] + lanes[7];
}

// 12 independent chains of u8 x s8 dot products (VPDPBUSD): 64 multiply-adds each.
__attribute__((target("avx512f,avx512bw,avx512vnni"))) int32_t DotLoopVnni(int64_t iterations) {
  __m512i acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_epi32(i);
  const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-2);
  for (int64_t it = 0; it < iterations; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], a, b);
  }
  __m512i sum = acc[0];
  for (int i = 1; i < 12; ++i) sum = _mm512_add_epi32(sum, acc[i]);
  alignas(64) int32_t lanes[16];
  _mm512_store_si512(lanes, sum);
  return lanes[0] + lanes[15];
}

// The AMX peak loops' tiles: eight of 16 rows x 64 bytes, C (tmm0-3) zeroed, A (tmm4-5) and B
// (tmm6-7) loaded from the 1 KiB at `data`; EndAmxPeakLoop stores C tile 0 into `out` (16 x 16
// 4-byte values) and releases the tile state. Tile registers are architectural state, so the
// loop between the two calls works on what StartAmxPeakLoop left.
__attribute__((target("amx-tile"))) void StartAmxPeakLoop(const void* data) {
  LoadTileConfig(kernels::cpu::FullTileConfig());
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, data, 64);
  _tile_loadd(5, data, 64);
  _tile_loadd(6, data, 64);
  _tile_loadd(7, data, 64);
}
__attribute__((target("amx-tile"))) void EndAmxPeakLoop(void* out) {
  _tile_stored(0, out, 64);
  _tile_release();
}

// 4 independent C tiles of 16 x 16 int32 fed by TDPBSUD from 16 x 64-byte A and B tiles
// (16 x 16 x 64 = 16,384 multiply-adds each); the int8 peak of a core's AMX unit.
__attribute__((target("amx-tile,amx-int8"))) int32_t DotLoopAmx(int64_t iterations) {
  alignas(64) int8_t data[16 * 64];
  for (int i = 0; i < 16 * 64; ++i) data[i] = static_cast<int8_t>(i % 7 - 3);
  alignas(64) int32_t out[16 * 16];
  StartAmxPeakLoop(data);
  for (int64_t it = 0; it < iterations; ++it) {
    _tile_dpbsud(0, 4, 6);
    _tile_dpbsud(1, 4, 7);
    _tile_dpbsud(2, 5, 6);
    _tile_dpbsud(3, 5, 7);
  }
  EndAmxPeakLoop(out);
  return out[0] + out[255];
}

// The same with TDPBF16PS: 16 x 16 x 32 = 8,192 multiply-adds per instruction.
__attribute__((target("amx-tile,amx-bf16"))) float DotLoopAmxBf16(int64_t iterations) {
  alignas(64) uint16_t data[16 * 32];
  for (int i = 0; i < 16 * 32; ++i) data[i] = static_cast<uint16_t>(0x3f80 + i % 7);  // ~1.0
  alignas(64) float out[16 * 16];
  StartAmxPeakLoop(data);
  for (int64_t it = 0; it < iterations; ++it) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  EndAmxPeakLoop(out);
  return out[0] + out[255];
}

// The AVX2 int8 dot product (what llama.cpp's Q4 x Q8 and Loom's int8 path use without
// VNNI): u8 x s8 pairs summed to int16 (VPMADDUBSW), pairs of those to int32 (VPMADDWD),
// added: 32 multiply-adds per chain and iteration. Each chain's bytes are its own sum
// (so nothing is loop-invariant); 12 chains cover the 3-instruction latency.
__attribute__((target("avx2"))) int32_t DotLoopAvx2(int64_t iterations) {
  __m256i acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_epi32(i);
  const __m256i b = _mm256_set1_epi8(-2), ones = _mm256_set1_epi16(1);
  for (int64_t it = 0; it < iterations; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) {
      acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(_mm256_maddubs_epi16(acc[i], b), ones));
    }
  }
  __m256i sum = acc[0];
  for (int i = 1; i < 12; ++i) sum = _mm256_add_epi32(sum, acc[i]);
  alignas(32) int32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), sum);
  return lanes[0] + lanes[7];
}

// The standard output of `command` (a shell line) with trailing blanks removed; empty when
// it fails.
std::string CommandOutput(const std::string& command) {
  FILE* pipe = popen((command + " 2>/dev/null").c_str(), "r");
  if (pipe == nullptr) return "";
  std::string text;
  char buffer[256];
  while (size_t n = std::fread(buffer, 1, sizeof(buffer), pipe)) text.append(buffer, n);
  if (pclose(pipe) != 0) return "";
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  return text;
}

std::string ShellQuoted(const std::string& text) {
  std::string quoted = "'";
  for (char c : text) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

// `text` as a JSON string literal, or null when empty.
std::string JsonString(const std::string& text) {
  if (text.empty()) return "null";
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += ' ';
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// The checkout a result belongs to: LOOM_SOURCE_DIR (else the current directory) when it is
// a git checkout, else the one holding this executable (cpu_vs_llamacpp.py points
// LOOM_SOURCE_DIR at a scratch folder), else "".
std::string SourceCheckout() {
  const char* source = std::getenv("LOOM_SOURCE_DIR");
  std::vector<std::string> candidates = {source != nullptr && *source != '\0' ? source : "."};
  std::error_code error;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", error);
  if (!error) candidates.push_back(exe.parent_path().string());
  for (const std::string& dir : candidates) {
    if (!CommandOutput("git -C " + ShellQuoted(dir) + " rev-parse --git-dir").empty()) return dir;
  }
  return "";
}

const char* BestIsaName() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("amx-int8") && __builtin_cpu_supports("avx512vnni")) {
    return "amx_int8";
  }
  if (__builtin_cpu_supports("avx512vnni")) return "avx512_vnni";
  if (__builtin_cpu_supports("avx512f")) return "avx512f";
  if (__builtin_cpu_supports("avx2")) return "avx2";
  return "scalar";
}

}  // namespace

std::string ProvenanceJson() {
  const std::string checkout = SourceCheckout();
  std::string revision = "unknown", dirty = "false";
  if (!checkout.empty()) {
    const std::string git = "git -C " + ShellQuoted(checkout);
    revision = CommandOutput(git + " rev-parse HEAD");
    if (revision.empty()) revision = "unknown";
    if (!CommandOutput(git + " status --porcelain --untracked-files=no").empty()) dirty = "true";
  }
  const std::string gpus = CommandOutput("nvidia-smi --query-gpu=name --format=csv,noheader");
  const char* forced = std::getenv("LOOM_CPU_ISA");
  double load = -1.0;
  if (std::ifstream loadavg("/proc/loadavg"); !(loadavg >> load)) load = -1.0;
  const long cpus = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
  const bool quiet = load >= 0.0 && load < 0.5 * static_cast<double>(cpus);
  char load_text[32];
  std::snprintf(load_text, sizeof(load_text), "%.2f", load);
  return "{\"revision\": " + JsonString(revision) + ", \"dirty\": " + dirty +
         ", \"cpu\": " + JsonString(CpuModel()) + ", \"cpu_isa\": " + JsonString(BestIsaName()) +
         ", \"cpu_isa_forced\": " + JsonString(forced != nullptr ? forced : "") +
         ", \"gpu\": " + JsonString(gpus.substr(0, gpus.find('\n'))) +
         ", \"cpus\": " + std::to_string(cpus) +
         ", \"load_1min\": " + (load >= 0.0 ? std::string(load_text) : std::string("null")) +
         ", \"machine_quiet\": " + (quiet ? "true" : "false") + "}";
}

std::string WithProvenance(const std::string& json) {
  const size_t open = json.find('{');
  if (open == std::string::npos) return json;
  const size_t next = json.find_first_not_of(" \t\r\n", open + 1);
  const bool empty = next != std::string::npos && json[next] == '}';
  const bool newline = open + 1 < json.size() && json[open + 1] == '\n';
  return json.substr(0, open + 1) + "\n  \"provenance\": " + ProvenanceJson() +
         (empty ? "\n" : newline ? "," : ",\n ") + json.substr(open + 1);
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

double MeasurePeakAmxInt8Gmacs(int threads) {
  using kernels::cpu::CpuIsa;
  if (kernels::cpu::ActiveCpuIsa() < CpuIsa::kAmx) return 0.0;
  const int64_t iterations = 200'000;
  std::vector<int32_t> sink(threads);
  std::vector<double> rates;
  for (int r = 0; r < 5; ++r) {
    const double seconds = TimeOnThreads(threads, [&](int t) { sink[t] = DotLoopAmx(iterations); });
    rates.push_back(4.0 * 16 * 16 * 64 * iterations * threads / seconds / 1e9);
  }
  if (sink[0] == 42) std::puts("");
  return Median(rates);
}

double MeasurePeakAmxBf16Gflops(int threads) {
  if (!kernels::cpu::ActivationPrecisionStatus(kernels::cpu::ActivationPrecision::kBf16).ok()) {
    return 0.0;
  }
  const int64_t iterations = 200'000;
  std::vector<float> sink(threads);
  std::vector<double> rates;
  for (int r = 0; r < 5; ++r) {
    const double seconds =
        TimeOnThreads(threads, [&](int t) { sink[t] = DotLoopAmxBf16(iterations); });
    rates.push_back(2.0 * 4.0 * 16 * 16 * 32 * iterations * threads / seconds / 1e9);
  }
  if (sink[0] == 42.0f) std::puts("");
  return Median(rates);
}

double MeasurePeakInt8Gmacs(int threads) {
  using kernels::cpu::CpuIsa;
  const CpuIsa isa = kernels::cpu::ActiveCpuIsa();
  if (isa == CpuIsa::kScalar) return 0.0;
  const bool vnni = isa >= CpuIsa::kAvx512;
  const int64_t iterations = 20'000'000;
  std::vector<int32_t> sink(threads);
  std::vector<double> rates;
  for (int r = 0; r < 5; ++r) {
    const double seconds = TimeOnThreads(threads, [&](int t) {
      sink[t] = vnni ? DotLoopVnni(iterations) : DotLoopAvx2(iterations);
    });
    rates.push_back((vnni ? 64.0 : 32.0) * 12 * iterations * threads / seconds / 1e9);
  }
  if (sink[0] == 42) std::puts("");
  return Median(rates);
}

double MeasureCopyBandwidthGBs(int threads, int repeats) {
  std::vector<char> src(kBufferBytes, 1), dst(kBufferBytes, 0);
  const size_t chunk = kBufferBytes / threads;
  std::vector<double> rates;
  for (int r = 0; r < repeats; ++r) {
    const double seconds = TimeOnThreads(threads, [&](int t) {
      std::memcpy(dst.data() + t * chunk, src.data() + t * chunk, chunk);
    });
    rates.push_back(2.0 * kBufferBytes / seconds / 1e9);
  }
  return Median(rates);
}

double MeasureReadBandwidthGBs(int threads, int repeats) {
  std::vector<uint64_t> buffer(kBufferBytes / 8);
  for (size_t i = 0; i < buffer.size(); ++i) buffer[i] = i * 2654435761u;
  const size_t chunk = buffer.size() / threads;
  std::vector<uint64_t> sums(threads);
  std::vector<double> rates;
  for (int r = 0; r < repeats; ++r) {
    const double seconds = TimeOnThreads(threads, [&](int t) {
      const uint64_t* p = buffer.data() + t * chunk;
      uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      for (size_t i = 0; i + 4 <= chunk; i += 4) {
        s0 += p[i];
        s1 += p[i + 1];
        s2 += p[i + 2];
        s3 += p[i + 3];
      }
      sums[t] = s0 + s1 + s2 + s3;
    });
    rates.push_back(static_cast<double>(kBufferBytes) / seconds / 1e9);
  }
  if (sums[0] == 42) std::puts("");  // keep the sums alive
  return Median(rates);
}

double MeasurePeakGflops(int threads) {
  // The widest unit the kernels may use (LOOM_CPU_ISA caps it).
  const bool avx512 = kernels::cpu::ActiveCpuIsa() >= kernels::cpu::CpuIsa::kAvx512;
  const int lanes = avx512 ? 16 : 8;
  const int64_t iterations = 20'000'000;
  std::vector<float> sink(threads);
  std::vector<double> rates;
  for (int r = 0; r < 5; ++r) {
    const double seconds = TimeOnThreads(threads, [&](int t) {
      sink[t] = avx512 ? FmaLoopAvx512(iterations) : FmaLoopAvx2(iterations);
    });
    rates.push_back(2.0 * lanes * 12 * iterations * threads / seconds / 1e9);
  }
  if (sink[0] == 42.0f) std::puts("");
  return Median(rates);
}

int64_t LastLevelCacheBytes() {
  int64_t best = 0;
  for (int index = 0; index < 8; ++index) {
    std::ifstream file("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) +
                       "/size");
    std::string text;
    if (!(file >> text) || text.empty()) continue;
    int64_t value = std::atoll(text.c_str());
    if (text.back() == 'K') value <<= 10;
    if (text.back() == 'M') value <<= 20;
    best = std::max(best, value);
  }
  return best;
}

std::string CpuModel() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      return colon == std::string::npos ? line : line.substr(colon + 2);
    }
  }
  return "unknown CPU";
}

std::string UtcNow() {
  const std::time_t now = std::time(nullptr);
  char buffer[32];
  std::strftime(buffer, sizeof(buffer), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return buffer;
}

void WriteResult(const std::string& name, const std::string& json) {
  const char* source = std::getenv("LOOM_SOURCE_DIR");
  const std::string path = std::string(source ? source : ".") + "/bench/results/" + name + ".json";
  std::ofstream out(path);
  out << WithProvenance(json) << "\n";
  std::printf("wrote %s\n", out ? path.c_str() : "(failed to write the result)");
}

bool WriteGpuResult(const std::string& name, const std::string& json) {
  std::string dir;
  if (const char* out = std::getenv("OUT"); out != nullptr && *out != '\0') {
    dir = out;
  } else {
    const char* source = std::getenv("LOOM_SOURCE_DIR");
    dir = std::string(source ? source : ".") + "/bench/results/gpu";
  }
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  const std::string path = dir + "/" + name + ".json";
  std::ofstream file(path);
  file << WithProvenance(json);
  std::printf("wrote %s\n", file ? path.c_str() : "(failed to write the result)");
  return static_cast<bool>(file);
}

}  // namespace loom::bench
