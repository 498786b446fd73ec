#include "worker/draft_model.h"

#include <utility>

#include "absl/strings/str_format.h"
#include "common/formats/hf_model.h"
#include "common/status_macros.h"

namespace loom::worker {

absl::StatusOr<std::unique_ptr<common::GgufFile>> OpenDraftModel(const std::string& path,
                                                                 const common::GgufFile& target,
                                                                 const std::string& target_path) {
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<common::GgufFile> draft, common::OpenModelFile(path));
  if (absl::Status same = CheckSameVocabulary(target, *draft); !same.ok()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--draft-model %s cannot draft for --model %s: %s", path, target_path, same.message()));
  }
  return draft;
}

absl::StatusOr<DraftModel> MakeDraftModel(std::unique_ptr<common::GgufFile> gguf,
                                          std::unique_ptr<ForwardPass> forward_pass,
                                          int64_t vocab_size, int64_t num_kv_blocks,
                                          int64_t block_size, int64_t max_pass_tokens) {
  DraftModel draft;
  draft.gguf = std::move(gguf);
  draft.config = forward_pass->config();
  const model::KvCache* pool = forward_pass->kv_pool();
  draft.kv_bytes = pool == nullptr ? 0 : pool->bytes();
  LOOM_ASSIGN_OR_RETURN(draft.proposer,
                        DraftProposer::Create(std::move(forward_pass), vocab_size, num_kv_blocks,
                                              block_size, max_pass_tokens));
  return draft;
}

absl::StatusOr<DraftModel> LoadDraftModel(const std::string& path, const common::GgufFile& target,
                                          const std::string& target_path, int64_t vocab_size,
                                          const CpuForwardPassOptions& pass_options) {
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<common::GgufFile> gguf,
                        OpenDraftModel(path, target, target_path));
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<CpuForwardPass> forward_pass,
                        CpuForwardPass::Create(*gguf, pass_options));
  return MakeDraftModel(std::move(gguf), std::move(forward_pass), vocab_size,
                        pass_options.num_kv_blocks, pass_options.block_size);
}

absl::StatusOr<CudaDraft> LoadCudaDraft(const std::string& path, const common::GgufFile& target,
                                        const std::string& target_path,
                                        StepBackendOptions options) {
  CudaDraft draft;
  LOOM_ASSIGN_OR_RETURN(draft.gguf, OpenDraftModel(path, target, target_path));
  draft.startup_lock = CudaForwardPass::AcquireStartupLock(options.gpu_index);
  options.startup_lock_held = true;
  if (options.num_kv_blocks == 0) options.num_kv_blocks = 1;  // grown by FinishCudaDraft
  options.draft_kv_bytes_per_block = options.draft_device_bytes = 0;
  LOOM_ASSIGN_OR_RETURN(const CudaForwardPassOptions cuda_options,
                        CudaForwardPassOptionsOf(options, *draft.gguf));
  LOOM_ASSIGN_OR_RETURN(draft.forward_pass, CudaForwardPass::Create(*draft.gguf, cuda_options));
  draft.kv_bytes_per_block =
      CudaForwardPass::KvBytesPerBlock(draft.forward_pass->config(), cuda_options.block_size,
                                       cuda_options.kv_dtype, cuda_options.kv_quant);
  draft.device_bytes = draft.forward_pass->device_bytes();
  draft.max_pass_tokens = cuda_options.max_num_tokens;
  return draft;
}

absl::StatusOr<DraftModel> FinishCudaDraft(CudaDraft draft, int64_t vocab_size,
                                           int64_t num_kv_blocks, int64_t block_size) {
  if (draft.forward_pass->num_kv_blocks() != num_kv_blocks) {
    LOOM_RETURN_IF_ERROR(draft.forward_pass->ResizeKvPool(num_kv_blocks));
  }
  draft.startup_lock.reset();  // both pools are in: the next worker on the GPU may measure
  return MakeDraftModel(std::move(draft.gguf), std::move(draft.forward_pass), vocab_size,
                        num_kv_blocks, block_size, draft.max_pass_tokens);
}

}  // namespace loom::worker
