#include "cli/inspect_command.h"

#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "cli/command_line.h"
#include "common/jinja/chat_template.h"
#include "common/formats/gguf_file.h"
#include "common/formats/hf_model.h"
#include "common/formats/model_config.h"
#include "common/tokenizer/tokenizer.h"

namespace loom::cli {
namespace {


const char* RopeScalingName(common::RopeScalingType type) {
  switch (type) {
    case common::RopeScalingType::kNone: return "none";
    case common::RopeScalingType::kLinear: return "linear";
    case common::RopeScalingType::kLlama3: return "llama3";
    case common::RopeScalingType::kYarn: return "yarn";
    case common::RopeScalingType::kLongRope:
      return "longrope";
  }
  return "?";
}

void PrintConfig(const common::ModelConfig& config) {
  std::printf("model           %s (%s)\n", config.name.c_str(), config.architecture.c_str());
  std::printf("layers          %lld", static_cast<long long>(config.num_layers));
  if (config.nextn_layers > 0) {
    std::printf(" (and %lld multi-token-prediction, not run)",
                static_cast<long long>(config.nextn_layers));
  }
  std::printf("\n");
  std::printf("hidden          %lld (ffn %lld)\n", static_cast<long long>(config.hidden_size),
              static_cast<long long>(config.intermediate_size));
  if (config.num_experts > 0) {
    std::printf("experts         %lld, %lld per token%s\n",
                static_cast<long long>(config.num_experts),
                static_cast<long long>(config.num_experts_used),
                config.expert_weights_norm ? " (weights renormalized)" : "");
    if (config.expert_sigmoid || config.expert_selection_bias ||
        config.expert_weights_scale != 1.0f) {
      std::printf("routing         %s scores%s, weights x %g\n",
                  config.expert_sigmoid ? "sigmoid" : "softmax",
                  config.expert_selection_bias ? " chosen with a per-expert bias" : "",
                  static_cast<double>(config.expert_weights_scale));
    }
    if (config.leading_dense_layers > 0) {
      std::printf("dense layers    the first %lld (ffn %lld)\n",
                  static_cast<long long>(config.leading_dense_layers),
                  static_cast<long long>(config.dense_intermediate_size));
    }
    if (config.shared_expert_intermediate_size > 0) {
      std::printf("shared expert   ffn %lld%s\n",
                  static_cast<long long>(config.shared_expert_intermediate_size),
                  config.shared_expert_gated ? ", sigmoid-gated" : "");
    }
  }
  std::printf("heads           %lld query, %lld kv, head dim %lld\n",
              static_cast<long long>(config.num_heads), static_cast<long long>(config.num_kv_heads),
              static_cast<long long>(config.head_dim));
  std::printf("context         %lld tokens\n", static_cast<long long>(config.context_length));
  std::printf("vocab           %lld\n", static_cast<long long>(config.vocab_size));
  std::printf("rope            theta %g, scaling %s x%g\n", config.rope_theta,
              RopeScalingName(config.rope_scaling), config.rope_scaling_factor);
  std::printf("rms norm eps    %g\n", config.rms_norm_eps);
  std::printf("embeddings      %s\n", config.tied_embeddings ? "tied" : "separate LM head");
}

void PrintTensorFormats(const common::GgufFile& gguf) {
  std::map<std::string, std::pair<int, uint64_t>> by_type;  // name -> (count, bytes)
  for (const common::GgufTensorInfo& tensor : gguf.tensors()) {
    auto& entry = by_type[common::RawGgmlTypeName(static_cast<uint32_t>(tensor.type))];
    entry.first++;
    entry.second += tensor.num_bytes;
  }
  std::vector<std::string> parts;
  for (const auto& [name, entry] : by_type) {
    parts.push_back(name + " x" + std::to_string(entry.first) + " (" +
                    std::to_string(entry.second >> 20) + " MiB)");
  }
  std::printf("tensors         %zu: %s\n", gguf.tensors().size(), absl::StrJoin(parts, ", ").c_str());
}

}  // namespace

int RunInspectCommand(int argc, char** argv) {
  std::string model_path;
  std::string prompt = "What is a paged KV cache?";
  cli::CommandLine command_line(
      "loom inspect", "loom inspect MODEL: show a model's configuration, tokenizer and chat "
                      "template");
  cli::AddString(command_line.app(), "model,--model", model_path, "the model file; required");
  cli::AddString(command_line.app(), "--prompt", prompt,
                 "the user message the chat template is rendered with");
  if (std::optional<int> exit_code = command_line.Parse(argc, argv)) return *exit_code;
  if (model_path.empty()) return command_line.Fail("the model is required (MODEL or --model)");
  auto gguf = common::OpenModelFile(model_path);
  if (!gguf.ok()) {
    std::fprintf(stderr, "loom inspect: %s\n", gguf.status().ToString().c_str());
    return 1;
  }
  auto config = common::ModelConfigFromGguf(**gguf);
  if (!config.ok()) {
    std::fprintf(stderr, "loom inspect: %s\n", config.status().ToString().c_str());
    return 1;
  }
  PrintConfig(*config);
  PrintTensorFormats(**gguf);

  auto tokenizer = common::Tokenizer::FromGguf(**gguf);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "loom inspect: %s\n", tokenizer.status().ToString().c_str());
    return 1;
  }
  const common::Tokenizer& tok = **tokenizer;
  std::printf("tokenizer       %d tokens, bos %d, eos %d\n", tok.vocab_size(), tok.bos_id(),
              tok.eos_id());

  auto template_source = (*gguf)->GetString("tokenizer.chat_template");
  if (!template_source.ok()) {
    std::printf("chat template   none\n");
    return 0;
  }
  auto chat_template = common::ChatTemplate::Parse(*template_source);
  if (!chat_template.ok()) {
    std::fprintf(stderr, "loom inspect: chat template: %s\n",
                 chat_template.status().ToString().c_str());
    return 1;
  }
  common::ChatTemplateInputs inputs;
  inputs.messages.push_back({"user", prompt});
  inputs.add_generation_prompt = true;
  if (tok.bos_id() >= 0) inputs.bos_token = std::string(tok.TokenText(tok.bos_id()));
  if (tok.eos_id() >= 0) inputs.eos_token = std::string(tok.TokenText(tok.eos_id()));
  auto rendered = (*chat_template)->Render(inputs);
  if (!rendered.ok()) {
    std::fprintf(stderr, "loom inspect: chat template: %s\n", rendered.status().ToString().c_str());
    return 1;
  }
  std::vector<int32_t> ids = tok.Encode(*rendered, /*add_special=*/true, /*parse_special=*/true);
  std::printf("\nchat prompt (%zu tokens):\n%s\n", ids.size(), rendered->c_str());
  std::printf("token ids: %s\n", absl::StrJoin(ids, " ").c_str());
  return 0;
}

}  // namespace loom::cli
