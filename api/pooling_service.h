#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "api/embedder.h"
#include "api/http_message.h"
#include "api/served_model.h"
#include "common/formats/model_config.h"
#include "common/tokenizer/tokenizer.h"
#include "coordinator/cluster.h"
#include "coordinator/metrics.h"
#include "loom/v1/inference.pb.h"

namespace loom::api {

/// The pooling endpoints: POST /v1/embeddings (api/embeddings_api: an input's last token's
/// final hidden state, L2-normalized), and /v1/score and /v1/rerank over them (api/score_api:
/// cosine similarities), computed by an Embedder; the answer comes once all are done (the
/// calling thread waits; `cancelled` answering true, the client gone, stops the wait and
/// the embeddings). Errors are OpenAI error bodies (OpenAiService::WriteError).
/// Thread-safe.
class PoolingService {
 public:
  PoolingService(coordinator::Cluster& cluster, const ServedModel& model,
                 const common::ModelConfig& config, const common::Tokenizer& tokenizer,
                 coordinator::CoordinatorMetrics* metrics = nullptr);

  void Embeddings(const HttpRequest& request, HttpResponse& response,
                  const std::function<bool()>& cancelled);
  void Score(const HttpRequest& request, HttpResponse& response,
             const std::function<bool()>& cancelled);
  void Rerank(const HttpRequest& request, HttpResponse& response,
              const std::function<bool()>& cancelled);

 private:
  // NotFound unless `model` names the served model.
  absl::Status CheckModel(const std::string& model) const;

  const ServedModel& model_;
  const common::ModelConfig& config_;
  Embedder embedder_;
};

}  // namespace loom::api
