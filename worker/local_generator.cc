#include "worker/local_generator.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace loom::worker {
namespace {

struct RunningSequence {
  const GenerationRequest* request = nullptr;
  std::vector<int32_t> tokens;      // prompt + generated
  int32_t num_computed = 0;         // tokens whose K/V are in the cache
  std::vector<int32_t> blocks;
  std::unique_ptr<SequenceSampler> sampler;
  GenerationResult result;
  bool finished = false;
};

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

}  // namespace

LocalGenerator::LocalGenerator(ForwardPass& runner, std::vector<int32_t> eos_ids,
                               int64_t max_batched_tokens)
    : runner_(runner), eos_ids_(std::move(eos_ids)), max_batched_tokens_(max_batched_tokens) {}

absl::StatusOr<std::vector<GenerationResult>> LocalGenerator::Generate(
    const std::vector<GenerationRequest>& requests, const TokenCallback& on_token, bool batched) {
  const common::ModelConfig& config = runner_.config();
  int64_t blocks_needed = 0;
  for (const GenerationRequest& request : requests) {
    if (request.prompt_ids.empty()) return absl::InvalidArgumentError("empty prompt");
    if (request.max_tokens < 1) {
      return absl::InvalidArgumentError(
          absl::StrFormat("max_tokens must be >= 1, got %d", request.max_tokens));
    }
    for (int32_t id : request.prompt_ids) {
      if (id < 0 || id >= config.vocab_size) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "prompt token id %d is outside the vocabulary [0, %d)", id, config.vocab_size));
      }
    }
    const int64_t total = static_cast<int64_t>(request.prompt_ids.size()) + request.max_tokens;
    if (total > config.context_length) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "prompt of %d tokens + max_tokens %d exceeds the context length %d",
          request.prompt_ids.size(), request.max_tokens, config.context_length));
    }
    LOOM_RETURN_IF_ERROR(ValidateSamplingParams(request.sampling, config.vocab_size));
    const int64_t blocks = (total + runner_.block_size() - 1) / runner_.block_size();
    blocks_needed = batched ? blocks_needed + blocks : std::max(blocks_needed, blocks);
  }
  if (blocks_needed > runner_.num_kv_blocks()) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "the requests need %d KV blocks, the pool has %d", blocks_needed, runner_.num_kv_blocks()));
  }
  if (batched) return RunBatch(requests, 0, on_token);
  std::vector<GenerationResult> results;
  for (size_t i = 0; i < requests.size(); ++i) {
    LOOM_ASSIGN_OR_RETURN(std::vector<GenerationResult> one,
                          RunBatch({requests[i]}, i, on_token));
    results.push_back(std::move(one[0]));
  }
  return results;
}

absl::StatusOr<std::vector<GenerationResult>> LocalGenerator::RunBatch(
    const std::vector<GenerationRequest>& requests, size_t first_index,
    const TokenCallback& on_token) {
  const int64_t block_size = runner_.block_size();
  const int64_t vocab = runner_.config().vocab_size;
  // Blocks are handed out in order; Generate checked that they suffice.
  int32_t next_block = 0;
  std::vector<RunningSequence> seqs(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    RunningSequence& seq = seqs[i];
    seq.request = &requests[i];
    seq.tokens = requests[i].prompt_ids;
    seq.sampler = std::make_unique<SequenceSampler>(requests[i].sampling, seq.tokens, vocab);
    const int64_t total = static_cast<int64_t>(seq.tokens.size()) + requests[i].max_tokens;
    for (int64_t b = 0; b < (total + block_size - 1) / block_size; ++b) seq.blocks.push_back(next_block++);
  }

  std::vector<float> logits;
  std::vector<size_t> sampled_seqs;
  while (true) {
    StepBatch batch;
    sampled_seqs.clear();
    int64_t budget = max_batched_tokens_;
    bool has_prefill = false;
    // Decodes first (one token each), then prefill chunks within the token budget.
    for (int pass = 0; pass < 2; ++pass) {
      for (size_t i = 0; i < seqs.size() && budget > 0; ++i) {
        RunningSequence& seq = seqs[i];
        const int64_t pending = static_cast<int64_t>(seq.tokens.size()) - seq.num_computed;
        if (seq.finished || pending <= 0 || (pass == 0) != (pending == 1)) continue;
        const int64_t count = std::min(pending, budget);
        const bool completes_prompt = count == pending;
        LOOM_RETURN_IF_ERROR(AppendSequence(
            batch, absl::MakeConstSpan(seq.tokens).subspan(seq.num_computed, count),
            seq.num_computed, seq.blocks, static_cast<int32_t>(block_size), completes_prompt));
        if (completes_prompt) sampled_seqs.push_back(i);
        has_prefill |= pass == 1;
        seq.num_computed += static_cast<int32_t>(count);
        budget -= count;
      }
    }
    if (batch.num_tokens() == 0) break;
    const auto start = std::chrono::steady_clock::now();
    LOOM_RETURN_IF_ERROR(runner_.Step(batch, logits));
    const double elapsed = Seconds(start);
    for (RunningSequence& seq : seqs) {
      if (seq.finished) continue;
      (has_prefill ? seq.result.prefill_seconds : seq.result.decode_seconds) += elapsed;
    }
    for (size_t s = 0; s < sampled_seqs.size(); ++s) {
      RunningSequence& seq = seqs[sampled_seqs[s]];
      SampledToken token = seq.sampler->Sample(logits.data() + s * vocab);
      seq.tokens.push_back(token.token_id);
      if (on_token) on_token(first_index + sampled_seqs[s], token);
      seq.result.tokens.push_back(std::move(token));
      const int32_t id = seq.tokens.back();
      const GenerationRequest& request = *seq.request;
      const bool is_eos = !request.ignore_eos &&
                          std::find(eos_ids_.begin(), eos_ids_.end(), id) != eos_ids_.end();
      const bool is_stop = std::find(request.stop_token_ids.begin(), request.stop_token_ids.end(),
                                     id) != request.stop_token_ids.end();
      if (is_eos || is_stop) {
        seq.finished = true;
        seq.result.finish_reason = FinishReason::kStop;
      } else if (static_cast<int32_t>(seq.result.tokens.size()) >= request.max_tokens) {
        seq.finished = true;
        seq.result.finish_reason = FinishReason::kLength;
      }
    }
  }
  std::vector<GenerationResult> results;
  for (RunningSequence& seq : seqs) results.push_back(std::move(seq.result));
  return results;
}

}  // namespace loom::worker
