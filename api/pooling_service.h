#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "api/embedder.h"
#include "api/served_model.h"
#include "common/formats/model_config.h"
#include "common/tokenizer/tokenizer.h"
#include "coordinator/cluster.h"
#include "coordinator/metrics.h"
#include "httplib.h"
#include "loom/v1/inference.pb.h"

namespace loom::api {

/// The pooling endpoints: POST /v1/embeddings (api/embeddings_api: an input's last token's
/// final hidden state, L2-normalized), and /v1/score and /v1/rerank over them (api/score_api:
/// cosine similarities), computed by an Embedder; the answer comes once all are done. Errors
/// are OpenAI error bodies (OpenAiService::WriteError). Thread-safe.
class PoolingService {
 public:
  PoolingService(coordinator::Cluster& cluster, const ServedModel& model,
                 const common::ModelConfig& config, const common::Tokenizer& tokenizer,
                 coordinator::CoordinatorMetrics* metrics = nullptr);

  void Embeddings(const httplib::Request& request, httplib::Response& response);
  void Score(const httplib::Request& request, httplib::Response& response);
  void Rerank(const httplib::Request& request, httplib::Response& response);

 private:
  // NotFound unless `model` names the served model.
  absl::Status CheckModel(const std::string& model) const;

  const ServedModel& model_;
  const common::ModelConfig& config_;
  Embedder embedder_;
};

}  // namespace loom::api
