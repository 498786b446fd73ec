#include "cli/generate_command.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include "cli/command_line.h"
#include "cli/local_engine.h"
#include "common/jinja/chat_template.h"
#include "common/formats/gguf_file.h"
#include "common/formats/hf_model.h"
#include "common/formats/model_config.h"
#include "common/tokenizer/tokenizer.h"
#include "kernels/cuda_device.h"
#include "cli/worker_options.h"
#include "worker/step_backend_factory.h"

namespace loom::cli {
namespace {

struct Options {
  std::string model_path;
  std::string prompt;
  bool chat = false;
  EngineRequest request;
  worker::StepBackendOptions forward_pass;
  bool kv_dtype_auto = true;    // forward_pass.kv_dtype is ResolveKvDtype's
  std::string device = "auto";  // cuda | cpu | auto
  bool cuda_graphs = true;
};

// Parses the command line into `options`; nullopt to go on, else the exit code.
std::optional<int> ParseOptions(int argc, char** argv, Options& options) {
  options.request.max_tokens = 128;
  options.request.sampling.temperature = 0.0f;
  cli::CommandLine command_line(
      "loom generate", "loom generate MODEL --prompt TEXT: generate a continuation of a prompt "
                       "in this process, printing it as it is produced (tokens/s on stderr)");
  CLI::App& app = command_line.app();
  common::SamplingParams& sampling = options.request.sampling;
  cli::AddString(app, "model,--model", options.model_path, "the model file; required");
  cli::AddString(app, "--prompt", options.prompt, "the prompt; required");
  cli::AddBool(app, "--chat", options.chat, "wrap the prompt in the model's chat template");
  cli::AddBool(app, "--ignore-eos", options.request.ignore_eos,
               "generate --max-tokens even past the end-of-sequence token");
  cli::AddInt(app, "--max-tokens", options.request.max_tokens, 1, 1 << 24,
              "most tokens to generate");
  cli::AddNumber(app, "--temperature", sampling.temperature, 0, 100, "0 is greedy");
  cli::AddNumber(app, "--top-p", sampling.top_p, 1e-9, 1, "nucleus sampling");
  cli::AddInt(app, "--top-k", sampling.top_k, 0, 1 << 30, "top-k sampling (0: off)");
  cli::AddNumber(app, "--min-p", sampling.min_p, 0, 1, "min-p sampling (0: off)");
  cli::AddUint64(app, "--seed", sampling.seed, "sampling seed");
  cli::AddInt(app, "--threads", options.forward_pass.num_threads, 1, 1024, "CPU threads");
  AddKvDtypeFlag(app, options.forward_pass.kv_dtype, options.kv_dtype_auto);
  AddActivationsFlag(app, options.forward_pass.activations);
  cli::AddString(app, "--device", options.device,
                 "where the model runs (auto: cuda when a CUDA device is present and "
                 "--kv-dtype is not f32)",
                 {"cuda", "cpu", "auto"});
  cli::AddBool(app, "--cuda-graphs", options.cuda_graphs, "replay decode steps from CUDA graphs");
  if (std::optional<int> exit_code = command_line.Parse(argc, argv)) return exit_code;
  if (options.model_path.empty() || options.prompt.empty()) {
    return command_line.Fail("the model and --prompt are required");
  }
  return std::nullopt;
}

}  // namespace

int RunGenerateCommand(int argc, char** argv) {
  Options options;
  if (std::optional<int> exit_code = ParseOptions(argc, argv, options)) return *exit_code;
  auto fail = [](const absl::Status& status) {
    std::fprintf(stderr, "loom generate: %s\n", status.ToString().c_str());
    return 1;
  };
  // Where the model runs, decided before loading anything.
  auto device = ResolveDevice(options.device, options.forward_pass.kv_dtype, /*world_size=*/1,
                              kernels::CudaDeviceCount());
  if (!device.ok()) return fail(device.status());
  options.forward_pass.kv_dtype =
      worker::ResolveKvDtype(options.forward_pass.kv_dtype, options.kv_dtype_auto, *device,
                             options.forward_pass.activations);
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

  auto config = common::ModelConfigFromGguf(**gguf);
  if (!config.ok()) return fail(config.status());
  // A KV pool of exactly the blocks this request can fill (max_tokens 0: up to the
  // context length).
  const int64_t needed =
      options.request.max_tokens > 0
          ? static_cast<int64_t>(options.request.prompt_ids.size()) + options.request.max_tokens
          : config->context_length;
  options.forward_pass.num_kv_blocks = std::max<int64_t>(
      1, (needed + options.forward_pass.block_size - 1) / options.forward_pass.block_size);
  options.forward_pass.device = *device;
  options.forward_pass.cuda_graphs = options.cuda_graphs;
  std::string load_log;
  auto backend = worker::CreateStepBackend(options.forward_pass, **gguf, *config, &load_log);
  if (!backend.ok()) return fail(backend.status());
  std::fprintf(stderr, "loaded %s%s: weights\n%s", options.model_path.c_str(),
               *device == "cuda" ? " on CUDA" : "", load_log.c_str());

  // The serving engine in this process: scheduler, block manager, step executor.
  LocalEngine engine(**backend, **tokenizer);
  if (!options.chat) std::fputs(options.prompt.c_str(), stdout);
  auto results = engine.Generate({options.request}, [](size_t, const LocalEngine::TokenEvent& event) {
    std::fwrite(event.text.data(), 1, event.text.size(), stdout);
    std::fflush(stdout);
  });
  if (!results.ok()) return fail(results.status());
  std::fputs("\n", stdout);
  const EngineResult& result = (*results)[0];
  const size_t prompt_tokens = options.request.prompt_ids.size();
  const size_t decoded = result.outputs.size() > 0 ? result.outputs.size() - 1 : 0;
  std::fprintf(stderr,
               "prefill: %zu tokens in %.3f s (%.1f tokens/s); decode: %zu tokens in %.3f s "
               "(%.1f tokens/s); finish: %s\n",
               prompt_tokens, result.prefill_seconds, prompt_tokens / result.prefill_seconds,
               decoded, result.decode_seconds,
               result.decode_seconds > 0 ? decoded / result.decode_seconds : 0.0,
               engine::FinishReasonName(result.finish_reason));
  return 0;
}

}  // namespace loom::cli
