#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/client_options.h"
#include "client/cluster_info.h"
#include "client/completion.h"
#include "client/embeddings.h"
#include "client/generate_request.h"
#include "client/generate_stream.h"

namespace loom::client {

/// A connection to a Loom coordinator's loom.v1.Inference service. Every method is
/// thread-safe; calls share one HTTP/2 channel. Errors are the server's gRPC status as an
/// absl::Status (same code and message). UNAVAILABLE before any output is retried with
/// the options' RetryPolicy; streams may outlive the Client.
///
///   loom::client::ClientOptions options;
///   options.address = "127.0.0.1:50051";
///   auto client = loom::client::Client::Create(options);
///   auto completion = (*client)->Generate(GenerateRequest::FromText("Hello", 32));
class Client {
 public:
  /// NotFound/InvalidArgument for unreadable TLS files; connecting happens lazily, so an
  /// unreachable address shows up as UNAVAILABLE on the first call.
  static absl::StatusOr<std::unique_ptr<Client>> Create(const ClientOptions& options);
  ~Client();

  /// Generates one completion and returns it whole.
  absl::StatusOr<Completion> Generate(const GenerateRequest& request, const CallOptions& call = {});

  /// Generates one completion, calling `on_chunk` for every chunk as it arrives (on this
  /// thread); `on_chunk` returning false cancels the call (CANCELLED is returned). The
  /// completion joins every chunk.
  absl::StatusOr<Completion> Generate(const GenerateRequest& request,
                                      const std::function<bool(const GenerateChunk&)>& on_chunk,
                                      const CallOptions& call = {});

  /// A chat: `messages` rendered by the served model's chat template, with `tools` the
  /// model may call and `tool_choice` (see ToolChoice); `options` gives the rest of the
  /// request (max_tokens, sampling, ...; its prompt and chat fields are replaced). The
  /// completion's `tool_calls` are the calls the model made, `content` the other text.
  /// INVALID_ARGUMENT for a tool schema the grammar engine cannot enforce (naming the
  /// construct), FAILED_PRECONDITION when the model has no chat template.
  absl::StatusOr<Completion> Chat(const std::vector<ChatMessage>& messages,
                                  const std::vector<Tool>& tools = {},
                                  const ToolChoice& tool_choice = {},
                                  const GenerateRequest& options = {},
                                  const CallOptions& call = {});

  /// Starts a streaming call; read it with GenerateStream::Next().
  std::unique_ptr<GenerateStream> StartGenerate(const GenerateRequest& request,
                                                const CallOptions& call = {});

  /// Token ids of `text` with the served model's tokenizer.
  absl::StatusOr<std::vector<int32_t>> Tokenize(const std::string& text,
                                                bool add_special_tokens = true,
                                                bool parse_special = true,
                                                const CallOptions& call = {});

  /// Embeddings of `inputs` (at least one; INVALID_ARGUMENT names a bad input, and none
  /// of them runs then).
  absl::StatusOr<Embeddings> Embed(const std::vector<EmbedInput>& inputs,
                                   const CallOptions& call = {});

  /// Text of `token_ids` (INVALID_ARGUMENT for an id outside the vocabulary).
  absl::StatusOr<std::string> Detokenize(const std::vector<int32_t>& token_ids,
                                         bool skip_special_tokens = false,
                                         const CallOptions& call = {});

  /// The models the cluster serves.
  absl::StatusOr<std::vector<ModelDescription>> ListModels(const CallOptions& call = {});

  /// Replicas, KV blocks, queue depth.
  absl::StatusOr<ClusterState> GetClusterState(const CallOptions& call = {});

  const ClientOptions& options() const { return options_; }

 private:
  struct Impl;
  Client(const ClientOptions& options, std::unique_ptr<Impl> impl);

  const ClientOptions options_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace loom::client
