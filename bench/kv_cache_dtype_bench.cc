// The 8-bit and BF16 KV caches (--kv-dtype int8 | fp8_e4m3 | bf16) against F16 KV on the CPU,
// on a real model (default: the bundled SmolLM2-135M), all in one run:
//   capacity   sequences of --context tokens one KV memory budget holds (the worker's own
//              sizing: model::ShardKvBlock + KvBlocksFromBudget, the pool then allocated
//              and its bytes checked), as a ratio to F16's (the bar: >= 1.9x);
//   decode     tokens/s of --batch sequences decoding --decode-tokens tokens each after a
//              --prompt-tokens prompt, as a ratio to F16's in the same run (bar: >= 1.0x),
//              median of --repeats (the dtypes' repeats interleaved, each dtype first in
//              turn), and the KV bytes each decode step reads against the
//              machine's read bandwidth measured in the same run. The prompts are prefilled
//              first (one token each, kept in the prefix cache), so the measured run's
//              prompts are cache hits and every sequence decodes from the same step on: no
//              step mixes one sequence's prefill with another's decode (the engine counts
//              such steps as prefill time, not decode time).
// --activations bf16 (AMX-BF16 CPUs) runs every dtype in that mode, where the attention of F16
// KV converts each tile to BF16 and that of BF16 KV reads K from the pool as it is.
// Writes bench/results/kv_cache_dtype_cpu.json (_<isa> appended when LOOM_CPU_ISA forces
// the ISA: run it once per ISA; _prompt<N> for another --prompt-tokens; _<activations> for
// activations other than f32).
//
// usage: kv_cache_dtype_bench [--model PATH] [--threads N] [--batch B] [--prompt-tokens P]
//                             [--decode-tokens T] [--repeats R] [--budget-mib M]
//                             [--context C] [--activations f32|int8|bf16]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bench/machine_limits.h"
#include "bench/random_prompt.h"
#include "cli/local_engine.h"
#include "common/formats/gguf_file.h"
#include "common/formats/model_config.h"
#include "common/tokenizer/tokenizer.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/kv_dtype.h"
#include "kernels/cpu/matmul.h"
#include "model/cpu_kv_cache.h"
#include "model/kv_cache_budget.h"
#include "worker/cpu_forward_pass.h"
#include "worker/model_step_backend.h"

namespace {

using loom::kernels::cpu::KvDtype;

struct Flags {
  std::string model_path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
  int threads = 2;
  int batch = 64;
  int prompt_tokens = 192;
  int decode_tokens = 64;
  int repeats = 3;
  int64_t budget_mib = 512;  // the worker's default host KV budget
  int64_t context = 1024;
  std::string activations = "f32";
};

bool ParseFlags(int argc, char** argv, Flags& flags) {
  if (const char* env = std::getenv("LOOM_MODEL_PATH")) flags.model_path = env;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const char* value = argv[i + 1];
    if (flag == "--model")
      flags.model_path = value;
    else if (flag == "--threads")
      flags.threads = std::atoi(value);
    else if (flag == "--batch")
      flags.batch = std::atoi(value);
    else if (flag == "--prompt-tokens")
      flags.prompt_tokens = std::atoi(value);
    else if (flag == "--decode-tokens")
      flags.decode_tokens = std::atoi(value);
    else if (flag == "--repeats")
      flags.repeats = std::atoi(value);
    else if (flag == "--budget-mib")
      flags.budget_mib = std::atoll(value);
    else if (flag == "--context")
      flags.context = std::atoll(value);
    else if (flag == "--activations")
      flags.activations = value;
    else
      return false;
  }
  return argc % 2 == 1 && loom::kernels::cpu::ParseActivationPrecision(flags.activations).ok() &&
         flags.batch > 0 && flags.prompt_tokens > 0 && flags.decode_tokens > 1 &&
         flags.repeats > 0 && flags.budget_mib > 0 && flags.context > 0;
}

struct Capacity {
  int64_t block_bytes = 0;
  int64_t blocks = 0;
  int64_t sequences = 0;  // of flags.context tokens
  int64_t allocated_bytes = 0;
};

Capacity MeasureCapacity(const loom::common::ModelConfig& config, KvDtype dtype,
                         const Flags& flags) {
  constexpr int64_t kBlockSize = 16;
  auto block = loom::model::ShardKvBlock(
      config, {}, kBlockSize, loom::kernels::cpu::KvElementBytes(dtype),
      loom::kernels::cpu::KvDtypeName(dtype), loom::kernels::cpu::KvScaleBytes(dtype));
  auto blocks =
      block.ok() ? loom::model::KvBlocksFromBudget(flags.budget_mib << 20, *block) : block.status();
  if (!blocks.ok()) {
    std::fprintf(stderr, "%s\n", blocks.status().ToString().c_str());
    std::exit(1);
  }
  Capacity capacity;
  capacity.block_bytes = block->bytes;
  capacity.blocks = *blocks;
  capacity.sequences = *blocks / ((flags.context + kBlockSize - 1) / kBlockSize);
  // The pool the worker would allocate: its bytes are what the sizing promised.
  auto cache = loom::model::CpuKvCache::Create(config, *blocks, kBlockSize, dtype);
  capacity.allocated_bytes = cache.ok() ? (*cache)->bytes() : -1;
  return capacity;
}

// One KV dtype's engine: Run(r) is repeat r's decode tokens/s of flags.batch sequences (the
// steps that computed no prompt token). main runs the dtypes' repeats interleaved, so that a
// change in the machine's load falls on every dtype alike.
class DecodeRunner {
 public:
  DecodeRunner(const loom::common::GgufFile& gguf, const loom::common::Tokenizer& tokenizer,
               KvDtype dtype, const Flags& flags)
      : flags_(flags) {
    loom::worker::CpuForwardPassOptions options;
    options.num_threads = flags.threads;
    options.kv_dtype = dtype;
    options.activations = *loom::kernels::cpu::ParseActivationPrecision(flags.activations);
    // Each repeat's prompts stay cached beside the next repeat's sequences.
    options.num_kv_blocks =
        2 * flags.batch * ((flags.prompt_tokens + flags.decode_tokens + 15) / 16 + 1) + 8;
    auto forward_pass = loom::worker::CpuForwardPass::Create(gguf, options);
    if (!forward_pass.ok()) {
      std::fprintf(stderr, "%s\n", forward_pass.status().ToString().c_str());
      std::exit(1);
    }
    backend_ = std::make_unique<loom::worker::ModelStepBackend>(*std::move(forward_pass));
    engine_ = std::make_unique<loom::cli::LocalEngine>(*backend_, tokenizer);
  }

  double Run(int r) {
    const Flags& flags = flags_;
    loom::cli::LocalEngine& engine = *engine_;
    std::vector<loom::cli::EngineRequest> requests;
    for (int i = 0; i < flags.batch; ++i) {
      loom::cli::EngineRequest request;
      request.prompt_ids = loom::bench::RandomPrompt(flags.prompt_tokens,
                                                     engine.config().vocab_size, 1 + i + 1000 * r);
      request.sampling.temperature = 0.0f;
      request.max_tokens = flags.decode_tokens;
      request.ignore_eos = true;
      requests.push_back(std::move(request));
    }
    // Prefill (into the prefix cache), then the measured run over the cached prompts.
    std::vector<loom::cli::EngineRequest> prefill = requests;
    for (auto& request : prefill) request.max_tokens = 1;
    auto results = engine.Generate(prefill);
    if (results.ok()) results = engine.Generate(requests);
    if (!results.ok()) {
      std::fprintf(stderr, "generate failed: %s\n", results.status().ToString().c_str());
      std::exit(1);
    }
    double seconds = 0;
    int64_t decoded = 0;
    for (const auto& result : *results) {
      seconds = std::max(seconds, result.decode_seconds);
      decoded += static_cast<int64_t>(result.outputs.size()) - 1;  // the first came from prefill
    }
    return decoded / seconds;
  }

 private:
  Flags flags_;
  std::unique_ptr<loom::worker::ModelStepBackend> backend_;
  std::unique_ptr<loom::cli::LocalEngine> engine_;
};

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  if (!ParseFlags(argc, argv, flags)) {
    std::fputs(
        "usage: kv_cache_dtype_bench [--model PATH] [--threads N] [--batch B] "
        "[--prompt-tokens P] [--decode-tokens T] [--repeats R] [--budget-mib M] [--context C] "
        "[--activations f32|int8|bf16]\n",
        stderr);
    return 2;
  }
  auto gguf = loom::common::GgufFile::Open(flags.model_path);
  auto config = gguf.ok() ? loom::common::ModelConfigFromGguf(**gguf) : gguf.status();
  auto tokenizer = gguf.ok() ? loom::common::Tokenizer::FromGguf(**gguf) : gguf.status();
  if (!config.ok() || !tokenizer.ok()) {
    std::fprintf(stderr, "%s\n",
                 (config.ok() ? tokenizer.status() : config.status()).ToString().c_str());
    return 1;
  }
  const double read_gbs = loom::bench::MeasureReadBandwidthGBs(flags.threads);
  const char* isa = loom::kernels::cpu::CpuIsaName(loom::kernels::cpu::ActiveCpuIsa());
  std::printf(
      "kv_cache_dtype_bench: %s, ISA %s, %s activations, %d threads, read bandwidth %.1f GB/s\n",
      flags.model_path.c_str(), isa, flags.activations.c_str(), flags.threads, read_gbs);
  std::printf("decode: %d sequences, %d prompt + %d decoded tokens each, median of %d\n",
              flags.batch, flags.prompt_tokens, flags.decode_tokens, flags.repeats);
  constexpr KvDtype dtypes[] = {KvDtype::kF16, KvDtype::kInt8, KvDtype::kFp8E4m3, KvDtype::kBf16};
  constexpr int kDtypes = static_cast<int>(std::size(dtypes));
  // Repeat r runs the dtypes starting at r mod 4: each goes first, second... alike.
  std::vector<std::unique_ptr<DecodeRunner>> runners;
  for (KvDtype dtype : dtypes) {
    runners.push_back(std::make_unique<DecodeRunner>(**gguf, **tokenizer, dtype, flags));
  }
  std::vector<double> runs[kDtypes];
  for (int r = 0; r < flags.repeats; ++r) {
    for (int i = 0; i < kDtypes; ++i) {
      const int which = (r + i) % kDtypes;
      runs[which].push_back(runners[which]->Run(r));
    }
  }
  runners.clear();
  Capacity f16_capacity;
  double f16_rate = 0;
  std::string rows;
  for (int which = 0; which < kDtypes; ++which) {
    const KvDtype dtype = dtypes[which];
    const Capacity capacity = MeasureCapacity(*config, dtype, flags);
    const double rate = loom::bench::Median(runs[which]);
    if (dtype == KvDtype::kF16) {
      f16_capacity = capacity;
      f16_rate = rate;
    }
    // KV read per decode step: every sequence's context (its mean over the decode), K and V.
    const double mean_context = flags.prompt_tokens + flags.decode_tokens / 2.0;
    const double kv_gb_per_step =
        flags.batch * mean_context * static_cast<double>(capacity.block_bytes) / 16 / 1e9;
    const double kv_gbs = kv_gb_per_step * rate / flags.batch;
    const double capacity_ratio =
        static_cast<double>(capacity.sequences) / static_cast<double>(f16_capacity.sequences);
    std::printf(
        "  %-8s block %6lld B, %lld MiB hold %6lld blocks = %4lld sequences of %lld tokens "
        "(%.3fx f16; pool allocated %.1f MiB) | decode %7.1f tokens/s = %.3fx f16, KV read "
        "%.2f GB/s = %.3f of read bandwidth\n",
        loom::kernels::cpu::KvDtypeName(dtype), static_cast<long long>(capacity.block_bytes),
        static_cast<long long>(flags.budget_mib), static_cast<long long>(capacity.blocks),
        static_cast<long long>(capacity.sequences), static_cast<long long>(flags.context),
        capacity_ratio, capacity.allocated_bytes / 1048576.0, rate, rate / f16_rate, kv_gbs,
        kv_gbs / read_gbs);
    rows += absl::StrFormat(
        "%s{\"kv_dtype\": \"%s\", \"block_bytes\": %d, \"blocks\": %d, \"sequences\": %d, "
        "\"capacity_vs_f16\": %.4f, \"allocated_bytes\": %d, \"decode_tokens_per_s\": %.2f, "
        "\"decode_vs_f16\": %.4f, \"kv_read_gbs\": %.3f, \"kv_read_vs_bandwidth\": %.4f, "
        "\"decode_runs\": [%s]}",
        rows.empty() ? "" : ",\n  ", loom::kernels::cpu::KvDtypeName(dtype), capacity.block_bytes,
        capacity.blocks, capacity.sequences, capacity_ratio, capacity.allocated_bytes, rate,
        rate / f16_rate, kv_gbs, kv_gbs / read_gbs,
        absl::StrJoin(runs[which], ", ", [](std::string* out, double run) {
          absl::StrAppendFormat(out, "%.2f", run);
        }));
  }
  const bool forced = std::getenv("LOOM_CPU_ISA") != nullptr;
  // kv_cache_dtype_cpu[_<isa>][_prompt<N> when --prompt-tokens is not the default].
  std::string name = forced ? std::string("kv_cache_dtype_cpu_") + isa : "kv_cache_dtype_cpu";
  if (flags.prompt_tokens != Flags{}.prompt_tokens) {
    name += "_prompt" + std::to_string(flags.prompt_tokens);
  }
  if (flags.activations != Flags{}.activations) name += "_" + flags.activations;
  loom::bench::WriteResult(
      name,
      absl::StrFormat(
          "{\"benchmark\": \"kv_cache_dtype_cpu\", \"date\": \"%s\", \"cpu\": \"%s\", "
          "\"cpu_isa\": \"%s\", \"activations\": \"%s\", \"threads\": %d, \"model\": \"%s\", "
          "\"budget_mib\": %d, \"context\": %d, \"batch\": %d, \"prompt_tokens\": %d, "
          "\"decode_tokens\": %d, \"repeats\": %d, \"read_gbs\": %.2f,\n \"dtypes\": [\n  %s]}",
          loom::bench::UtcNow(), loom::bench::CpuModel(), isa, flags.activations, flags.threads,
          flags.model_path, flags.budget_mib, flags.context, flags.batch, flags.prompt_tokens,
          flags.decode_tokens, flags.repeats, read_gbs, rows));
  return 0;
}
