// End-to-end CPU engine speed on a real model (default: the bundled SmolLM2-135M):
// single-stream decode against the memory bandwidth measured in the same run, prefill
// GFLOP/s against the measured FMA peak, and batched decode throughput at 1/4/16/64
// sequences against single-stream. Writes bench/results/engine_cpu.json (engine_cpu_int8
// with --activations int8, engine_cpu_bf16 with bf16; then the model file's stem when --model
// is not the default; _kv<type> for a --kv-dtype other than auto; with _<isa> appended when
// LOOM_CPU_ISA forces the ISA, e.g.
// LOOM_CPU_ISA=avx2 engine_bench -> engine_cpu_avx2.json).
//
// usage: engine_bench [--model PATH] [--threads N] [--activations int8|f32|bf16]
//                     [--decode-tokens N]  (tokens per sequence in the decode figures; 64)
//                     [--only-batch N]  (just N-sequence decode, three times: for perf)
//                     [--only-prefill N]  (just an N-token prefill, median of 3, with the
//                                          per-token and the tiled CPU attention)
//                     [--attention per-token]  (the CPU attention without tiles throughout)
//                     [--bf16-attention float]  (--activations bf16's attention in float)
//                     [--kv-dtype bf16]  (the KV cache's type, as the worker's flag; auto)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"
#include "bench/machine_limits.h"
#include "bench/random_prompt.h"
#include "cli/local_engine.h"
#include "common/formats/gguf_file.h"
#include "common/formats/model_config.h"
#include "common/tokenizer/tokenizer.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/paged_attention_internal.h"
#include "worker/cpu_forward_pass.h"
#include "worker/model_step_backend.h"
#include "worker/step_backend_factory.h"

namespace {

using loom::cli::EngineRequest;
using loom::cli::EngineResult;
using loom::cli::LocalEngine;

// Runs `requests` through the engine (exits on failure).
std::vector<EngineResult> Generate(LocalEngine& engine, const std::vector<EngineRequest>& requests) {
  auto results = engine.Generate(requests);
  if (!results.ok()) {
    std::fprintf(stderr, "generate failed: %s\n", results.status().ToString().c_str());
    std::exit(1);
  }
  return *std::move(results);
}

// Prompt tokens of each decode figure's sequences: 8, as bench/cpu_vs_llamacpp.py gives
// llama.cpp, so both engines decode over the same context lengths.
constexpr int kDecodePromptTokens = 8;
constexpr int kMaxDecodeBatch = 64;

// Decode tokens/s of `batch` sequences generating `tokens` each (after their prefill): the
// tokens decoded over the wall time of the engine steps that computed no prompt token.
double DecodeRate(LocalEngine& engine, int batch, int tokens) {
  std::vector<EngineRequest> requests;
  for (int i = 0; i < batch; ++i) {
    EngineRequest request;
    request.prompt_ids =
        loom::bench::RandomPrompt(kDecodePromptTokens, engine.config().vocab_size, i + 1);
    request.sampling.temperature = 0.0f;
    request.max_tokens = tokens;
    request.ignore_eos = true;
    requests.push_back(std::move(request));
  }
  double seconds = 0;
  int64_t decoded = 0;
  for (const EngineResult& result : Generate(engine, requests)) {
    seconds = std::max(seconds, result.decode_seconds);
    decoded += static_cast<int64_t>(result.outputs.size()) - 1;  // the first came from prefill
  }
  return decoded / seconds;
}

// Multiply-adds of one token through every matrix (LM head included) ×2 = FLOPs.
double MatmulFlopsPerToken(const loom::model::ModelWeights& weights) {
  double macs = 0;
  for (const auto& layer : weights.layers) {
    for (const auto* w : {&layer.qkv, &layer.attn_output, &layer.gate_up, &layer.down}) {
      macs += static_cast<double>(w->rows) * w->cols;
    }
  }
  return 2 * macs;
}

// The command line (LOOM_MODEL_PATH: the default model).
struct Flags {
  std::string model_path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
  int threads = 2;
  std::string activations = "f32";  // the worker's default
  int only_batch = 0;
  int only_prefill = 0;
  int decode_tokens = 64;
  std::string kv_dtype = "auto";  // the worker's default (worker::ResolveKvDtype)
};

// Parses the command line into `flags`; the exit code when the bench must not run (the
// usage printed: --help, an unknown flag or a missing value).
std::optional<int> ParseFlags(int argc, char** argv, Flags& flags) {
  if (const char* env = std::getenv("LOOM_MODEL_PATH")) flags.model_path = env;
  constexpr const char* kUsage =
      "usage: engine_bench [--model PATH] [--threads N] [--activations int8|f32|bf16]\n"
      "                    [--decode-tokens N] [--only-batch N] [--only-prefill N]\n"
      "                    [--attention per-token|tiled] [--bf16-attention amx|float]\n"
      "                    [--kv-dtype auto|f16|bf16|f32|int8|fp8_e4m3]\n";
  static constexpr const char* kFlags[] = {"--model",         "--threads",        "--activations",
                                           "--only-batch",    "--only-prefill",   "--attention",
                                           "--decode-tokens", "--bf16-attention", "--kv-dtype"};
  // Every argument is a known flag with a value: anything else (--help included) prints
  // the usage instead of running the whole bench and overwriting its results.
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    const bool known = std::find(std::begin(kFlags), std::end(kFlags), flag) != std::end(kFlags);
    if (!known || i + 1 >= argc) {
      std::fputs(kUsage, known || flag == "--help" || flag == "-h" ? stdout : stderr);
      return flag == "--help" || flag == "-h" ? 0 : 2;
    }
    if (flag == "--model") flags.model_path = argv[i + 1];
    if (flag == "--threads") flags.threads = std::atoi(argv[i + 1]);
    if (flag == "--activations") flags.activations = argv[i + 1];
    if (flag == "--only-batch") flags.only_batch = std::atoi(argv[i + 1]);
    if (flag == "--only-prefill") flags.only_prefill = std::atoi(argv[i + 1]);
    if (flag == "--attention") {
      // per-token or tiled for every token (each ISA's default otherwise; AVX-512 has tiles
      // only when asked).
      const std::string mode = argv[i + 1];
      if (mode != "per-token" && mode != "tiled") {
        std::fputs(kUsage, stderr);
        return 2;
      }
      loom::kernels::cpu::internal::SetTileModeForTesting(
          mode == "tiled" ? loom::kernels::cpu::internal::TileMode::kOn
                          : loom::kernels::cpu::internal::TileMode::kOff);
    }
    if (flag == "--bf16-attention") {
      // amx (the default) or float: --activations bf16's attention as before its AMX tiles.
      const std::string mode = argv[i + 1];
      if (mode != "amx" && mode != "float") {
        std::fputs(kUsage, stderr);
        return 2;
      }
      loom::kernels::cpu::internal::SetAmxBf16AttentionForTesting(mode == "amx");
    }
    if (flag == "--decode-tokens") flags.decode_tokens = std::max(1, std::atoi(argv[i + 1]));
    if (flag == "--kv-dtype") flags.kv_dtype = argv[i + 1];
  }
  return std::nullopt;
}

// --only-prefill: one prompt of `tokens` tokens (in chunks of the engine's token budget),
// with prefill attention in the per-token kernel (multi-row tasks on AVX-512) and in tiles,
// the median of three runs each.
void RunOnlyPrefill(LocalEngine& engine, const loom::worker::CpuForwardPass& forward_pass,
                    int only_prefill) {
  EngineRequest request;
  request.prompt_ids =
      loom::bench::RandomPrompt(only_prefill, forward_pass.config().vocab_size, 99);
  request.sampling.temperature = 0.0f;
  request.max_tokens = 1;
  request.ignore_eos = true;
  for (bool tiled : {false, true}) {
    loom::kernels::cpu::internal::SetTileModeForTesting(
        tiled ? loom::kernels::cpu::internal::TileMode::kOn
              : loom::kernels::cpu::internal::TileMode::kOff);
    std::vector<double> seconds;
    for (int r = 0; r < 3; ++r) seconds.push_back(Generate(engine, {request})[0].prefill_seconds);
    const double median = loom::bench::Median(seconds);
    std::printf(
        "prefill, %d tokens, %s attention, CPU ISA %s: %.1f tokens/s (median of 3: "
        "%.3f s; runs %.3f %.3f %.3f)\n",
        only_prefill, tiled ? "tiled" : "per-token",
        loom::kernels::cpu::CpuIsaName(loom::kernels::cpu::ActiveCpuIsa()), only_prefill / median,
        median, seconds[0], seconds[1], seconds[2]);
  }
}

// The machine's limits at the bench's thread count, measured in this run.
struct Limits {
  double copy_gbs = 0, read_gbs = 0, peak_gflops = 0, peak_int8_gmacs = 0;
  double peak_amx_int8_gmacs = 0;  // 0 unless the kernels run AMX
  double peak_amx_bf16_gflops = 0;  // 0 unless they may run BF16 activations
};

Limits MeasureLimits(int threads) {
  Limits limits;
  limits.copy_gbs = loom::bench::MeasureCopyBandwidthGBs(threads);
  limits.read_gbs = loom::bench::MeasureReadBandwidthGBs(threads);
  limits.peak_gflops = loom::bench::MeasurePeakGflops(threads);
  limits.peak_int8_gmacs = loom::bench::MeasurePeakInt8Gmacs(threads);
  limits.peak_amx_int8_gmacs = loom::bench::MeasurePeakAmxInt8Gmacs(threads);
  limits.peak_amx_bf16_gflops = loom::bench::MeasurePeakAmxBf16Gflops(threads);
  std::printf(
      "limits: memcpy %.1f GB/s (read+write), read %.1f GB/s, FMA peak %.0f GFLOP/s, "
      "int8 dot peak %.0f GMAC/s, AMX int8 peak %.0f GMAC/s, AMX BF16 peak %.0f GFLOP/s\n",
      limits.copy_gbs, limits.read_gbs, limits.peak_gflops, limits.peak_int8_gmacs,
      limits.peak_amx_int8_gmacs, limits.peak_amx_bf16_gflops);
  return limits;
}

// Single-stream decode: every step reads all weights once.
struct SingleDecode {
  double bytes_per_token = 0;
  double tokens_per_s = 0;  // median of 3
  double gbs = 0;           // weight bytes read per second
};

SingleDecode MeasureSingleDecode(LocalEngine& engine,
                                 const loom::worker::CpuForwardPass& forward_pass,
                                 int decode_tokens, const Limits& limits) {
  SingleDecode decode;
  decode.bytes_per_token = static_cast<double>(forward_pass.weights().BytesPerDecodeStep());
  std::vector<double> single;
  for (int r = 0; r < 3; ++r) single.push_back(DecodeRate(engine, 1, decode_tokens));
  decode.tokens_per_s = loom::bench::Median(single);
  decode.gbs = decode.tokens_per_s * decode.bytes_per_token / 1e9;
  std::printf(
      "decode, 1 sequence: %.1f tokens/s x %.1f MB/token = %.2f GB/s = %.2f of memcpy, %.2f of "
      "read bandwidth\n",
      decode.tokens_per_s, decode.bytes_per_token / 1e6, decode.gbs, decode.gbs / limits.copy_gbs,
      decode.gbs / limits.read_gbs);
  return decode;
}

// Prefill of a 512-token prompt in one step (the engine's token budget is 512).
struct Prefill {
  double tokens_per_s = 0;  // 512 over the median of 3 runs' prefill seconds
  double gflops = 0;        // the matmuls' and attention's
  double vs_fma_peak = 0;
  double vs_int8_peak = 0;
  double vs_amx_bf16_peak = 0;  // 0 without AMX-BF16
};

Prefill MeasurePrefill(LocalEngine& engine, const loom::worker::CpuForwardPass& forward_pass,
                       const Limits& limits) {
  const auto& config = forward_pass.config();
  const int64_t prefill_len = 512;
  EngineRequest prefill;
  prefill.prompt_ids = loom::bench::RandomPrompt(prefill_len, config.vocab_size, 99);
  prefill.sampling.temperature = 0.0f;
  prefill.max_tokens = 1;
  prefill.ignore_eos = true;
  std::vector<double> prefill_times;
  for (int r = 0; r < 3; ++r) {
    prefill_times.push_back(Generate(engine, {prefill})[0].prefill_seconds);
  }
  const double prefill_seconds = loom::bench::Median(prefill_times);
  const double attention_flops = 4.0 * config.num_layers * config.num_heads * config.head_dim *
                                 (prefill_len * (prefill_len + 1) / 2.0);
  const double prefill_flops =
      MatmulFlopsPerToken(forward_pass.weights()) * prefill_len + attention_flops;
  const double prefill_gflops = prefill_flops / prefill_seconds / 1e9;
  // With int8 activations the matmuls run on integer dot products: their peak is the
  // limit that applies (attention stays float).
  const double prefill_vs_int8 =
      limits.peak_int8_gmacs > 0 ? prefill_gflops / 2 / limits.peak_int8_gmacs : 0.0;
  // With BF16 activations, the AMX unit's BF16 rate.
  const double prefill_vs_bf16 =
      limits.peak_amx_bf16_gflops > 0 ? prefill_gflops / limits.peak_amx_bf16_gflops : 0.0;
  std::printf(
      "prefill, 512 tokens: %.1f tokens/s, %.1f GFLOP/s = %.3f of FMA peak, %.3f of "
      "int8 dot peak, %.3f of AMX BF16 peak\n",
      prefill_len / prefill_seconds, prefill_gflops, prefill_gflops / limits.peak_gflops,
      prefill_vs_int8, prefill_vs_bf16);
  return {prefill_len / prefill_seconds, prefill_gflops, prefill_gflops / limits.peak_gflops,
          prefill_vs_int8, prefill_vs_bf16};
}

// Batched decode at 1, 4, 16 and kMaxDecodeBatch sequences against single-stream, and the
// matmuls' rate against `matmul_peak_gmacs` (the limit of this activation mode). Returns
// the JSON array's elements.
std::string MeasureBatchedDecode(LocalEngine& engine, int decode_tokens, double decode_tps,
                                 double macs_per_token, double matmul_peak_gmacs,
                                 const char* peak_name) {
  auto vs_matmul_peak = [&](double tokens_per_s) {
    return matmul_peak_gmacs > 0 ? tokens_per_s * macs_per_token / 1e9 / matmul_peak_gmacs : 0.0;
  };
  std::string batched_json;
  std::printf("batched decode (%d tokens each):\n", decode_tokens);
  for (int batch : {1, 4, 16, kMaxDecodeBatch}) {
    const double tps = batch == 1 ? decode_tps : DecodeRate(engine, batch, decode_tokens);
    std::printf("  %2d sequences: %7.1f tokens/s = %.2fx single-stream; matmuls %.0f GMAC/s = %.2f of %s\n",
                batch, tps, tps / decode_tps, tps * macs_per_token / 1e9, vs_matmul_peak(tps),
                peak_name);
    batched_json += absl::StrFormat(
        "%s{\"sequences\": %d, \"tokens_per_s\": %.2f, \"vs_single\": %.3f, "
        "\"matmul_gmacs\": %.1f, \"vs_matmul_peak\": %.3f}",
        batched_json.empty() ? "" : ", ", batch, tps, tps / decode_tps,
        tps * macs_per_token / 1e9, vs_matmul_peak(tps));
  }
  return batched_json;
}

// Every figure of the full run, for the result file.
struct Figures {
  Limits limits;
  int64_t llc_bytes = 0;
  bool weights_in_llc = false;
  SingleDecode decode;
  Prefill prefill;
  std::string batched_json;
};

// engine_cpu.json for the default (F32 activations), engine_cpu_int8.json for int8
// (engine_cpu_bf16.json for bf16); with _<model file stem, lower case> after it for a model
// other than the default one (so that such a run leaves the default model's figures alone),
// _kv<type> for a --kv-dtype other than auto, and _<isa> appended when LOOM_CPU_ISA forced it:
// engine_cpu_int8_default-q4_k_m_avx512.json.
void WriteEngineResult(const Flags& flags, const char* cpu_isa, bool isa_forced,
                       const Figures& figures) {
  const Limits& limits = figures.limits;
  const SingleDecode& decode = figures.decode;
  std::string result_name =
      flags.activations == "f32" ? "engine_cpu" : "engine_cpu_" + flags.activations;
  if (flags.model_path != Flags().model_path) {
    result_name +=
        "_" + absl::AsciiStrToLower(std::filesystem::path(flags.model_path).stem().string());
  }
  if (flags.kv_dtype != Flags().kv_dtype) result_name += "_kv" + flags.kv_dtype;
  if (isa_forced) result_name += std::string("_") + cpu_isa;
  loom::bench::WriteResult(
      result_name,
      absl::StrFormat(
          "{\"benchmark\": \"engine_cpu\", \"date\": \"%s\", \"cpu\": \"%s\", \"threads\": %d, "
          "\"model\": \"%s\", \"cpu_isa\": \"%s\", \"cpu_isa_forced\": %s, "
          "\"matmul_isa\": \"%s\", \"activations\": \"%s\",\n"
          " \"limits\": {\"memcpy_gbs\": %.2f, \"read_gbs\": %.2f, \"fma_peak_gflops\": %.1f, "
          "\"int8_dot_peak_gmacs\": %.1f, \"amx_int8_peak_gmacs\": %.1f, "
          "\"amx_bf16_peak_gflops\": %.1f, \"llc_bytes\": %d, "
          "\"weights_fit_in_llc\": %s},\n"
          " \"decode_single\": {\"tokens_per_s\": %.2f, \"bytes_per_token\": %.0f, \"gbs\": %.3f, "
          "\"vs_memcpy\": %.3f, \"vs_read\": %.3f},\n"
          " \"prefill_512\": {\"tokens_per_s\": %.2f, \"gflops\": %.2f, \"vs_fma_peak\": %.4f, "
          "\"vs_int8_dot_peak\": %.4f, \"vs_amx_bf16_peak\": %.4f},\n"
          " \"batched_decode\": [%s]}",
          loom::bench::UtcNow(), loom::bench::CpuModel(), flags.threads, flags.model_path, cpu_isa,
          isa_forced ? "true" : "false", loom::kernels::cpu::MatmulIsa(), flags.activations,
          limits.copy_gbs, limits.read_gbs, limits.peak_gflops, limits.peak_int8_gmacs,
          limits.peak_amx_int8_gmacs, limits.peak_amx_bf16_gflops, figures.llc_bytes,
          figures.weights_in_llc ? "true" : "false", decode.tokens_per_s, decode.bytes_per_token,
          decode.gbs, decode.gbs / limits.copy_gbs, decode.gbs / limits.read_gbs,
          figures.prefill.tokens_per_s, figures.prefill.gflops, figures.prefill.vs_fma_peak,
          figures.prefill.vs_int8_peak, figures.prefill.vs_amx_bf16_peak, figures.batched_json));
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  if (const std::optional<int> exit_code = ParseFlags(argc, argv, flags)) return *exit_code;
  auto gguf = loom::common::GgufFile::Open(flags.model_path);
  if (!gguf.ok()) {
    std::fprintf(stderr, "%s\n", gguf.status().ToString().c_str());
    return 1;
  }
  loom::worker::StepBackendOptions options;
  options.num_threads = flags.threads;
  // 64 sequences of 8 + decode_tokens tokens (blocks of 16 or more), and the 512-token prefill.
  options.num_kv_blocks =
      std::max(512, kMaxDecodeBatch * ((kDecodePromptTokens + flags.decode_tokens + 15) / 16 + 1));
  options.num_kv_blocks =
      std::max<int64_t>(options.num_kv_blocks, (flags.only_prefill + 15) / 16 + 1);
  auto precision = loom::kernels::cpu::ParseActivationPrecision(flags.activations);
  if (!precision.ok()) {
    std::fprintf(stderr, "%s\n", precision.status().ToString().c_str());
    return 1;
  }
  options.activations = *precision;
  const std::optional<loom::kernels::cpu::KvDtype> kv_dtype =
      loom::kernels::cpu::KvDtypeFromName(flags.kv_dtype);
  options.kv_dtype = loom::worker::ResolveKvDtype(
      kv_dtype.value_or(options.kv_dtype), !kv_dtype.has_value(), "cpu", options.activations);
  if (!kv_dtype.has_value() && flags.kv_dtype != "auto") {
    std::fprintf(stderr, "--kv-dtype: unknown KV type '%s'\n", flags.kv_dtype.c_str());
    return 2;
  }
  auto model_config = loom::common::ModelConfigFromGguf(**gguf);
  auto tokenizer = loom::common::Tokenizer::FromGguf(**gguf);
  if (!model_config.ok() || !tokenizer.ok()) {
    std::fprintf(
        stderr, "%s\n",
        (model_config.ok() ? tokenizer.status() : model_config.status()).ToString().c_str());
    return 1;
  }
  auto backend = loom::worker::CreateStepBackend(options, **gguf, *model_config);
  if (!backend.ok()) {
    std::fprintf(stderr, "%s\n", backend.status().ToString().c_str());
    return 1;
  }
  // The weights' shapes, for the FLOP and byte counts.
  const auto& forward_pass = dynamic_cast<const loom::worker::CpuForwardPass&>(
      static_cast<loom::worker::ModelStepBackend&>(**backend).forward_pass());
  // Every figure goes through the serving engine (scheduler, block manager, step executor).
  // The prefix cache is off: the prefill figure runs the same prompt three times.
  loom::cli::LocalEngineOptions engine_options;
  engine_options.enable_prefix_caching = false;
  LocalEngine engine(**backend, **tokenizer, engine_options);
  if (flags.only_prefill > 0) {
    RunOnlyPrefill(engine, forward_pass, flags.only_prefill);
    return 0;
  }
  if (flags.only_batch > 0) {
    for (int r = 0; r < 3; ++r) {
      std::printf("%d sequences: %.1f tokens/s\n", flags.only_batch,
                  DecodeRate(engine, flags.only_batch, flags.decode_tokens));
    }
    return 0;
  }

  const char* isa_env = std::getenv("LOOM_CPU_ISA");
  const bool isa_forced = isa_env != nullptr && *isa_env != '\0';
  const char* cpu_isa = loom::kernels::cpu::CpuIsaName(loom::kernels::cpu::ActiveCpuIsa());
  std::printf(
      "CPU: %s, %d threads, CPU ISA %s (%s; best here %s), matmul ISA %s, %s "
      "activations\n",
      loom::bench::CpuModel().c_str(), flags.threads, cpu_isa,
      isa_forced ? "forced by LOOM_CPU_ISA" : "automatic",
      loom::kernels::cpu::CpuIsaName(loom::kernels::cpu::BestCpuIsa()),
      loom::kernels::cpu::MatmulIsa(), flags.activations.c_str());
  Figures figures;
  figures.limits = MeasureLimits(flags.threads);
  // Multiply-adds per decoded token: every layer matrix and the LM head.
  const double macs_per_token = MatmulFlopsPerToken(forward_pass.weights()) / 2 +
                                static_cast<double>(forward_pass.weights().lm_head().rows) *
                                    forward_pass.weights().lm_head().cols;
  // The matmuls' compute limit in this mode: int8 dot products, AMX's BF16 products, or float
  // FMAs (2 flops).
  const bool int8_mode = *precision == loom::kernels::cpu::ActivationPrecision::kInt8;
  const bool bf16_mode = *precision == loom::kernels::cpu::ActivationPrecision::kBf16;
  const double matmul_peak_gmacs = int8_mode   ? figures.limits.peak_int8_gmacs
                                   : bf16_mode ? figures.limits.peak_amx_bf16_gflops / 2
                                               : figures.limits.peak_gflops / 2;
  const char* peak_name = int8_mode ? "int8 dot peak" : bf16_mode ? "AMX BF16 peak" : "FMA peak";

  figures.decode = MeasureSingleDecode(engine, forward_pass, flags.decode_tokens, figures.limits);
  // Where the weights fit in the last-level cache, decode reads them from there, not from
  // memory: single-stream decode is then compute-bound, and batching gains only what the
  // GEMM gains over the GEMV (the bandwidth ratios above can exceed 1).
  figures.llc_bytes = loom::bench::LastLevelCacheBytes();
  figures.weights_in_llc =
      figures.llc_bytes > 0 && figures.decode.bytes_per_token < 0.8 * figures.llc_bytes;
  std::printf("last-level cache %.0f MiB: weights %s it\n", figures.llc_bytes / 1048576.0,
              figures.weights_in_llc ? "fit in" : "do not fit in");
  figures.prefill = MeasurePrefill(engine, forward_pass, figures.limits);
  figures.batched_json =
      MeasureBatchedDecode(engine, flags.decode_tokens, figures.decode.tokens_per_s, macs_per_token,
                           matmul_peak_gmacs, peak_name);
  WriteEngineResult(flags, cpu_isa, isa_forced, figures);
  return 0;
}
