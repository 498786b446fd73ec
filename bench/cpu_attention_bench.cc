// CPU prefill attention benchmark: one causal prefill of 512, 2048 and 4096 tokens through
// PagedAttention on SmolLM2-135M's attention shape (9 query heads on 3 KV heads, head dim
// 64, blocks of 16), F16 and F32 KV cache, three ways in the same run:
//   one-row  the per-token kernel with a task per token (every K/V row read per token);
//   rows     the per-token kernel with multi-row tasks (AVX-512: TaskRows tokens share each
//            K/V row, the same bits; elsewhere the same as one-row) -- AVX-512's default;
//   tiled    the FlashAttention-style tiles (kernels/cpu/paged_attention_tiled.h) -- AVX2's
//            default.
// Figures: GFLOP/s (2 flops per multiply-add of q.k and p.v over the causal triangle), the
// ratio to the FMA peak measured in the same run (bench/machine_limits.h), and each against
// one-row. Decode steps (one query token per sequence: a one-row task, a one-row tile) are
// timed per-token and tiled, with F16, int8 and fp8_e4m3 KV (each 8-bit type also as a
// ratio to F16's time for the same step). Where the CPU has AMX-BF16, --activations bf16's
// AMX tiles (kernels/cpu/paged_attention_amx.cc) against the float kernel the same step runs
// by default: prefills of 512-4096 tokens and decode steps, F16 and F32 KV, beside the
// AMX-BF16 peak measured in the same run.
// Writes bench/results/cpu_attention.json (cpu_attention_<isa>.json when LOOM_CPU_ISA
// forces the ISA).
//
//   build/bench/cpu_attention_bench [--quick] [--threads N]

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_format.h"
#include "bench/machine_limits.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/paged_attention.h"
#include "kernels/cpu/paged_attention_internal.h"
#include "kernels/cpu/thread_pool.h"

namespace loom::bench {
namespace {

using kernels::cpu::KvDtype;
using kernels::cpu::KvLayerView;
using kernels::cpu::PagedAttentionParams;
using kernels::cpu::ThreadPool;

constexpr int64_t kHeads = 9, kKvHeads = 3, kHeadDim = 64, kBlockSize = 16;

struct Prefill {
  std::vector<uint8_t> k, v;
  std::vector<uint16_t> k_scale, v_scale;  // 8-bit KV
  std::vector<float> q, out;
  std::vector<int32_t> query_start, context_len, indptr, indices;
  PagedAttentionParams params;
};

// `seqs` sequences of `tokens` tokens each over shuffled block tables; `query` of each
// sequence's last tokens are in this step (all of them: a prefill; 1: a decode step).
void MakeStep(int64_t seqs, int64_t tokens, int64_t query, KvDtype dtype, Prefill& p) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t blocks_per_seq = (tokens + kBlockSize - 1) / kBlockSize;
  const int64_t blocks = seqs * blocks_per_seq;
  const int64_t slots = blocks * kBlockSize;
  const int64_t elems = slots * kKvHeads * kHeadDim;
  p.k.resize(elems * kernels::cpu::KvElementBytes(dtype));
  p.v.resize(p.k.size());
  p.k_scale.assign(kernels::cpu::IsQuantizedKv(dtype) ? slots * kKvHeads : 0, 0);
  p.v_scale.assign(p.k_scale.size(), 0);
  KvLayerView cache{p.k.data(),
                    p.v.data(),
                    dtype,
                    blocks,
                    kBlockSize,
                    kKvHeads,
                    kHeadDim,
                    p.k_scale.empty() ? nullptr : p.k_scale.data(),
                    p.v_scale.empty() ? nullptr : p.v_scale.data()};
  {  // every slot written as the worker writes it (F16 rounding, 8-bit codes and scales)
    std::vector<float> k(elems), v(elems);
    for (float& x : k) x = normal(rng);
    for (float& x : v) x = normal(rng);
    std::vector<int32_t> slot_ids(slots);
    for (int64_t i = 0; i < slots; ++i) slot_ids[i] = static_cast<int32_t>(i);
    if (!kernels::cpu::WriteKv(cache, k.data(), v.data(), slot_ids.data(), slots).ok()) {
      std::fprintf(stderr, "WriteKv failed\n");
      std::exit(1);
    }
  }
  p.q.resize(seqs * query * kHeads * kHeadDim);
  for (float& x : p.q) x = normal(rng) * 2.0f;
  p.out.assign(p.q.size(), 0.0f);
  p.query_start = {0};
  p.context_len.clear();
  p.indptr = {0};
  for (int64_t s = 0; s < seqs; ++s) {
    p.query_start.push_back(static_cast<int32_t>((s + 1) * query));
    p.context_len.push_back(static_cast<int32_t>(tokens));
    p.indptr.push_back(static_cast<int32_t>((s + 1) * blocks_per_seq));
  }
  p.indices.resize(blocks);
  for (int64_t b = 0; b < blocks; ++b) p.indices[b] = static_cast<int32_t>(b);
  std::shuffle(p.indices.begin(), p.indices.end(), rng);
  PagedAttentionParams& a = p.params;
  a.q = p.q.data();
  a.out = p.out.data();
  a.cache = cache;
  a.query_start = p.query_start.data();
  a.context_len = p.context_len.data();
  a.block_indptr = p.indptr.data();
  a.block_indices = p.indices.data();
  a.num_seqs = seqs;
  a.num_heads = kHeads;
  a.scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
}

// Median seconds of `repeats` calls (after one warm-up call).
double TimeAttention(const Prefill& p, ThreadPool& pool, int repeats) {
  if (!kernels::cpu::PagedAttention(p.params, pool).ok()) {
    std::fprintf(stderr, "PagedAttention failed\n");
    std::exit(1);
  }
  std::vector<double> seconds;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    (void)kernels::cpu::PagedAttention(p.params, pool);
    seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return Median(seconds);
}

// One prefill or decode step under a kernel choice: median seconds (its output in p.out).
double TimeUnder(Prefill& p, ThreadPool& pool, int repeats, kernels::cpu::internal::TileMode mode,
                 bool multi_row) {
  kernels::cpu::internal::SetTileModeForTesting(mode);
  kernels::cpu::internal::SetMultiRowTasksForTesting(multi_row);
  const double seconds = TimeAttention(p, pool, repeats);
  kernels::cpu::internal::SetTileModeForTesting(kernels::cpu::internal::TileMode::kAuto);
  kernels::cpu::internal::SetMultiRowTasksForTesting(true);
  return seconds;
}

// --activations bf16: the AMX-BF16 tiles against the float kernel the same step runs by
// default (the per-token kernel on AVX-512), prefill and decode, F16 and F32 KV, each beside
// the AMX-BF16 and FMA peaks; the JSON fields it adds ("" where the CPU has no AMX-BF16).
std::string Bf16Section(ThreadPool& pool, int threads, bool quick, double peak) {
  namespace cpu = kernels::cpu;
  std::string json;
  if (cpu::ActivationPrecisionStatus(cpu::ActivationPrecision::kBf16).ok()) {
    const double amx_peak = MeasurePeakAmxBf16Gflops(threads);
    std::printf(
        "\n--activations bf16: AMX-BF16 tiles vs the default float kernel (AMX-BF16 peak "
        "%.0f GFLOP/s)\n%-4s | %-14s | %9s | %9s %7s %6s %6s | %7s | %s\n",
        amx_peak, "kv", "seqs x context", "float ms", "bf16 ms", "GFLOP/s", "/amx", "/fma",
        "speedup", "max |diff| vs float");
    absl::StrAppendFormat(&json, ",\n  \"amx_bf16_peak_gflops\": %.1f,\n  \"bf16\": [\n", amx_peak);
    bool first = true;
    for (KvDtype dtype : {KvDtype::kF16, KvDtype::kBf16, KvDtype::kF32}) {
      for (const auto& [seqs, tokens, query] :
           std::vector<std::tuple<int64_t, int64_t, int64_t>>{{1, 512, 512},
                                                              {1, 2048, 2048},
                                                              {1, 4096, 4096},
                                                              {1, 512, 1},
                                                              {1, 4096, 1},
                                                              {16, 512, 1},
                                                              {64, 1024, 1}}) {
        Prefill p;
        MakeStep(seqs, tokens, query, dtype, p);
        // A prefill's causal triangle, or a decode step's query against every position.
        const double pairs = query == tokens ? tokens * (tokens + 1) / 2.0 : double(seqs) * tokens;
        const double flops = 2.0 * 2.0 * kHeadDim * kHeads * pairs;
        const int repeats = quick ? 3 : query > 1 ? (tokens >= 4096 ? 3 : 5) : 21;
        const double float_s =
            TimeUnder(p, pool, repeats, kernels::cpu::internal::TileMode::kAuto, true);
        const std::vector<float> float_out = p.out;
        p.params.activations = cpu::ActivationPrecision::kBf16;
        const double bf16_s =
            TimeUnder(p, pool, repeats, kernels::cpu::internal::TileMode::kAuto, true);
        double max_diff = 0;
        for (size_t i = 0; i < float_out.size(); ++i) {
          max_diff = std::max(max_diff, static_cast<double>(std::fabs(float_out[i] - p.out[i])));
        }
        const double gflops = flops / bf16_s / 1e9;
        const char* kv = cpu::KvDtypeName(dtype);
        const char* kind = query > 1 ? "prefill" : "decode";
        std::printf(
            "%-4s | %4lld x %-7lld | %9.3f | %9.3f %7.1f %6.3f %6.3f | %6.2fx | %.1e (%s)\n", kv,
            static_cast<long long>(seqs), static_cast<long long>(tokens), float_s * 1e3,
            bf16_s * 1e3, gflops, gflops / amx_peak, gflops / peak, float_s / bf16_s, max_diff,
            kind);
        absl::StrAppendFormat(
            &json,
            "%s    {\"kv_dtype\": \"%s\", \"kind\": \"%s\", \"seqs\": %d, \"context\": %d, "
            "\"repeats\": %d, \"float_ms\": %.4f, \"bf16_ms\": %.4f, \"bf16_gflops\": %.2f, "
            "\"bf16_ratio_amx_peak\": %.4f, \"bf16_ratio_fma_peak\": %.4f, \"speedup\": %.3f, "
            "\"max_abs_diff_vs_float\": %.3g}",
            first ? "" : ",\n", kv, kind, seqs, tokens, repeats, float_s * 1e3, bf16_s * 1e3,
            gflops, gflops / amx_peak, gflops / peak, float_s / bf16_s, max_diff);
        first = false;
      }
    }
    json += "\n  ]";
  }
  return json;
}

}  // namespace
}  // namespace loom::bench

int main(int argc, char** argv) {
  using namespace loom::bench;
  namespace cpu = loom::kernels::cpu;
  bool quick = false;
  int threads = 2;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) quick = true;
    if (std::strcmp(argv[i], "--threads") == 0 && i + 1 < argc) threads = std::atoi(argv[++i]);
  }
  const std::string cpu_model = CpuModel();
  const char* isa = cpu::CpuIsaName(cpu::ActiveCpuIsa());
  const double peak = MeasurePeakGflops(threads);
  std::printf("CPU prefill attention on %s, ISA %s, %d threads: FMA peak %.0f GFLOP/s\n",
              cpu_model.c_str(), isa, threads, peak);
  std::printf("shape: %lld heads on %lld KV heads, head dim %lld, blocks of %lld\n",
              static_cast<long long>(kHeads), static_cast<long long>(kKvHeads),
              static_cast<long long>(kHeadDim), static_cast<long long>(kBlockSize));
  std::printf("%-4s %6s | %-24s | %-24s | %-24s\n", "kv", "tokens", "one-row ms GFLOP/s /peak",
              "rows ms GFLOP/s /peak", "tiled ms GFLOP/s /peak");
  std::string json = absl::StrFormat(
      "{\n  \"benchmark\": \"cpu_attention\",\n  \"time\": \"%s\",\n  \"cpu\": \"%s\",\n"
      "  \"isa\": \"%s\",\n  \"threads\": %d,\n  \"statistic\": \"median\",\n"
      "  \"shape\": {\"heads\": %d, \"kv_heads\": %d, \"head_dim\": %d, \"block_size\": %d},\n"
      "  \"limits\": {\"fma_peak_gflops\": %.1f},\n  \"prefill\": [\n",
      UtcNow(), cpu_model, isa, threads, kHeads, kKvHeads, kHeadDim, kBlockSize, peak);
  ThreadPool pool(threads);
  const auto run = [&](Prefill& p, int repeats, cpu::internal::TileMode mode, bool multi_row) {
    return TimeUnder(p, pool, repeats, mode, multi_row);
  };
  bool first = true;
  for (KvDtype dtype : {KvDtype::kF16, KvDtype::kF32}) {
    for (int64_t tokens : {512, 2048, 4096}) {
      Prefill p;
      MakeStep(1, tokens, tokens, dtype, p);
      // q.k and p.v over the causal triangle: tokens (tokens + 1) / 2 pairs per head.
      const double flops = 2.0 * 2.0 * kHeadDim * kHeads * tokens * (tokens + 1) / 2.0;
      const int repeats = quick ? 2 : tokens >= 4096 ? 3 : 5;
      const double one_s = run(p, repeats, cpu::internal::TileMode::kOff, false);
      const std::vector<float> one_out = p.out;
      const double rows_s = run(p, repeats, cpu::internal::TileMode::kOff, true);
      const bool rows_same_bits = p.out == one_out;
      const double tiled_s = run(p, repeats, cpu::internal::TileMode::kOn, true);
      double max_diff = 0;
      for (size_t i = 0; i < one_out.size(); ++i) {
        max_diff = std::max(max_diff, static_cast<double>(std::fabs(one_out[i] - p.out[i])));
      }
      const double one_g = flops / one_s / 1e9, rows_g = flops / rows_s / 1e9,
                   tiled_g = flops / tiled_s / 1e9;
      const char* kv = dtype == KvDtype::kF16 ? "f16" : "f32";
      std::printf("%-4s %6lld | %8.2f %6.1f %5.3f       | %8.2f %6.1f %5.3f %4.2fx | %8.2f %6.1f "
                  "%5.3f %4.2fx  (rows: %s bits; tiled max |diff| %.1e)\n",
                  kv, static_cast<long long>(tokens), one_s * 1e3, one_g, one_g / peak,
                  rows_s * 1e3, rows_g, rows_g / peak, one_s / rows_s, tiled_s * 1e3, tiled_g,
                  tiled_g / peak, one_s / tiled_s, rows_same_bits ? "same" : "DIFFERENT",
                  max_diff);
      absl::StrAppendFormat(
          &json,
          "%s    {\"kv_dtype\": \"%s\", \"tokens\": %d, \"repeats\": %d, "
          "\"one_row_ms\": %.3f, \"one_row_gflops\": %.2f, \"one_row_ratio_peak\": %.4f, "
          "\"rows_ms\": %.3f, \"rows_gflops\": %.2f, \"rows_ratio_peak\": %.4f, "
          "\"rows_speedup\": %.3f, \"rows_same_bits\": %s, "
          "\"tiled_ms\": %.3f, \"tiled_gflops\": %.2f, \"tiled_ratio_peak\": %.4f, "
          "\"tiled_speedup\": %.3f, \"tiled_max_abs_diff\": %.3g}",
          first ? "" : ",\n", kv, tokens, repeats, one_s * 1e3, one_g, one_g / peak, rows_s * 1e3,
          rows_g, rows_g / peak, one_s / rows_s, rows_same_bits ? "true" : "false", tiled_s * 1e3,
          tiled_g, tiled_g / peak, one_s / tiled_s, max_diff);
      first = false;
    }
  }
  // Decode steps: one query token per sequence (the tiles take it as a one-row tile), for
  // each KV type; the 8-bit types also against F16's time for the same step.
  std::printf("\ndecode steps (1 query token per sequence)\n%-8s | %-14s | %9s | %9s | %6s | %s\n",
              "kv", "seqs x context", "per-token ms", "tiled ms", "tiled/per-token",
              "f16/this (per-token, tiled)");
  json += "\n  ],\n  \"decode\": [\n";
  first = true;
  for (const auto& [seqs, tokens] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 512}, {1, 4096}, {16, 512}, {64, 256}, {64, 1024}}) {
    double f16_old = 0, f16_new = 0;
    for (cpu::KvDtype dtype : {cpu::KvDtype::kF16, cpu::KvDtype::kInt8, cpu::KvDtype::kFp8E4m3}) {
      Prefill p;
      MakeStep(seqs, tokens, 1, dtype, p);
      const int repeats = quick ? 5 : 21;
      const double old_s = run(p, repeats, cpu::internal::TileMode::kOff, true);
      const double new_s = run(p, repeats, cpu::internal::TileMode::kOn, true);
      if (dtype == cpu::KvDtype::kF16) {
        f16_old = old_s;
        f16_new = new_s;
      }
      const char* kv = cpu::KvDtypeName(dtype);
      std::printf("%-8s | %4lld x %-7lld | %9.3f | %9.3f | %6.2fx | %.2fx, %.2fx\n", kv,
                  static_cast<long long>(seqs), static_cast<long long>(tokens), old_s * 1e3,
                  new_s * 1e3, old_s / new_s, f16_old / old_s, f16_new / new_s);
      absl::StrAppendFormat(&json,
                            "%s    {\"kv_dtype\": \"%s\", \"seqs\": %d, \"context\": %d, "
                            "\"repeats\": %d, \"per_token_ms\": %.4f, \"tiled_ms\": %.4f, "
                            "\"speedup\": %.3f, \"per_token_vs_f16\": %.3f, "
                            "\"tiled_vs_f16\": %.3f}",
                            first ? "" : ",\n", kv, seqs, tokens, repeats, old_s * 1e3, new_s * 1e3,
                            old_s / new_s, f16_old / old_s, f16_new / new_s);
      first = false;
    }
  }
  json += "\n  ]";
  json += Bf16Section(pool, threads, quick, peak);
  json += "\n}";
  const char* isa_env = std::getenv("LOOM_CPU_ISA");
  WriteResult(isa_env != nullptr && *isa_env != '\0' ? std::string("cpu_attention_") + isa
                                                     : std::string("cpu_attention"),
              json);
  return 0;
}
