#include "common/cluster_secret.h"

#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <openssl/sha.h>

#include <array>
#include <fstream>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/client_interceptor.h"

namespace loom::common {
namespace {

using Digest = std::array<unsigned char, SHA256_DIGEST_LENGTH>;

Digest Hash(absl::string_view text) {
  Digest digest;
  SHA256(reinterpret_cast<const unsigned char*>(text.data()), text.size(), digest.data());
  return digest;
}

// The installed secret and its digest. Written at start-up only (SetClusterSecret's
// contract), read by every call afterwards.
struct Installed {
  std::string secret;
  Digest digest{};
};
std::optional<Installed>& Secret() {
  static auto* secret = new std::optional<Installed>();
  return *secret;
}

// Adds the secret to every call's initial metadata.
class PresentSecret final : public grpc::experimental::Interceptor {
 public:
  explicit PresentSecret(std::string secret) : secret_(std::move(secret)) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace(kClusterSecretMetadataKey, secret_);
    }
    methods->Proceed();
  }

 private:
  const std::string secret_;
};

class PresentSecretFactory final : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit PresentSecretFactory(std::string secret) : secret_(std::move(secret)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new PresentSecret(secret_);
  }

 private:
  const std::string secret_;
};

// gRPC metadata values are printable ASCII: a secret with other bytes would fail every call.
absl::Status CheckPrintable(absl::string_view secret, absl::string_view source) {
  for (char c : secret) {
    if (c < 0x20 || c > 0x7e) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "the cluster secret from %s must be printable ASCII (it travels as gRPC metadata)",
          std::string(source)));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status LoadClusterSecret(const std::string& file, const char* environment) {
  if (file.empty()) {
    const absl::string_view secret =
        environment != nullptr ? absl::StripAsciiWhitespace(environment) : "";
    if (absl::Status printable = CheckPrintable(secret, kClusterSecretEnvironment);
        !printable.ok()) {
      return printable;
    }
    SetClusterSecret(secret);
    return absl::OkStatus();
  }
  std::ifstream in(file);
  if (!in) {
    return absl::NotFoundError(
        absl::StrFormat("the cluster secret file '%s' cannot be read", file));
  }
  std::string line;
  while (std::getline(in, line)) {
    const absl::string_view secret = absl::StripAsciiWhitespace(line);
    if (!secret.empty()) {
      LOOM_RETURN_IF_ERROR(CheckPrintable(secret, absl::StrFormat("'%s'", file)));
      SetClusterSecret(secret);
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("the cluster secret file '%s' holds no secret (only blank lines)", file));
}

void SetClusterSecret(absl::string_view secret) {
  if (secret.empty()) {
    Secret().reset();
  } else {
    Secret() = Installed{std::string(secret), Hash(secret)};
  }
}

bool ClusterSecretEnabled() { return Secret().has_value(); }

std::string NewClusterSecret() {
  std::array<unsigned char, 32> bytes;
  if (RAND_bytes(bytes.data(), bytes.size()) != 1) {
    // OpenSSL's generator failed to seed: nothing safe to make; the caller runs without.
    return "";
  }
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

std::shared_ptr<grpc::Channel> CreateClusterChannel(const std::string& address,
                                                    const grpc::ChannelArguments& arguments) {
  if (!ClusterSecretEnabled()) {
    return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), arguments);
  }
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> present;
  present.push_back(std::make_unique<PresentSecretFactory>(Secret()->secret));
  return grpc::experimental::CreateCustomChannelWithInterceptors(
      address, grpc::InsecureChannelCredentials(), arguments, std::move(present));
}

absl::Status CheckClusterSecret(const grpc::ServerContextBase& context) {
  if (!ClusterSecretEnabled()) return absl::OkStatus();
  const auto& metadata = context.client_metadata();
  const auto presented = metadata.find(kClusterSecretMetadataKey);
  const Digest digest =
      Hash(presented == metadata.end()
               ? absl::string_view()
               : absl::string_view(presented->second.data(), presented->second.size()));
  if (presented != metadata.end() &&
      CRYPTO_memcmp(digest.data(), Secret()->digest.data(), digest.size()) == 0) {
    return absl::OkStatus();
  }
  return absl::UnauthenticatedError(
      "this internal service needs the cluster secret (--cluster-secret-file or "
      "LOOM_CLUSTER_SECRET, the same on the coordinator and every worker)");
}

}  // namespace loom::common
