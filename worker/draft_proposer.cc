#include "worker/draft_proposer.h"

#include <algorithm>
#include <string>
#include <string_view>

#include "absl/strings/str_format.h"
#include "common/formats/model_config.h"
#include "common/status_macros.h"
#include "worker/step_backend.h"

namespace loom::worker {
namespace {

// Inverse CDF of `q` [vocab] at u in [0, 1); never a token of probability 0.
int32_t DrawFrom(const float* q, int64_t vocab, double u) {
  double total = 0;
  for (int64_t v = 0; v < vocab; ++v) total += q[v];
  const double target = u * total;
  double cumulative = 0;
  int32_t last_positive = 0;
  for (int64_t v = 0; v < vocab; ++v) {
    if (q[v] <= 0.0f) continue;
    last_positive = static_cast<int32_t>(v);
    cumulative += q[v];
    if (target < cumulative) return last_positive;
  }
  return last_positive;  // rounding at the top end
}

}  // namespace

absl::StatusOr<std::unique_ptr<DraftProposer>> DraftProposer::Create(
    std::unique_ptr<ForwardPass> draft, int64_t vocab_size, int64_t num_kv_blocks,
    int64_t block_size, int64_t max_pass_tokens) {
  if (draft == nullptr) return absl::InvalidArgumentError("draft proposer: no draft model");
  if (max_pass_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("draft proposer: max_pass_tokens %d must be >= 0", max_pass_tokens));
  }
  if (draft->config().vocab_size != vocab_size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the draft model's vocabulary has %d tokens, the target's %d: a draft must share the "
        "target's vocabulary",
        draft->config().vocab_size, vocab_size));
  }
  if (draft->num_kv_blocks() != num_kv_blocks || draft->block_size() != block_size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the draft model's KV pool is %d blocks of %d tokens, the target's %d of %d: the draft "
        "shares the target's block tables",
        draft->num_kv_blocks(), draft->block_size(), num_kv_blocks, block_size));
  }
  return std::unique_ptr<DraftProposer>(new DraftProposer(std::move(draft), max_pass_tokens));
}

int64_t DraftProposer::NumDraftComputedAfter(int64_t num_tokens, int32_t num_drafts,
                                             int32_t num_accepted) {
  // Drafts 1..k-1 went through the draft model (the last one only was sampled).
  return num_tokens + std::min(num_accepted, num_drafts - 1);
}

void DraftProposer::Draw(const DraftRequest& request, const float* logits, int64_t position,
                         DraftProposal& proposal) {
  const int64_t vocab = draft_->config().vocab_size;
  // The penalties count the drafts before this one, as the target's p will.
  if (request.sampler->greedy()) {
    proposal.tokens.push_back(request.sampler->PenalizedArgmax(logits, proposal.tokens));
    return;
  }
  proposal.probs.resize(proposal.probs.size() + vocab);
  float* q = proposal.probs.data() + proposal.probs.size() - vocab;
  request.sampler->Distribution(logits, proposal.tokens, q);
  proposal.tokens.push_back(
      DrawFrom(q, vocab, request.sampler->PositionUniform(position, kDraftSampleStream)));
}

absl::Status DraftProposer::Propose(absl::Span<const DraftRequest> requests,
                                    std::vector<DraftProposal>& proposals) {
  const common::ModelConfig& config = draft_->config();
  const int64_t block_size = draft_->block_size();
  proposals.assign(requests.size(), DraftProposal{});
  // Drafts per request: the wanted ones, cut where the draft's own context ends (drawing
  // draft j reads the n + j - 1 tokens before it).
  std::vector<int32_t> num_drafts(requests.size(), 0);
  int32_t most_drafts = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const DraftRequest& request = requests[i];
    const int64_t n = static_cast<int64_t>(request.tokens.size());
    if (request.sampler == nullptr) {
      return absl::InvalidArgumentError(absl::StrFormat("draft request %d has no sampler", i));
    }
    if (request.num_draft_computed < 0 || request.num_draft_computed >= n) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "draft request %d: %d tokens computed by the draft of %d known: nothing to propose from",
          i, request.num_draft_computed, n));
    }
    const int64_t wanted =
        std::max<int64_t>(0, std::min<int64_t>(request.max_drafts, config.context_length - n + 1));
    if (wanted > 0 &&
        static_cast<int64_t>(request.block_table.size()) * block_size < n + wanted - 1) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "draft request %d: %d blocks of %d tokens cannot hold %d tokens and %d drafts", i,
          request.block_table.size(), block_size, n, wanted));
    }
    num_drafts[i] = static_cast<int32_t>(wanted);
    most_drafts = std::max(most_drafts, num_drafts[i]);
    if (wanted > 0) proposals[i].tokens.reserve(wanted);
    if (wanted > 0 && !request.sampler->greedy()) {
      proposals[i].probs.reserve(wanted * config.vocab_size);
    }
  }
  // Pass j (0-based) draws draft j of every request that wants more than j: pass 0 feeds
  // the tokens the draft has not seen, the others the previous draft.
  std::vector<int64_t> computed(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) computed[i] = requests[i].num_draft_computed;
  LOOM_RETURN_IF_ERROR(CatchUp(requests, num_drafts, computed));
  std::vector<size_t> in_pass;
  for (int32_t j = 0; j < most_drafts; ++j) {
    batch_ = StepBatch();
    in_pass.clear();
    for (size_t i = 0; i < requests.size(); ++i) {
      if (num_drafts[i] <= j) continue;
      const DraftRequest& request = requests[i];
      const int64_t n = static_cast<int64_t>(request.tokens.size());
      if (j == 0) {
        LOOM_RETURN_IF_ERROR(
            AppendSequence(batch_, request.tokens.subspan(computed[i], n - computed[i]),
                           static_cast<int32_t>(computed[i]), request.block_table,
                           static_cast<int32_t>(block_size), /*sample_last=*/true));
      } else {
        const int32_t previous = proposals[i].tokens.back();
        LOOM_RETURN_IF_ERROR(AppendSequence(batch_, absl::MakeConstSpan(&previous, 1),
                                            static_cast<int32_t>(n + j - 1), request.block_table,
                                            static_cast<int32_t>(block_size),
                                            /*sample_last=*/true));
      }
      in_pass.push_back(i);
    }
    if (draft_->samples_on_device()) {
      LOOM_RETURN_IF_ERROR(StepAndDraw(requests, in_pass, j, proposals));
      continue;
    }
    LOOM_RETURN_IF_ERROR(draft_->Step(batch_, logits_));
    for (size_t r = 0; r < in_pass.size(); ++r) {
      const size_t i = in_pass[r];
      const int64_t n = static_cast<int64_t>(requests[i].tokens.size());
      Draw(requests[i], logits_.data() + r * config.vocab_size, n + j, proposals[i]);
    }
  }
  return absl::OkStatus();
}

absl::Status DraftProposer::CatchUp(absl::Span<const DraftRequest> requests,
                                    absl::Span<const int32_t> num_drafts,
                                    std::vector<int64_t>& computed) {
  if (max_pass_tokens_ == 0) return absl::OkStatus();
  auto unseen = [&](size_t i) {
    return num_drafts[i] > 0 ? static_cast<int64_t>(requests[i].tokens.size()) - computed[i] : 0;
  };
  int64_t total = 0;
  for (size_t i = 0; i < requests.size(); ++i) total += unseen(i);
  const int32_t block_size = static_cast<int32_t>(draft_->block_size());
  while (total > max_pass_tokens_) {
    batch_ = StepBatch();
    int64_t room = max_pass_tokens_;
    for (size_t i = 0; i < requests.size() && room > 0; ++i) {
      const int64_t take = std::min(room, unseen(i) - 1);  // the last token samples later
      if (take <= 0) continue;
      LOOM_RETURN_IF_ERROR(AppendSequence(batch_, requests[i].tokens.subspan(computed[i], take),
                                          static_cast<int32_t>(computed[i]),
                                          requests[i].block_table, block_size,
                                          /*sample_last=*/false));
      computed[i] += take;
      room -= take;
      total -= take;
    }
    // One token each is left: more speculating sequences than a pass holds (the scheduler
    // never plans that many), so the sampling pass takes more than max_pass_tokens_.
    if (room == max_pass_tokens_) break;
    LOOM_RETURN_IF_ERROR(draft_->Step(batch_, logits_));
  }
  return absl::OkStatus();
}

bool DraftProposer::DrawsOnDevice(const DraftRequest& request) const {
  const SequenceSampler& sampler = *request.sampler;
  return draft_->samples_on_device() && sampler.greedy() && !sampler.adjusts_logits() &&
         !sampler.constrained();
}

absl::Status DraftProposer::StepAndDraw(absl::Span<const DraftRequest> requests,
                                        absl::Span<const size_t> in_pass, int32_t pass,
                                        std::vector<DraftProposal>& proposals) {
  device_rows_.Clear();
  for (size_t r = 0; r < in_pass.size(); ++r) {
    const DraftRequest& request = requests[in_pass[r]];
    // The index of the token this row decides: n + pass.
    device_rows_.positions.push_back(static_cast<int64_t>(request.tokens.size()) + pass);
    if (DrawsOnDevice(request)) {
      device_rows_.params.push_back(request.sampler->params());
      // The penalties count the drafts before this one, as the target's rows will.
      request.sampler->PenaltyEntries(device_rows_.penalty_tokens, device_rows_.penalty_counts,
                                      proposals[in_pass[r]].tokens);
    } else {
      SamplingParams unused;  // the device's pick of this row is not used
      unused.temperature = 0.0f;
      device_rows_.params.push_back(unused);
      device_rows_.logits_rows.push_back(static_cast<int32_t>(r));
    }
    device_rows_.penalty_indptr.push_back(static_cast<int32_t>(device_rows_.penalty_tokens.size()));
  }
  LOOM_RETURN_IF_ERROR(
      draft_->StepAndSample(batch_, device_rows_, device_tokens_, device_logprobs_, logits_));
  const int64_t vocab = draft_->config().vocab_size;
  if (device_tokens_.size() != in_pass.size() ||
      logits_.size() != device_rows_.logits_rows.size() * static_cast<size_t>(vocab)) {
    return absl::InternalError(absl::StrFormat(
        "the draft's device picked %d tokens for %d rows and returned %d logits for %d rows",
        device_tokens_.size(), in_pass.size(), logits_.size(), device_rows_.logits_rows.size()));
  }
  size_t host_row = 0;
  for (size_t r = 0; r < in_pass.size(); ++r) {
    const DraftRequest& request = requests[in_pass[r]];
    DraftProposal& proposal = proposals[in_pass[r]];
    if (DrawsOnDevice(request)) {
      proposal.tokens.push_back(device_tokens_[r]);
    } else {
      Draw(request, logits_.data() + host_row++ * vocab, device_rows_.positions[r], proposal);
    }
  }
  return absl::OkStatus();
}

absl::Status CheckSameVocabulary(const common::GgufFile& target, const common::GgufFile& draft) {
  LOOM_ASSIGN_OR_RETURN(const common::ModelConfig target_config,
                        common::ModelConfigFromGguf(target));
  LOOM_ASSIGN_OR_RETURN(const common::ModelConfig draft_config, common::ModelConfigFromGguf(draft));
  if (target_config.vocab_size != draft_config.vocab_size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the draft model's vocabulary has %d tokens, the target's %d: a draft must share the "
        "target's vocabulary",
        draft_config.vocab_size, target_config.vocab_size));
  }
  auto text = [](const common::GgufFile& file, std::string_view key) -> std::string {
    if (file.Find(key) == nullptr) return "";
    absl::StatusOr<std::string_view> value = file.GetString(key);
    return value.ok() ? std::string(*value) : "";
  };
  const std::string target_model = text(target, "tokenizer.ggml.model");
  const std::string draft_model = text(draft, "tokenizer.ggml.model");
  if (target_model != draft_model) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the draft model's tokenizer is '%s', the target's '%s': a draft must share the "
        "target's vocabulary",
        draft_model, target_model));
  }
  if (target.Find("tokenizer.ggml.tokens") == nullptr ||
      draft.Find("tokenizer.ggml.tokens") == nullptr) {
    return absl::OkStatus();
  }
  LOOM_ASSIGN_OR_RETURN(const common::GgufValue::Array* target_tokens,
                        target.GetArray("tokenizer.ggml.tokens"));
  LOOM_ASSIGN_OR_RETURN(const common::GgufValue::Array* draft_tokens,
                        draft.GetArray("tokenizer.ggml.tokens"));
  if (target_tokens->size() != draft_tokens->size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the draft model's tokenizer lists %d tokens, the target's %d: a draft must share the "
        "target's vocabulary",
        draft_tokens->size(), target_tokens->size()));
  }
  for (size_t i = 0; i < target_tokens->size(); ++i) {
    absl::StatusOr<std::string_view> a = (*target_tokens)[i].AsString();
    absl::StatusOr<std::string_view> b = (*draft_tokens)[i].AsString();
    if (!a.ok() || !b.ok() || *a != *b) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "token %d is '%s' in the draft model's tokenizer but '%s' in the target's: a draft "
          "must share the target's vocabulary",
          i, b.ok() ? std::string(*b) : "?", a.ok() ? std::string(*a) : "?"));
    }
  }
  return absl::OkStatus();
}

}  // namespace loom::worker
