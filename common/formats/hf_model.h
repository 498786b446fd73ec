#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/formats/gguf_file.h"

namespace loom::common {

/// The GGUF tensor name of a Hugging Face llama-family tensor name
/// (`model.layers.3.self_attn.q_proj.weight` -> `blk.3.attn_q.weight`), or "" for a name
/// with no GGUF counterpart. With `sandwich_norms` (Gemma), post_attention_layernorm is the
/// attention output's norm and pre/post_feedforward_layernorm the FFN's two. A multimodal
/// checkpoint's text-model tensors (`language_model.model.*`, `language_model.lm_head.*`,
/// or transformers' newer `model.language_model.*`) map as the text model's own.
std::string GgufTensorName(std::string_view hf_name, bool sandwich_norms = false);

/// Whether `hf_name` belongs to a multimodal checkpoint's vision tower or projector (not
/// served: Loom runs the text model).
bool IsVisionTensorName(std::string_view hf_name);

/// Opens a Hugging Face model directory (config.json, model.safetensors or sharded
/// checkpoint, tokenizer.json, tokenizer_config.json, generation_config.json) as a GGUF
/// view: the metadata the GGUF converter would write, and every tensor under its GGUF
/// name and ggml shape with its bytes still in the mapped safetensors files (F32, F16,
/// BF16; never copied). The rest of Loom (model config, weights, tokenizer, chat template)
/// reads it like a GGUF file. HF q/k projections keep their rotate-half row order
/// (`loom.rope.neox`). Errors name the file and the field or tensor at fault.
absl::StatusOr<std::unique_ptr<GgufFile>> OpenHfDirectory(const std::string& dir);

/// `path` as a model: a directory is a Hugging Face model directory, anything else a GGUF
/// file. A path that does not exist goes through the model locator first (a Hugging Face
/// Hub id, fetched into the local cache: cli/hf_hub).
absl::StatusOr<std::unique_ptr<GgufFile>> OpenModelFile(const std::string& path);

/// Maps a model name that is not a local path to one (or returns it unchanged).
using ModelLocator = std::function<absl::StatusOr<std::string>(const std::string& model)>;
/// Installs the locator OpenModelFile and LocateModel use (the commands' main() installs the
/// Hub's); none by default. Not thread-safe against concurrent opens: call at start-up.
void SetModelLocator(ModelLocator locator);
/// `model` itself when it exists on disk, else what the locator makes of it.
absl::StatusOr<std::string> LocateModel(const std::string& model);

}  // namespace loom::common
