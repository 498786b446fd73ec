#include "worker/generate_command.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/chat_template.h"
#include "common/gguf_file.h"
#include "common/hf_model.h"
#include "common/incremental_decoder.h"
#include "common/tokenizer.h"
#include "kernels/cuda_device.h"
#include "worker/cpu_forward_pass.h"
#include "worker/cuda_forward_pass.h"
#include "worker/local_generator.h"
#include "worker/worker_options.h"

namespace loom::worker {
namespace {

constexpr char kUsage[] =
    "usage: loom generate --model PATH --prompt TEXT [--max-tokens N] [--temperature T]\n"
    "                     [--top-p P] [--top-k K] [--min-p P] [--seed S] [--chat]\n"
    "                     [--threads N] [--kv-dtype f16|f32] [--device cuda|cpu|auto]\n"
    "                     [--cuda-graphs on|off] [--activations f32|int8] [--ignore-eos]\n"
    "  --device   where the model runs (default auto: cuda when a CUDA device is present\n"
    "             and --kv-dtype is f16)\n"
    "  --activations  CPU, INT8/INT4 weights: f32 (default) keeps layer inputs exact; int8\n"
    "             quantizes them per 32 values for integer dot products (faster)\n";

struct Options {
  std::string model_path;
  std::string prompt;
  bool chat = false;
  GenerationRequest request;
  CpuForwardPassOptions runner;
  std::string device = "auto";  // cuda | cpu | auto
  bool cuda_graphs = true;
};

bool ParseNumber(const char* text, double& out) {
  char* end = nullptr;
  out = std::strtod(text, &end);
  return end != text && *end == '\0';
}

// Returns false (after printing why) on a bad command line.
bool ParseOptions(int argc, char** argv, Options& options) {
  options.request.max_tokens = 128;
  options.request.sampling.temperature = 0.0f;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--chat") {
      options.chat = true;
      continue;
    }
    if (flag == "--ignore-eos") {
      options.request.ignore_eos = true;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "loom generate: %s needs a value\n", flag.c_str());
      return false;
    }
    const char* value = argv[++i];
    double number = 0;
    const bool numeric = ParseNumber(value, number);
    if (flag == "--model") {
      options.model_path = value;
    } else if (flag == "--prompt") {
      options.prompt = value;
    } else if (flag == "--kv-dtype" && (std::strcmp(value, "f16") == 0 || std::strcmp(value, "f32") == 0)) {
      options.runner.kv_dtype = value[1] == '1' ? kernels::cpu::KvDtype::kF16 : kernels::cpu::KvDtype::kF32;
    } else if (flag == "--activations") {
      absl::StatusOr<kernels::cpu::ActivationPrecision> precision =
          kernels::cpu::ParseActivationPrecision(value);
      if (!precision.ok()) {
        std::fprintf(stderr, "loom generate: %s\n", precision.status().message().data());
        return false;
      }
      options.runner.activations = *precision;
    } else if (flag == "--device") {
      if (std::strcmp(value, "cuda") != 0 && std::strcmp(value, "cpu") != 0 &&
          std::strcmp(value, "auto") != 0) {
        std::fprintf(stderr, "loom generate: bad value '%s' for --device (cuda, cpu or auto)\n",
                     value);
        return false;
      }
      options.device = value;
    } else if (flag == "--cuda-graphs") {
      if (std::strcmp(value, "on") != 0 && std::strcmp(value, "off") != 0) {
        std::fprintf(stderr, "loom generate: bad value '%s' for --cuda-graphs (on or off)\n",
                     value);
        return false;
      }
      options.cuda_graphs = std::strcmp(value, "on") == 0;
    } else if (!numeric) {
      std::fprintf(stderr, "loom generate: bad value '%s' for %s\n", value, flag.c_str());
      return false;
    } else if (flag == "--max-tokens") {
      options.request.max_tokens = static_cast<int32_t>(number);
    } else if (flag == "--temperature") {
      options.request.sampling.temperature = static_cast<float>(number);
    } else if (flag == "--top-p") {
      options.request.sampling.top_p = static_cast<float>(number);
    } else if (flag == "--top-k") {
      options.request.sampling.top_k = static_cast<int32_t>(number);
    } else if (flag == "--min-p") {
      options.request.sampling.min_p = static_cast<float>(number);
    } else if (flag == "--seed") {
      options.request.sampling.seed = static_cast<uint64_t>(number);
    } else if (flag == "--threads") {
      options.runner.num_threads = static_cast<int>(number);
    } else {
      std::fprintf(stderr, "loom generate: unknown flag %s\n", flag.c_str());
      return false;
    }
  }
  if (options.model_path.empty() || options.prompt.empty()) {
    std::fputs("loom generate: --model and --prompt are required\n", stderr);
    return false;
  }
  return true;
}

}  // namespace

int RunGenerateCommand(int argc, char** argv) {
  Options options;
  if (!ParseOptions(argc, argv, options)) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  auto fail = [](const absl::Status& status) {
    std::fprintf(stderr, "loom generate: %s\n", status.ToString().c_str());
    return 1;
  };
  // Where the model runs, decided before loading anything.
  auto device = ResolveDevice(options.device, options.runner.kv_dtype, /*world_size=*/1,
                              kernels::CudaDeviceCount());
  if (!device.ok()) return fail(device.status());
  auto gguf = common::OpenModelFile(options.model_path);
  if (!gguf.ok()) return fail(gguf.status());
  auto tokenizer = common::Tokenizer::FromGguf(**gguf);
  if (!tokenizer.ok()) return fail(tokenizer.status());

  std::string text = options.prompt;
  if (options.chat) {
    auto source = (*gguf)->GetString("tokenizer.chat_template");
    if (!source.ok()) return fail(source.status());
    auto chat_template = common::ChatTemplate::Parse(*source);
    if (!chat_template.ok()) return fail(chat_template.status());
    common::ChatTemplateInputs inputs;
    inputs.messages.push_back({"user", options.prompt});
    const common::Tokenizer& tok = **tokenizer;
    if (tok.bos_id() >= 0) inputs.bos_token = std::string(tok.TokenText(tok.bos_id()));
    if (tok.eos_id() >= 0) inputs.eos_token = std::string(tok.TokenText(tok.eos_id()));
    auto rendered = (*chat_template)->Render(inputs);
    if (!rendered.ok()) return fail(rendered.status());
    text = *rendered;
  }
  options.request.prompt_ids = (*tokenizer)->Encode(text, /*add_special=*/true, /*parse_special=*/options.chat);

  const int64_t needed = static_cast<int64_t>(options.request.prompt_ids.size()) + options.request.max_tokens;
  options.runner.num_kv_blocks = (needed + options.runner.block_size - 1) / options.runner.block_size;
  std::unique_ptr<ForwardPass> runner;
  if (*device == "cuda") {
    CudaForwardPassOptions cuda_options;
    cuda_options.num_kv_blocks = options.runner.num_kv_blocks;
    cuda_options.block_size = options.runner.block_size;
    cuda_options.cuda_graphs = options.cuda_graphs;
    auto created = CudaForwardPass::Create(**gguf, cuda_options);
    if (!created.ok()) return fail(created.status());
    std::fprintf(stderr, "loaded %s on CUDA: weights\n%s", options.model_path.c_str(),
                 (*created)->load_log().c_str());
    runner = std::move(*created);
  } else {
    auto created = CpuForwardPass::Create(**gguf, options.runner);
    if (!created.ok()) return fail(created.status());
    std::fprintf(stderr, "loaded %s: weights\n%s", options.model_path.c_str(),
                 (*created)->weights().load_log.c_str());
    runner = std::move(*created);
  }

  LocalGenerator generator(*runner, (*tokenizer)->EndOfGenerationIds());
  common::IncrementalDecoder decoder(**tokenizer, /*skip_special=*/true);
  if (!options.chat) std::fputs(options.prompt.c_str(), stdout);
  auto results = generator.Generate({options.request}, [&](size_t, const SampledToken& token) {
    std::fputs(decoder.Append(token.token_id).c_str(), stdout);
    std::fflush(stdout);
  });
  if (!results.ok()) return fail(results.status());
  std::fputs(decoder.Flush().c_str(), stdout);
  std::fputs("\n", stdout);
  const GenerationResult& result = (*results)[0];
  const size_t prompt_tokens = options.request.prompt_ids.size();
  const size_t decoded = result.tokens.size() > 0 ? result.tokens.size() - 1 : 0;
  std::fprintf(stderr,
               "prefill: %zu tokens in %.3f s (%.1f tokens/s); decode: %zu tokens in %.3f s "
               "(%.1f tokens/s); finish: %s\n",
               prompt_tokens, result.prefill_seconds, prompt_tokens / result.prefill_seconds,
               decoded, result.decode_seconds,
               result.decode_seconds > 0 ? decoded / result.decode_seconds : 0.0,
               result.finish_reason == FinishReason::kStop ? "stop" : "length");
  return 0;
}

}  // namespace loom::worker
