#include "client/client.h"

#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "client/backoff.h"
#include "client/endpoints.h"
#include "client/generate_call.h"
#include "client/wire.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace loom::client {
namespace {

absl::StatusOr<std::string> ReadPemFile(const std::string& path, const char* what) {
  std::ifstream file(path, std::ios::binary);
  if (!file)
    return absl::NotFoundError(absl::StrFormat("cannot read the %s file '%s'", what, path));
  std::ostringstream contents;
  contents << file.rdbuf();
  if (contents.str().empty()) {
    return absl::InvalidArgumentError(absl::StrFormat("the %s file '%s' is empty", what, path));
  }
  return contents.str();
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeCredentials(const TlsOptions& tls) {
  if (!tls.enabled) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  if (!tls.root_certs_path.empty()) {
    absl::StatusOr<std::string> roots = ReadPemFile(tls.root_certs_path, "root certificates");
    if (!roots.ok()) return roots.status();
    ssl.pem_root_certs = *std::move(roots);
  }
  if (tls.cert_chain_path.empty() != tls.private_key_path.empty()) {
    return absl::InvalidArgumentError(
        "TLS client authentication needs both a certificate chain and a private key");
  }
  if (!tls.cert_chain_path.empty()) {
    absl::StatusOr<std::string> chain = ReadPemFile(tls.cert_chain_path, "certificate chain");
    if (!chain.ok()) return chain.status();
    absl::StatusOr<std::string> key = ReadPemFile(tls.private_key_path, "private key");
    if (!key.ok()) return key.status();
    ssl.pem_cert_chain = *std::move(chain);
    ssl.pem_private_key = *std::move(key);
  }
  return grpc::SslCredentials(ssl);
}

}  // namespace

struct Client::Impl {
  std::shared_ptr<Endpoints> endpoints;
};

absl::StatusOr<std::unique_ptr<Client>> Client::Create(const ClientOptions& options) {
  if (options.address.empty()) return absl::InvalidArgumentError("the client needs an address");
  if (options.retry.max_attempts < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("retry.max_attempts must be >= 1, not %d", options.retry.max_attempts));
  }
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      MakeCredentials(options.tls);
  if (!credentials.ok()) return credentials.status();
  grpc::ChannelArguments args;
  if (!options.tls.server_name_override.empty()) {
    args.SetSslTargetNameOverride(options.tls.server_name_override);
  }
  if (options.keepalive_time > absl::ZeroDuration()) {
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS,
                static_cast<int>(absl::ToInt64Milliseconds(options.keepalive_time)));
  }
  // Retries are the client's own (RetryPolicy, before the first message only), so that
  // attempts are counted and bounded by the call's deadline; gRPC's would add more.
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  auto impl = std::make_unique<Impl>();
  impl->endpoints = std::make_shared<Endpoints>(options.address, *credentials, args);
  return std::unique_ptr<Client>(new Client(options, std::move(impl)));
}

Client::Client(const ClientOptions& options, std::unique_ptr<Impl> impl)
    : options_(options), impl_(std::move(impl)) {}

Client::~Client() = default;

namespace {

absl::Time DeadlineOf(const ClientOptions& options, const CallOptions& call) {
  const absl::Duration timeout =
      call.timeout != absl::InfiniteDuration() ? call.timeout : options.default_timeout;
  return timeout == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + timeout;
}

// One unary call with the retry policy: `invoke(context, stub)` makes the call on the
// endpoints' current coordinator.
template <typename Invoke>
absl::Status CallWithRetry(const ClientOptions& options, Endpoints& endpoints,
                           const CallOptions& call, const Invoke& invoke) {
  const absl::Time deadline = DeadlineOf(options, call);
  for (int attempt = 1;; ++attempt) {
    grpc::ClientContext context;
    if (deadline != absl::InfiniteFuture()) context.set_deadline(absl::ToChronoTime(deadline));
    if (!options.api_key.empty()) context.AddMetadata("authorization", "Bearer " + options.api_key);
    const grpc::Status answer = invoke(&context, *endpoints.Stub());
    absl::Status status = FromGrpcStatus(answer);
    if (status.ok() || !IsRetryable(status) || attempt >= options.retry.max_attempts) {
      return status;
    }
    const absl::Duration backoff = BackoffBefore(options.retry, attempt);
    if (absl::Now() + backoff >= deadline) return status;
    endpoints.Turn(context, answer);
    absl::SleepFor(backoff);
  }
}

}  // namespace

std::unique_ptr<GenerateStream> Client::StartGenerate(const GenerateRequest& request,
                                                      const CallOptions& call) {
  return StartGenerateCall(impl_->endpoints, ToWire(request), DeadlineOf(options_, call),
                           options_.retry, options_.api_key);
}

absl::StatusOr<Completion> Client::Generate(
    const GenerateRequest& request, const std::function<bool(const GenerateChunk&)>& on_chunk,
    const CallOptions& call) {
  std::unique_ptr<GenerateStream> stream = StartGenerate(request, call);
  Completion completion;
  while (true) {
    absl::StatusOr<std::optional<GenerateChunk>> chunk = stream->Next();
    if (!chunk.ok()) return chunk.status();
    if (!chunk->has_value()) break;
    completion.Append(**chunk);
    if (on_chunk && !on_chunk(**chunk)) {
      stream->Cancel();
      return absl::CancelledError("the chunk callback cancelled the call");
    }
  }
  completion.attempts = stream->attempts();
  return completion;
}

absl::StatusOr<Completion> Client::Generate(const GenerateRequest& request,
                                            const CallOptions& call) {
  return Generate(request, nullptr, call);
}

absl::StatusOr<Completion> Client::Chat(const std::vector<ChatMessage>& messages,
                                        const std::vector<Tool>& tools,
                                        const ToolChoice& tool_choice,
                                        const GenerateRequest& options, const CallOptions& call) {
  GenerateRequest request = options;
  request.text.clear();
  request.token_ids.clear();
  request.use_token_ids = false;
  request.messages = messages;
  request.tools = tools;
  request.tool_choice = tool_choice;
  return Generate(request, nullptr, call);
}

absl::StatusOr<std::vector<int32_t>> Client::Tokenize(const std::string& text,
                                                      bool add_special_tokens, bool parse_special,
                                                      const CallOptions& call) {
  loom::v1::TokenizeRequest request;
  request.set_text(text);
  request.set_add_special_tokens(add_special_tokens);
  request.set_parse_special(parse_special);
  loom::v1::TokenizeResponse response;
  absl::Status status =
      CallWithRetry(options_, *impl_->endpoints, call,
                    [&](grpc::ClientContext* context, loom::v1::Inference::Stub& stub) {
                      return stub.Tokenize(context, request, &response);
                    });
  if (!status.ok()) return status;
  return std::vector<int32_t>(response.token_ids().begin(), response.token_ids().end());
}

absl::StatusOr<Embeddings> Client::Embed(const std::vector<EmbedInput>& inputs,
                                         const CallOptions& call) {
  loom::v1::EmbedRequest request;
  for (const EmbedInput& input : inputs) {
    loom::v1::EmbedInput* one = request.add_inputs();
    if (!input.token_ids.empty()) {
      one->mutable_token_ids()->mutable_ids()->Add(input.token_ids.begin(), input.token_ids.end());
    } else {
      one->set_text(input.text);
    }
  }
  loom::v1::EmbedResponse response;
  absl::Status status =
      CallWithRetry(options_, *impl_->endpoints, call,
                    [&](grpc::ClientContext* context, loom::v1::Inference::Stub& stub) {
                      return stub.Embed(context, request, &response);
                    });
  if (!status.ok()) return status;
  Embeddings out;
  out.prompt_tokens = response.prompt_tokens();
  for (const loom::v1::Embedding& embedding : response.embeddings()) {
    out.vectors.emplace_back(embedding.values().begin(), embedding.values().end());
    out.input_tokens.push_back(embedding.prompt_tokens());
  }
  return out;
}

absl::StatusOr<std::string> Client::Detokenize(const std::vector<int32_t>& token_ids,
                                               bool skip_special_tokens, const CallOptions& call) {
  loom::v1::DetokenizeRequest request;
  request.mutable_token_ids()->Add(token_ids.begin(), token_ids.end());
  request.set_skip_special_tokens(skip_special_tokens);
  loom::v1::DetokenizeResponse response;
  absl::Status status =
      CallWithRetry(options_, *impl_->endpoints, call,
                    [&](grpc::ClientContext* context, loom::v1::Inference::Stub& stub) {
                      return stub.Detokenize(context, request, &response);
                    });
  if (!status.ok()) return status;
  return response.text();
}

absl::StatusOr<std::vector<ModelDescription>> Client::ListModels(const CallOptions& call) {
  loom::v1::ListModelsResponse response;
  absl::Status status =
      CallWithRetry(options_, *impl_->endpoints, call,
                    [&](grpc::ClientContext* context, loom::v1::Inference::Stub& stub) {
                      return stub.ListModels(context, loom::v1::ListModelsRequest(), &response);
                    });
  if (!status.ok()) return status;
  std::vector<ModelDescription> models;
  for (const loom::v1::ServedModel& model : response.models()) models.push_back(FromWire(model));
  return models;
}

absl::StatusOr<ClusterState> Client::GetClusterState(const CallOptions& call) {
  loom::v1::ClusterState response;
  absl::Status status = CallWithRetry(
      options_, *impl_->endpoints, call,
      [&](grpc::ClientContext* context, loom::v1::Inference::Stub& stub) {
        return stub.GetClusterState(context, loom::v1::GetClusterStateRequest(), &response);
      });
  if (!status.ok()) return status;
  return FromWire(response);
}

}  // namespace loom::client
