#include "cli/perplexity_command.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "cli/command_line.h"
#include "cli/worker_options.h"
#include "common/formats/gguf_file.h"
#include "common/formats/hf_model.h"
#include "common/formats/model_config.h"
#include "common/status_macros.h"
#include "common/tokenizer/tokenizer.h"
#include "kernels/cuda_device.h"
#include "nlohmann/json.hpp"
#include "worker/step_backend_factory.h"

namespace loom::cli {
namespace {

struct Options {
  std::string model_path;
  std::string text_path;
  int64_t context = 512;
  int64_t stride = 0;  // 0: context / 2
  int64_t max_tokens = 0;
  bool json = false;
  std::string device = "auto";  // cuda | cpu | auto
  std::string quantization;     // "" (as stored) | int8 | int4 | fp8 (CUDA)
  std::string nll_out;          // "": none
  worker::StepBackendOptions forward_pass;
  bool kv_dtype_auto = true;  // forward_pass.kv_dtype is ResolveKvDtype's
};

// Parses the command line into `options`; nullopt to go on, else the exit code.
std::optional<int> ParseOptions(int argc, char** argv, Options& options) {
  cli::CommandLine command_line(
      "loom perplexity",
      "loom perplexity MODEL --text FILE: perplexity of a text under a model, "
      "sliding window, through the serving engine in this process");
  CLI::App& app = command_line.app();
  cli::AddString(app, "model,--model", options.model_path, "the model file; required");
  cli::AddString(app, "--text", options.text_path, "the text file; required");
  cli::AddInt(app, "--context", options.context, 2, int64_t{1} << 24,
              "tokens per window (at most the model's context)");
  cli::AddInt(app, "--stride", options.stride, 1, int64_t{1} << 24,
              "tokens between window starts (default 0: context / 2); each window scores only "
              "the tokens the previous one did not");
  cli::AddInt(app, "--max-tokens", options.max_tokens, 1, int64_t{1} << 40,
              "evaluate the first M tokens of the text only (default 0: all)");
  cli::AddInt(app, "--threads", options.forward_pass.num_threads, 1, 1024, "CPU threads");
  AddKvDtypeFlag(app, options.forward_pass.kv_dtype, options.kv_dtype_auto);
  AddActivationsFlag(app, options.forward_pass.activations);
  cli::AddString(app, "--device", options.device,
                 "where the model runs (auto: cuda when a CUDA device is present and "
                 "--kv-dtype is not f32)",
                 {"cuda", "cpu", "auto"});
  cli::AddString(app, "--quantization", options.quantization,
                 "the linear layers quantized at load, as loom-worker serves them (int8/int4: "
                 "Loom's group-wise formats, round-to-nearest; fp8: E4M3 with a scale per "
                 "output channel on FP8 tensor cores, CUDA compute capability 8.9+ only; "
                 "\"\": as stored)",
                 {"", "int8", "int4", "fp8"});
  cli::AddString(app, "--nll-out", options.nll_out,
                 "write each scored token's negative log-likelihood (nats), one per line in "
                 "text order: for a paired comparison of two runs on the same text, which "
                 "resolves differences far below the perplexity's own standard error");
  cli::AddBool(app, "--json", options.json, "print the result as JSON");
  if (std::optional<int> exit_code = command_line.Parse(argc, argv)) return exit_code;
  if (options.model_path.empty() || options.text_path.empty()) {
    return command_line.Fail("the model and --text are required");
  }
  return std::nullopt;
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

double PerplexityResult::mean_nll() const {
  if (token_nll.empty()) return 0.0;
  double sum = 0.0;
  for (double v : token_nll) sum += v;
  return sum / static_cast<double>(token_nll.size());
}

double PerplexityResult::perplexity() const { return std::exp(mean_nll()); }

double PerplexityResult::nll_stderr() const {
  const int64_t n = scored();
  if (n < 2) return 0.0;
  const double mean = mean_nll();
  double squares = 0.0;
  for (double v : token_nll) squares += (v - mean) * (v - mean);
  return std::sqrt(squares / static_cast<double>(n - 1) / static_cast<double>(n));
}

int64_t PerplexityKvBlocks(int64_t context, int64_t block_size) {
  // The window, and the token the engine samples after it.
  return (context + 1 + block_size - 1) / block_size;
}

absl::StatusOr<PerplexityResult> ComputePerplexity(LocalEngine& engine,
                                                   const std::vector<int32_t>& tokens,
                                                   const PerplexityOptions& options) {
  const int64_t num_tokens = static_cast<int64_t>(tokens.size());
  const common::ModelConfig& config = engine.config();
  if (options.context > config.context_length) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--context %d exceeds the model's context length %d", options.context,
                        config.context_length));
  }
  if (options.context == config.context_length) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--context %d must be below the model's context length %d: each window is a request "
        "that also samples one token",
        options.context, config.context_length));
  }
  LOOM_ASSIGN_OR_RETURN(std::vector<PerplexityWindow> windows,
                        PlanPerplexityWindows(num_tokens, options.context, options.stride));
  const int64_t block_size = engine.block_manager().block_size();
  const int64_t num_blocks = PerplexityKvBlocks(options.context, block_size);
  if (num_blocks > engine.block_manager().num_blocks()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a %d-token window needs %d KV blocks, the engine has %d", options.context, num_blocks,
        engine.block_manager().num_blocks()));
  }

  PerplexityResult result;
  result.num_tokens = num_tokens;
  result.windows = static_cast<int64_t>(windows.size());
  const auto start = std::chrono::steady_clock::now();
  for (const PerplexityWindow& window : windows) {
    // A window whose first token is its only one scores nothing.
    if (window.score_begin >= window.end) continue;
    // Window tokens from score_begin on are scored; one greedy token follows (unused).
    EngineRequest request;
    request.prompt_ids.assign(tokens.begin() + window.begin, tokens.begin() + window.end);
    request.sampling.temperature = 0.0f;
    request.max_tokens = 1;
    request.ignore_eos = true;
    request.score_prompt_from = static_cast<int32_t>(window.score_begin - window.begin);
    LOOM_ASSIGN_OR_RETURN(std::vector<EngineResult> scored, engine.Generate({request}));
    for (double logprob : scored[0].prompt_logprobs) result.token_nll.push_back(-logprob);
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

int RunPerplexityCommand(int argc, char** argv) {
  Options options;
  if (std::optional<int> exit_code = ParseOptions(argc, argv, options)) return *exit_code;
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
  // Opened before the model loads, so a path that cannot be written fails at once.
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> nll_out(nullptr, &std::fclose);
  if (!options.nll_out.empty()) {
    nll_out.reset(std::fopen(options.nll_out.c_str(), "w"));
    if (nll_out == nullptr) {
      return fail(absl::InvalidArgumentError(absl::StrFormat(
          "cannot write --nll-out %s: %s", options.nll_out, std::strerror(errno))));
    }
  }

  // Where the model runs, decided before loading anything.
  auto device = ResolveDevice(options.device, options.forward_pass.kv_dtype, /*world_size=*/1,
                              kernels::CudaDeviceCount());
  if (!device.ok()) return fail(device.status());
  options.forward_pass.kv_dtype =
      worker::ResolveKvDtype(options.forward_pass.kv_dtype, options.kv_dtype_auto, *device,
                             options.forward_pass.activations);
  if (options.quantization == "fp8" && *device != "cuda") {
    return fail(absl::InvalidArgumentError(
        "--quantization fp8 runs on FP8 tensor cores: it needs --device cuda (a GPU of compute "
        "capability 8.9 or newer)"));
  }
  auto gguf = common::OpenModelFile(options.model_path);
  if (!gguf.ok()) return fail(gguf.status());
  gguf = QuantizeAsFlagged(options.quantization, *std::move(gguf));
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
  auto config = common::ModelConfigFromGguf(**gguf);
  if (!config.ok()) return fail(config.status());
  options.forward_pass.device = *device;
  SetFp8Weights(options.quantization, options.forward_pass);
  options.forward_pass.num_kv_blocks =
      std::max<int64_t>(1, PerplexityKvBlocks(options.context, options.forward_pass.block_size));
  std::string load_log;
  auto backend = worker::CreateStepBackend(options.forward_pass, **gguf, *config, &load_log);
  if (!backend.ok()) return fail(backend.status());
  if (!options.json) {
    std::fprintf(stderr, "loaded %s%s: weights\n%s", options.model_path.c_str(),
                 *device == "cuda" ? " on CUDA" : "", load_log.c_str());
  }
  // One window at a time, prefilled in chunks of at most 512 tokens; nothing is shared
  // between windows (they start at different offsets), so the prefix cache is off.
  LocalEngineOptions engine_options;
  engine_options.max_num_batched_tokens = std::max<int64_t>(1, std::min<int64_t>(512, options.context));
  engine_options.enable_prefix_caching = false;
  LocalEngine engine(**backend, **tokenizer, engine_options);
  absl::StatusOr<PerplexityResult> result = ComputePerplexity(engine, tokens, perplexity);
  if (!result.ok()) return fail(result.status());
  if (nll_out != nullptr) {
    for (double nll : result->token_nll) std::fprintf(nll_out.get(), "%.17g\n", nll);
    if (std::fflush(nll_out.get()) != 0 || std::ferror(nll_out.get())) {
      return fail(absl::InternalError(absl::StrFormat("writing --nll-out %s failed: %s",
                                                      options.nll_out, std::strerror(errno))));
    }
  }
  if (options.json) {
    nlohmann::json line = {
        {"model", options.model_path},
        {"device", *device},
        {"quantization", options.quantization.empty() ? "none" : options.quantization},
        {"kv_dtype", kernels::cpu::KvDtypeName(options.forward_pass.kv_dtype)},
        {"text", options.text_path},
        {"tokens", result->num_tokens},
        {"scored", result->scored()},
        {"windows", result->windows},
        {"context", perplexity.context},
        {"stride", perplexity.stride},
        {"nll", result->mean_nll()},
        {"perplexity", result->perplexity()},
        {"nll_stderr", result->nll_stderr()},
        {"perplexity_stderr", result->perplexity_stderr()},
        {"seconds", result->seconds},
        {"tokens_per_second",
         result->seconds > 0 ? static_cast<double>(result->scored()) / result->seconds : 0.0}};
    std::printf("%s\n", line.dump().c_str());
  } else {
    std::printf("tokens scored  %lld of %lld (%lld windows of %lld, stride %lld)\n",
                static_cast<long long>(result->scored()),
                static_cast<long long>(result->num_tokens), static_cast<long long>(result->windows),
                static_cast<long long>(perplexity.context),
                static_cast<long long>(perplexity.stride));
    std::printf("NLL            %.6f +/- %.6f nats/token\n", result->mean_nll(),
                result->nll_stderr());
    std::printf("perplexity     %.4f +/- %.4f\n", result->perplexity(),
                result->perplexity_stderr());
    std::fprintf(
        stderr, "%.1f s (%.1f scored tokens/s)\n", result->seconds,
        result->seconds > 0 ? static_cast<double>(result->scored()) / result->seconds : 0.0);
  }
  return 0;
}

}  // namespace loom::cli
