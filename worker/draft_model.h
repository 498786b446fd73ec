#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/formats/gguf_file.h"
#include "common/formats/model_config.h"
#include "worker/cpu_forward_pass.h"
#include "worker/cuda_forward_pass.h"
#include "worker/draft_proposer.h"
#include "worker/forward_pass.h"
#include "worker/step_backend_factory.h"

namespace loom::worker {

/// A draft model loaded for speculation: its file (the forward pass's weights may view its bytes)
/// and the proposer over its forward pass, destroyed before the file.
struct DraftModel {
  std::unique_ptr<common::GgufFile> gguf;
  std::unique_ptr<DraftProposer> proposer;
  common::ModelConfig config;  // the draft's, for the load log
  int64_t kv_bytes = 0;        // its KV pool's size
};

/// Opens the draft model at `path` (a GGUF file or HF directory) for the target model
/// `target` (at `target_path`). InvalidArgument naming both models when the vocabularies
/// differ (CheckSameVocabulary); the error of opening the file otherwise.
absl::StatusOr<std::unique_ptr<common::GgufFile>> OpenDraftModel(const std::string& path,
                                                                 const common::GgufFile& target,
                                                                 const std::string& target_path);

/// The draft model over its opened file and loaded forward pass, whose KV pool mirrors the
/// target's (`num_kv_blocks` blocks of `block_size` tokens, so the coordinator's block
/// tables address both); the target has `vocab_size` tokens; each pass of the draft
/// computes at most `max_pass_tokens` tokens (0: no limit). DraftProposer::Create's errors.
absl::StatusOr<DraftModel> MakeDraftModel(std::unique_ptr<common::GgufFile> gguf,
                                          std::unique_ptr<ForwardPass> forward_pass,
                                          int64_t vocab_size, int64_t num_kv_blocks,
                                          int64_t block_size, int64_t max_pass_tokens = 0);

/// OpenDraftModel, then the draft on the CPU forward pass with `pass_options` (whose
/// num_kv_blocks is the target's), then MakeDraftModel.
absl::StatusOr<DraftModel> LoadDraftModel(const std::string& path, const common::GgufFile& target,
                                          const std::string& target_path, int64_t vocab_size,
                                          const CpuForwardPassOptions& pass_options);

/// A draft model on the target's GPU, loaded before the target: the draft's KV pool must
/// mirror the target's, whose size depends on the memory the draft leaves. The draft is
/// loaded with a one-block pool (or the count given), the target's pool is sized with the
/// draft's share set aside (CudaForwardPassOptions::draft_kv_bytes_per_block and
/// draft_device_bytes, from here), and FinishCudaDraft grows the draft's pool to the target's.
/// The device's start-up lock is held from the draft's load to its resize (the target
/// loads under it: StepBackendOptions::startup_lock_held), so no other worker on the GPU
/// measures memory the draft's pool is about to take.
struct CudaDraft {
  std::unique_ptr<DeviceStartupLock> startup_lock;  // released by FinishCudaDraft
  std::unique_ptr<common::GgufFile> gguf;
  std::unique_ptr<CudaForwardPass> forward_pass;
  int64_t kv_bytes_per_block = 0;  // of the draft's pool
  int64_t device_bytes = 0;        // what the draft took on the device
  // The tokens its activations are reserved for: its catch-up passes are cut to them (a
  // larger pass would grow them after both pools took their share).
  int64_t max_pass_tokens = 0;
};

/// Opens the draft (OpenDraftModel) and loads it on the CUDA forward pass with the target's
/// `options` (CudaForwardPassOptionsOf over the draft's file: its own compute type; a pool
/// of options.num_kv_blocks blocks when given, else of 1 until FinishCudaDraft).
/// CudaForwardPass::Create's errors.
absl::StatusOr<CudaDraft> LoadCudaDraft(const std::string& path, const common::GgufFile& target,
                                        const std::string& target_path, StepBackendOptions options);

/// The draft's pool made `num_kv_blocks` blocks (the target's count, when it differs), then
/// MakeDraftModel. CudaForwardPass::ResizeKvPool's errors.
absl::StatusOr<DraftModel> FinishCudaDraft(CudaDraft draft, int64_t vocab_size,
                                           int64_t num_kv_blocks, int64_t block_size);

}  // namespace loom::worker
