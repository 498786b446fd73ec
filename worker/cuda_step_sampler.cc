#include "worker/cuda_step_sampler.h"

#if LOOM_HAVE_CUDA
#include <algorithm>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "kernels/cuda/sampling.h"
#include "kernels/cuda/speculative_verify.h"
#include "model/cuda_status.h"

namespace loom::worker {
namespace {

namespace kc = kernels::cuda;
using kc::DeviceBuffer;
using model::CudaStatus;

absl::Status Reserve(DeviceBuffer& buffer, size_t bytes) {
  if (buffer.data() != nullptr && buffer.bytes() >= bytes) return absl::OkStatus();
  buffer = DeviceBuffer();
  LOOM_ASSIGN_OR_RETURN(buffer, DeviceBuffer::Allocate(std::max<size_t>(bytes, 256)));
  return absl::OkStatus();
}

// Copies `count` elements of `host` into `buffer` (grown to fit) on the stream; from pageable
// memory, so the host copy is free to change once this returns.
template <typename T>
absl::Status Upload(DeviceBuffer& buffer, const T* host, size_t count, cudaStream_t stream) {
  if (count == 0) return absl::OkStatus();
  LOOM_RETURN_IF_ERROR(Reserve(buffer, count * sizeof(T)));
  return CudaStatus(
      cudaMemcpyAsync(buffer.data(), host, count * sizeof(T), cudaMemcpyHostToDevice, stream),
      "cudaMemcpyAsync of sampling inputs");
}

}  // namespace

absl::Status CudaStepSampler::Enqueue(const DeviceSampleRows& rows, const float* logits,
                                      int64_t vocab, cudaStream_t stream,
                                      std::vector<int32_t>& tokens, std::vector<float>& logprobs) {
  const int64_t num_rows = static_cast<int64_t>(rows.params.size());
  tokens.resize(num_rows);
  logprobs.resize(num_rows);
  if (num_rows == 0) return absl::OkStatus();
  std::vector<kc::SamplingRowParams> params(num_rows);
  for (int64_t i = 0; i < num_rows; ++i) {
    const SamplingParams& p = rows.params[i];
    params[i].temperature = p.temperature;
    params[i].top_k = p.top_k;
    params[i].top_p = p.top_p;
    params[i].min_p = p.min_p;
    params[i].repetition_penalty = p.repetition_penalty;
    params[i].presence_penalty = p.presence_penalty;
    params[i].frequency_penalty = p.frequency_penalty;
    params[i].seed = p.seed;
    params[i].step = static_cast<uint64_t>(rows.positions[i]);
  }
  LOOM_RETURN_IF_ERROR(Upload(params_, params.data(), params.size(), stream));
  kc::SampleTokensParams p;
  p.logits = logits;
  p.num_rows = num_rows;
  p.vocab_size = vocab;
  p.rows = static_cast<const kc::SamplingRowParams*>(params_.data());
  if (!rows.penalty_tokens.empty()) {
    LOOM_RETURN_IF_ERROR(
        Upload(penalty_indptr_, rows.penalty_indptr.data(), rows.penalty_indptr.size(), stream));
    LOOM_RETURN_IF_ERROR(
        Upload(penalty_tokens_, rows.penalty_tokens.data(), rows.penalty_tokens.size(), stream));
    LOOM_RETURN_IF_ERROR(
        Upload(penalty_counts_, rows.penalty_counts.data(), rows.penalty_counts.size(), stream));
    p.penalty_indptr = static_cast<const int32_t*>(penalty_indptr_.data());
    p.penalty_tokens = static_cast<const int32_t*>(penalty_tokens_.data());
    p.penalty_counts = static_cast<const int32_t*>(penalty_counts_.data());
    LOOM_RETURN_IF_ERROR(Reserve(workspace_, kc::SampleTokensWorkspaceBytes(p)));
    p.workspace = static_cast<float*>(workspace_.data());
    p.workspace_bytes = workspace_.bytes();
  }
  LOOM_RETURN_IF_ERROR(Reserve(tokens_, num_rows * sizeof(int32_t)));
  LOOM_RETURN_IF_ERROR(Reserve(logprobs_, num_rows * sizeof(float)));
  p.tokens = static_cast<int32_t*>(tokens_.data());
  p.logprobs = static_cast<float*>(logprobs_.data());
  LOOM_RETURN_IF_ERROR(kc::LaunchSampleTokens(p, stream));
  if (!rows.verifies.empty()) LOOM_RETURN_IF_ERROR(EnqueueVerifies(rows, p, stream));
  LOOM_RETURN_IF_ERROR(
      CudaStatus(cudaMemcpyAsync(tokens.data(), tokens_.data(), num_rows * sizeof(int32_t),
                                 cudaMemcpyDeviceToHost, stream),
                 "cudaMemcpyAsync of the sampled tokens"));
  return CudaStatus(cudaMemcpyAsync(logprobs.data(), logprobs_.data(), num_rows * sizeof(float),
                                    cudaMemcpyDeviceToHost, stream),
                    "cudaMemcpyAsync of the sampled tokens' logprobs");
}

absl::Status CudaStepSampler::EnqueueVerifies(const DeviceSampleRows& rows,
                                              const kc::SampleTokensParams& sampled,
                                              cudaStream_t stream) {
  const int64_t vocab = sampled.vocab_size;
  // Every sequence's small inputs packed one after the other, uploaded once; its q (k x vocab)
  // uploaded straight from the caller's memory to its offset.
  std::vector<int32_t> drafts;
  std::vector<float> uniforms, sample_uniforms;
  row_starts_host_.clear();
  for (const DeviceSampleRows::DraftVerify& v : rows.verifies) {
    if (v.draft_probs.size() != v.drafts.size() * static_cast<size_t>(vocab)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("a verification of %d drafts has %d draft probabilities (vocab %d)",
                          v.drafts.size(), v.draft_probs.size(), vocab));
    }
    drafts.insert(drafts.end(), v.drafts.begin(), v.drafts.end());
    uniforms.insert(uniforms.end(), v.accept_uniforms.begin(), v.accept_uniforms.end());
    sample_uniforms.insert(sample_uniforms.end(), v.sample_uniforms.begin(),
                           v.sample_uniforms.end());
    row_starts_host_.push_back(0);
    row_starts_host_.push_back(static_cast<int32_t>(v.drafts.size() + 1));
  }
  const uint8_t not_greedy = 0;
  LOOM_RETURN_IF_ERROR(Upload(drafts_, drafts.data(), drafts.size(), stream));
  LOOM_RETURN_IF_ERROR(Reserve(draft_probs_, drafts.size() * vocab * sizeof(float)));
  for (size_t j = 0, draft = 0; j < rows.verifies.size(); ++j) {
    const absl::Span<const float> q = rows.verifies[j].draft_probs;
    LOOM_RETURN_IF_ERROR(CudaStatus(
        cudaMemcpyAsync(static_cast<float*>(draft_probs_.data()) + draft * vocab, q.data(),
                        q.size() * sizeof(float), cudaMemcpyHostToDevice, stream),
        "cudaMemcpyAsync of draft distributions"));
    draft += rows.verifies[j].drafts.size();
  }
  LOOM_RETURN_IF_ERROR(Upload(uniforms_, uniforms.data(), uniforms.size(), stream));
  LOOM_RETURN_IF_ERROR(
      Upload(sample_uniforms_, sample_uniforms.data(), sample_uniforms.size(), stream));
  LOOM_RETURN_IF_ERROR(
      Upload(row_starts_, row_starts_host_.data(), row_starts_host_.size(), stream));
  LOOM_RETURN_IF_ERROR(Upload(greedy_, &not_greedy, 1, stream));
  const size_t count = rows.verifies.size();
  LOOM_RETURN_IF_ERROR(Reserve(verified_, 2 * count * sizeof(int32_t)));
  size_t most_rows = 0;
  for (const DeviceSampleRows::DraftVerify& v : rows.verifies) {
    most_rows = std::max(most_rows, v.drafts.size() + 1);
  }
  LOOM_RETURN_IF_ERROR(Reserve(probs_, most_rows * static_cast<size_t>(vocab) * sizeof(float)));
  LOOM_RETURN_IF_ERROR(Reserve(verify_tokens_, most_rows * sizeof(int32_t)));
  // Per sequence, in stream order over one buffer: its rows' distributions (the sampler again
  // over those rows: the same parameters and penalties), then their verification.
  size_t draft = 0, row = 0;
  for (size_t j = 0; j < count; ++j) {
    const DeviceSampleRows::DraftVerify& v = rows.verifies[j];
    kc::SampleTokensParams target = sampled;
    target.logits = sampled.logits + v.first_row * vocab;
    target.num_rows = static_cast<int64_t>(v.drafts.size() + 1);
    target.rows = sampled.rows + v.first_row;
    if (target.penalty_indptr != nullptr) {
      target.penalty_indptr += v.first_row;  // its entries index the whole lists
      target.workspace += v.first_row * vocab;
      target.workspace_bytes -= static_cast<size_t>(v.first_row * vocab) * sizeof(float);
    }
    target.tokens = static_cast<int32_t*>(verify_tokens_.data());
    target.logprobs = nullptr;
    target.probs = static_cast<float*>(probs_.data());
    LOOM_RETURN_IF_ERROR(kc::LaunchSampleTokens(target, stream));
    kc::SpeculativeVerifyParams q;
    q.target_probs = static_cast<const float*>(probs_.data());
    q.draft_probs = static_cast<const float*>(draft_probs_.data()) + draft * vocab;
    q.draft_tokens = static_cast<const int32_t*>(drafts_.data()) + draft;
    q.uniforms = static_cast<const float*>(uniforms_.data()) + row;
    q.sample_uniforms = static_cast<const float*>(sample_uniforms_.data()) + row;
    q.row_start = static_cast<const int32_t*>(row_starts_.data()) + 2 * j;
    q.row_start_host = row_starts_host_.data() + 2 * j;
    q.greedy = static_cast<const uint8_t*>(greedy_.data());
    q.num_seqs = 1;
    q.vocab = vocab;
    q.num_accepted = static_cast<int32_t*>(verified_.data()) + 2 * j;
    q.next_token = static_cast<int32_t*>(verified_.data()) + 2 * j + 1;
    LOOM_RETURN_IF_ERROR(kc::LaunchSpeculativeVerify(q, stream));
    draft += v.drafts.size();
    row += v.drafts.size() + 1;
  }
  verified_host_.resize(2 * count);
  return CudaStatus(cudaMemcpyAsync(verified_host_.data(), verified_.data(),
                                    2 * count * sizeof(int32_t), cudaMemcpyDeviceToHost, stream),
                    "cudaMemcpyAsync of the verifications");
}

absl::Status CudaStepSampler::Finish(const DeviceSampleRows& rows,
                                     std::vector<int32_t>& tokens) const {
  for (size_t j = 0; j < rows.verifies.size(); ++j) {
    const DeviceSampleRows::DraftVerify& v = rows.verifies[j];
    const int32_t accepted = verified_host_[2 * j], next = verified_host_[2 * j + 1];
    const int32_t k = static_cast<int32_t>(v.drafts.size());
    if (accepted < 0 || accepted > k || next < 0) {
      return absl::InternalError(absl::StrFormat(
          "the device's verification refused the drafts of sample row %d", v.first_row));
    }
    for (int32_t i = 0; i <= k; ++i) {
      tokens[v.first_row + i] = i < accepted ? v.drafts[i] : i == accepted ? next : -1;
    }
  }
  return absl::OkStatus();
}

}  // namespace loom::worker
#endif  // LOOM_HAVE_CUDA
