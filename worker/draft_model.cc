#include "worker/draft_model.h"

#include <utility>

#include "absl/strings/str_format.h"
#include "common/formats/hf_model.h"

namespace loom::worker {

absl::StatusOr<DraftModel> LoadDraftModel(const std::string& path, const common::GgufFile& target,
                                          const std::string& target_path, int64_t vocab_size,
                                          const CpuForwardPassOptions& pass_options) {
  DraftModel draft;
  absl::StatusOr<std::unique_ptr<common::GgufFile>> opened = common::OpenModelFile(path);
  if (!opened.ok()) return opened.status();
  draft.gguf = *std::move(opened);
  if (absl::Status same = CheckSameVocabulary(target, *draft.gguf); !same.ok()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--draft-model %s cannot draft for --model %s: %s", path, target_path, same.message()));
  }
  absl::StatusOr<std::unique_ptr<CpuForwardPass>> forward_pass =
      CpuForwardPass::Create(*draft.gguf, pass_options);
  if (!forward_pass.ok()) return forward_pass.status();
  draft.config = (*forward_pass)->config();
  draft.kv_bytes = (*forward_pass)->kv_cache().bytes();
  absl::StatusOr<std::unique_ptr<DraftProposer>> proposer = DraftProposer::Create(
      *std::move(forward_pass), vocab_size, pass_options.num_kv_blocks, pass_options.block_size);
  if (!proposer.ok()) return proposer.status();
  draft.proposer = *std::move(proposer);
  return draft;
}

}  // namespace loom::worker
