#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/formats/model_config.h"
#include "common/tokenizer/tokenizer.h"
#include "coordinator/cluster.h"
#include "coordinator/metrics.h"
#include "loom/v1/inference.pb.h"

namespace loom::api {

/// Embeddings of a batch of inputs, in input order.
struct EmbeddingBatch {
  std::vector<std::vector<float>> vectors;  // hidden_size floats each, unit L2 norm
  std::vector<int64_t> input_tokens;        // each input's token count
  int64_t prompt_tokens = 0;                // their sum
};

/// Computes embeddings on the cluster for every front end (POST /v1/embeddings, /v1/score,
/// /v1/rerank and the gRPC Embed call): each input is validated like a completion's prompt
/// (all before any is placed, so a bad one leaves nothing running) and placed as an
/// embedding request (RequestParams::embed: one prefill whose answer is the last token's
/// final hidden state, L2-normalized). Thread-safe.
class Embedder {
 public:
  Embedder(coordinator::Cluster& cluster, const common::ModelConfig& config,
           const common::Tokenizer& tokenizer, coordinator::CoordinatorMetrics* metrics);

  /// `inputs` carry text or token ids (their other fields are ignored). `cancelled`, when
  /// given, is polled while waiting: once it answers true the inputs still running are
  /// cancelled (their blocks freed at the replica's next step) and Cancelled is returned.
  /// InvalidArgument for a bad input, ResourceExhausted/Unavailable as admission answers,
  /// Unavailable when an embedding could not be computed (a lost replica, a model runner
  /// without hidden states). A bad input's error names it with `input_name(i)` ("input i"
  /// when none is given, as /v1/embeddings and Embed number them; /v1/rerank's are the query
  /// and documents[j]).
  absl::StatusOr<EmbeddingBatch> Embed(
      const std::vector<loom::v1::GenerateRequest>& inputs,
      const std::function<bool()>& cancelled = nullptr,
      const std::function<std::string(size_t)>& input_name = nullptr);

 private:
  coordinator::Cluster& cluster_;
  const common::ModelConfig& config_;
  const common::Tokenizer& tokenizer_;
  const std::vector<int32_t> eos_ids_;
  coordinator::CoordinatorMetrics* metrics_;
  std::atomic<uint64_t> next_id_{1};
};

}  // namespace loom::api
