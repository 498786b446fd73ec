#include "worker/perplexity_command.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "common/gguf_file.h"
#include "common/hf_model.h"
#include "common/status_macros.h"
#include "common/tokenizer.h"
#include "nlohmann/json.hpp"
#include "worker/cpu_forward_pass.h"
#include "worker/step_batch.h"

namespace loom::worker {
namespace {

constexpr char kUsage[] =
    "usage: loom perplexity --model PATH --text FILE [--context N] [--stride S]\n"
    "                       [--max-tokens M] [--threads T] [--kv-dtype f16|f32]\n"
    "                       [--activations f32|int8] [--json]\n"
    "  --context N     tokens per window (default 512, at most the model's context)\n"
    "  --stride S      tokens between window starts (default context / 2); each window\n"
    "                  scores only the tokens the previous one did not\n"
    "  --max-tokens M  evaluate the first M tokens of the text only\n"
    "  --activations   f32 (default): exact float inputs to the INT8/INT4 layers; int8:\n"
    "                  inputs quantized per 32 values with integer dot products (faster)\n";

struct Options {
  std::string model_path;
  std::string text_path;
  int64_t context = 512;
  int64_t stride = 0;  // 0: context / 2
  int64_t max_tokens = 0;
  bool json = false;
  CpuForwardPassOptions runner;
};

bool ParseOptions(int argc, char** argv, Options& options) {
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--json") {
      options.json = true;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "loom perplexity: %s needs a value\n", flag.c_str());
      return false;
    }
    const char* value = argv[++i];
    int64_t number = 0;
    if (flag == "--model") {
      options.model_path = value;
    } else if (flag == "--text") {
      options.text_path = value;
    } else if (flag == "--kv-dtype") {
      if (std::strcmp(value, "f16") == 0) {
        options.runner.kv_dtype = kernels::cpu::KvDtype::kF16;
      } else if (std::strcmp(value, "f32") == 0) {
        options.runner.kv_dtype = kernels::cpu::KvDtype::kF32;
      } else {
        std::fprintf(stderr, "loom perplexity: --kv-dtype must be f16 or f32, got '%s'\n", value);
        return false;
      }
    } else if (flag == "--activations") {
      absl::StatusOr<kernels::cpu::ActivationPrecision> precision = kernels::cpu::ParseActivationPrecision(value);
      if (!precision.ok()) {
        std::fprintf(stderr, "loom perplexity: %s\n", precision.status().message().data());
        return false;
      }
      options.runner.activations = *precision;
    } else if (!absl::SimpleAtoi(value, &number) || number < 0) {
      std::fprintf(stderr, "loom perplexity: bad value '%s' for %s\n", value, flag.c_str());
      return false;
    } else if (flag == "--context") {
      options.context = number;
    } else if (flag == "--stride") {
      options.stride = number;
    } else if (flag == "--max-tokens") {
      options.max_tokens = number;
    } else if (flag == "--threads") {
      options.runner.num_threads = static_cast<int>(number);
    } else {
      std::fprintf(stderr, "loom perplexity: unknown flag %s\n", flag.c_str());
      return false;
    }
  }
  if (options.model_path.empty() || options.text_path.empty()) {
    std::fputs("loom perplexity: --model and --text are required\n", stderr);
    return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<std::vector<PerplexityWindow>> PlanPerplexityWindows(int64_t num_tokens,
                                                                    int64_t context,
                                                                    int64_t stride) {
  if (context < 2 || stride < 1 || stride > context) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "perplexity windows need context >= 2 and 1 <= stride <= context (got context %d, "
        "stride %d)",
        context, stride));
  }
  if (num_tokens < 2) {
    return absl::InvalidArgumentError(
        absl::StrFormat("perplexity needs at least 2 tokens, the text has %d", num_tokens));
  }
  std::vector<PerplexityWindow> windows;
  int64_t previous_end = 0;
  for (int64_t begin = 0; begin < num_tokens; begin += stride) {
    const int64_t end = std::min(begin + context, num_tokens);
    // The first token of a window has no context in it, so it is never a target.
    windows.push_back({begin, end, std::max(previous_end, begin + 1)});
    previous_end = end;
    if (end == num_tokens) break;
  }
  return windows;
}

double PerplexityResult::perplexity() const { return std::exp(mean_nll()); }

absl::StatusOr<PerplexityResult> ComputePerplexity(ForwardPass& runner,
                                                   const std::vector<int32_t>& tokens,
                                                   const PerplexityOptions& options) {
  const int64_t num_tokens = static_cast<int64_t>(tokens.size());
  const common::ModelConfig& config = runner.config();
  if (options.context > config.context_length) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--context %d exceeds the model's context length %d", options.context,
                        config.context_length));
  }
  if (options.max_step_tokens < 1) {
    return absl::InvalidArgumentError("max_step_tokens must be >= 1");
  }
  LOOM_ASSIGN_OR_RETURN(std::vector<PerplexityWindow> windows,
                        PlanPerplexityWindows(num_tokens, options.context, options.stride));
  const int64_t block_size = runner.block_size();
  const int64_t num_blocks = (options.context + block_size - 1) / block_size;
  if (num_blocks > runner.num_kv_blocks()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("a %d-token window needs %d KV blocks, the runner has %d", options.context,
                        num_blocks, runner.num_kv_blocks()));
  }
  std::vector<int32_t> blocks(num_blocks);
  for (int64_t b = 0; b < num_blocks; ++b) blocks[b] = static_cast<int32_t>(b);

  const int64_t vocab = config.vocab_size;
  PerplexityResult result;
  result.num_tokens = num_tokens;
  result.windows = static_cast<int64_t>(windows.size());
  std::vector<float> logits;
  const auto start = std::chrono::steady_clock::now();
  for (const PerplexityWindow& window : windows) {
    for (int64_t chunk = window.begin; chunk < window.end; chunk += options.max_step_tokens) {
      const int64_t chunk_end = std::min(window.end, chunk + options.max_step_tokens);
      StepBatch batch;
      LOOM_RETURN_IF_ERROR(AppendSequence(
          batch, absl::MakeConstSpan(tokens).subspan(chunk, chunk_end - chunk),
          static_cast<int32_t>(chunk - window.begin), blocks, static_cast<int32_t>(block_size),
          /*sample_last=*/false));
      // Row t (token chunk + t) predicts token chunk + t + 1.
      std::vector<int64_t> targets;
      for (int64_t p = chunk; p < chunk_end; ++p) {
        if (p + 1 >= window.score_begin && p + 1 < window.end) {
          batch.sample_rows.push_back(static_cast<int32_t>(p - chunk));
          targets.push_back(p + 1);
        }
      }
      LOOM_RETURN_IF_ERROR(runner.Step(batch, logits));
      for (size_t i = 0; i < targets.size(); ++i) {
        const float* row = logits.data() + i * vocab;
        double max = row[0];
        for (int64_t v = 1; v < vocab; ++v) max = std::max(max, static_cast<double>(row[v]));
        double sum = 0;
        for (int64_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(row[v]) - max);
        result.nll_sum += max + std::log(sum) - row[tokens[targets[i]]];
        ++result.scored;
      }
    }
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

int RunPerplexityCommand(int argc, char** argv) {
  Options options;
  if (!ParseOptions(argc, argv, options)) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  auto fail = [](const absl::Status& status) {
    std::fprintf(stderr, "loom perplexity: %s\n", status.ToString().c_str());
    return 1;
  };
  std::ifstream in(options.text_path, std::ios::binary);
  if (!in) {
    return fail(absl::NotFoundError(absl::StrFormat("cannot read --text %s", options.text_path)));
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();

  auto gguf = common::OpenModelFile(options.model_path);
  if (!gguf.ok()) return fail(gguf.status());
  auto tokenizer = common::Tokenizer::FromGguf(**gguf);
  if (!tokenizer.ok()) return fail(tokenizer.status());
  // Plain text: BOS as the model's tokenizer adds it, special-token text not parsed.
  std::vector<int32_t> tokens =
      (*tokenizer)->Encode(text, /*add_special=*/true, /*parse_special=*/false);
  if (options.max_tokens > 0 && static_cast<int64_t>(tokens.size()) > options.max_tokens) {
    tokens.resize(options.max_tokens);
  }
  PerplexityOptions perplexity;
  perplexity.context = options.context;
  perplexity.stride =
      options.stride > 0 ? options.stride : std::max<int64_t>(1, options.context / 2);
  perplexity.max_step_tokens = std::min<int64_t>(512, options.context);
  options.runner.num_kv_blocks = std::max<int64_t>(
      1, (options.context + options.runner.block_size - 1) / options.runner.block_size);
  auto runner = CpuForwardPass::Create(**gguf, options.runner);
  if (!runner.ok()) return fail(runner.status());
  if (!options.json) {
    std::fprintf(stderr, "loaded %s: weights\n%s", options.model_path.c_str(),
                 (*runner)->weights().load_log.c_str());
  }
  absl::StatusOr<PerplexityResult> result = ComputePerplexity(**runner, tokens, perplexity);
  if (!result.ok()) return fail(result.status());
  if (options.json) {
    nlohmann::json line = {
        {"model", options.model_path},
        {"text", options.text_path},
        {"tokens", result->num_tokens},
        {"scored", result->scored},
        {"windows", result->windows},
        {"context", perplexity.context},
        {"stride", perplexity.stride},
        {"nll", result->mean_nll()},
        {"perplexity", result->perplexity()},
        {"seconds", result->seconds},
        {"tokens_per_second",
         result->seconds > 0 ? static_cast<double>(result->scored) / result->seconds : 0.0}};
    std::printf("%s\n", line.dump().c_str());
  } else {
    std::printf("tokens scored  %lld of %lld (%lld windows of %lld, stride %lld)\n",
                static_cast<long long>(result->scored), static_cast<long long>(result->num_tokens),
                static_cast<long long>(result->windows), static_cast<long long>(perplexity.context),
                static_cast<long long>(perplexity.stride));
    std::printf("NLL            %.6f nats/token\n", result->mean_nll());
    std::printf("perplexity     %.4f\n", result->perplexity());
    std::fprintf(stderr, "%.1f s (%.1f scored tokens/s)\n", result->seconds,
                 result->seconds > 0 ? static_cast<double>(result->scored) / result->seconds : 0.0);
  }
  return 0;
}

}  // namespace loom::worker
