#pragma once

#include <functional>
#include <string>

#include "absl/status/statusor.h"

namespace loom::cli {

/// Where and how Hugging Face Hub models are fetched, as huggingface_hub reads its
/// environment: HF_ENDPOINT (default https://huggingface.co), HF_TOKEN (else the token file
/// HF_HOME/token), HF_HUB_OFFLINE=1 (the cache only), HF_HUB_CACHE (else HF_HOME/hub, else
/// ~/.cache/huggingface/hub), LOOM_HF_REVISION (else "main").
struct HubOptions {
  std::string endpoint = "https://huggingface.co";
  std::string token;
  bool offline = false;
  std::string cache_dir;
  std::string revision = "main";
  /// Progress and decisions, one line each (stderr by default).
  std::function<void(const std::string&)> log;
};

/// HubOptions from the environment (see above).
HubOptions HubOptionsFromEnvironment();

/// True for "org/name" (a repository: a Hugging Face model directory) and
/// "org/name/path/to/file.gguf" (one GGUF file of a repository): two or more
/// '/'-separated parts of letters, digits, '-', '_' and '.', not starting with '.' or '/';
/// false when the first part is a local directory or the name is "x/FILE.gguf" (local
/// paths that do not exist, which then fail as such).
bool LooksLikeHubId(const std::string& model);

/// The local path of Hub model `model` (LooksLikeHubId): the snapshot directory
/// <cache>/models--org--name/snapshots/<commit> (with config.json, the tokenizer files,
/// generation_config.json, chat_template.jinja and the safetensors weights and index), or
/// for "org/name/file.gguf" that file in it. Online, the revision is resolved through the
/// Hub's API and the files the snapshot lacks are downloaded (to FILE.incomplete, renamed
/// when complete; one process at a time per repository, by a lock file); offline, the
/// cache's refs/<revision> names the snapshot. Errors: NotFound for a repository, revision
/// or file the Hub or the cache does not have, PermissionDenied for a gated or private one
/// (naming HF_TOKEN), Unavailable when the Hub cannot be reached (naming HF_HUB_OFFLINE).
absl::StatusOr<std::string> ResolveHubModel(const std::string& model, const HubOptions& options);

/// Makes common::OpenModelFile resolve Hub ids through ResolveHubModel with the
/// environment's options (paths that exist are opened as before). Called once by main().
void InstallHubModelLocator();

}  // namespace loom::cli
