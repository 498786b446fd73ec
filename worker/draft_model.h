#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/formats/gguf_file.h"
#include "common/formats/model_config.h"
#include "worker/cpu_forward_pass.h"
#include "worker/draft_proposer.h"

namespace loom::worker {

/// A draft model loaded for speculation: its file (the forward pass's weights may view its bytes)
/// and the proposer over its CPU forward pass, destroyed before the file.
struct DraftModel {
  std::unique_ptr<common::GgufFile> gguf;
  std::unique_ptr<DraftProposer> proposer;
  common::ModelConfig config;  // the draft's, for the load log
  int64_t kv_bytes = 0;        // its KV pool's size
};

/// Opens the draft model at `path` (a GGUF file or HF directory) for the target model
/// `target` (at `target_path`, of `vocab_size` tokens) and loads it on the CPU forward pass
/// with `pass_options`, whose KV pool mirrors the target's (the same block count and block
/// size, so the coordinator's block tables address both). InvalidArgument naming both models
/// when the vocabularies differ; the error of opening or loading the draft otherwise.
absl::StatusOr<DraftModel> LoadDraftModel(const std::string& path, const common::GgufFile& target,
                                          const std::string& target_path, int64_t vocab_size,
                                          const CpuForwardPassOptions& pass_options);

}  // namespace loom::worker
