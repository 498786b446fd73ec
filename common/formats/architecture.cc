#include "common/formats/architecture.h"

#include <array>

namespace loom::common {
namespace {

// Mistral's and Qwen's layouts are llama's (same tensor names and hyper-parameters).
constexpr std::array<ArchitectureRules, 4> kArchitectures = {{
    {.gguf_name = "llama",
     .hf_class_name = "LlamaForCausalLM",
     .gguf_rope_neox = false,
     .sliding_window_every_layer = false},
    {.gguf_name = "mistral",
     .hf_class_name = "MistralForCausalLM",
     .gguf_rope_neox = false,
     .sliding_window_every_layer = true},
    {.gguf_name = "qwen2",
     .hf_class_name = "Qwen2ForCausalLM",
     .gguf_rope_neox = true,
     .sliding_window_every_layer = false},
    {.gguf_name = "qwen3",
     .hf_class_name = "Qwen3ForCausalLM",
     .gguf_rope_neox = true,
     .sliding_window_every_layer = false},
}};

}  // namespace

absl::Span<const ArchitectureRules> Architectures() { return kArchitectures; }

const ArchitectureRules* FindArchitecture(std::string_view gguf_name) {
  for (const ArchitectureRules& rules : kArchitectures) {
    if (rules.gguf_name == gguf_name) return &rules;
  }
  return nullptr;
}

const ArchitectureRules* FindHfArchitecture(std::string_view hf_class_name) {
  for (const ArchitectureRules& rules : kArchitectures) {
    if (rules.hf_class_name == hf_class_name) return &rules;
  }
  return nullptr;
}

}  // namespace loom::common
