#include "common/cluster_secret.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "common/grpc_status.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "loom/v1/worker.grpc.pb.h"

namespace loom::common {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Every test installs what it needs and leaves none installed.
class ClusterSecretTest : public ::testing::Test {
 protected:
  void TearDown() override { SetClusterSecret(""); }

  std::string WriteFile(const std::string& name, const std::string& text) {
    const std::string path =
        ::testing::TempDir() + "/cluster_secret_test." + std::to_string(getpid()) + "." + name;
    std::ofstream(path) << text;
    return path;
  }
};

// A service whose one method answers what CheckClusterSecret says of the call.
class CheckingService final : public loom::v1::Coordinator::Service {
 public:
  grpc::Status StoreSet(grpc::ServerContext* context, const loom::v1::StoreSetRequest*,
                        loom::v1::StoreSetResponse*) override {
    return ToGrpcStatus(CheckClusterSecret(*context));
  }
};

struct Server {
  Server() {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
  }
  ~Server() { server->Shutdown(); }
  std::string address() const { return "127.0.0.1:" + std::to_string(port); }

  CheckingService service;
  int port = 0;
  std::unique_ptr<grpc::Server> server;
};

grpc::Status Call(const std::shared_ptr<grpc::Channel>& channel) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  loom::v1::StoreSetResponse response;
  return loom::v1::Coordinator::NewStub(channel)->StoreSet(&context, {}, &response);
}

// Whether a call presenting `secret` by hand passes `server`'s check.
bool Passes(const Server& server, const std::string& secret) {
  grpc::ClientContext context;
  context.AddMetadata(kClusterSecretMetadataKey, secret);
  loom::v1::StoreSetResponse response;
  return loom::v1::Coordinator::NewStub(
             grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()))
      ->StoreSet(&context, {}, &response)
      .ok();
}

TEST_F(ClusterSecretTest, LoadsTheFilesFirstLineElseTheEnvironment) {
  Server server;
  ASSERT_TRUE(LoadClusterSecret(WriteFile("secret", "\n  s3cret \t\nsecond\n"), "env").ok());
  EXPECT_TRUE(ClusterSecretEnabled());
  EXPECT_TRUE(Passes(server, "s3cret"));  // the first non-blank line, trimmed; not the env
  EXPECT_FALSE(Passes(server, "env"));
  EXPECT_FALSE(Passes(server, "second"));
  ASSERT_TRUE(LoadClusterSecret("", " from-env\n").ok());
  EXPECT_TRUE(Passes(server, "from-env"));
  EXPECT_FALSE(Passes(server, "s3cret"));
  ASSERT_TRUE(LoadClusterSecret("", "").ok());
  EXPECT_FALSE(ClusterSecretEnabled());
  ASSERT_TRUE(LoadClusterSecret("", nullptr).ok());
  EXPECT_FALSE(ClusterSecretEnabled());
}

TEST_F(ClusterSecretTest, BadFilesAreRefusedWithoutTheirContent) {
  const absl::Status missing = LoadClusterSecret(::testing::TempDir() + "/absent", "env");
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.message(), HasSubstr("absent"));
  const absl::Status blank = LoadClusterSecret(WriteFile("blank", "\n \n\t\n"), "env");
  EXPECT_EQ(blank.code(), absl::StatusCode::kInvalidArgument);
  // gRPC metadata is printable ASCII: another byte would fail every call at run time.
  const absl::Status binary = LoadClusterSecret(WriteFile("binary",
                                                          "s\xc3\xa9"
                                                          "cret\n"),
                                                "env");
  EXPECT_EQ(binary.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(binary.message(), Not(HasSubstr("\xc3\xa9")));
  EXPECT_EQ(LoadClusterSecret("", "a\x01b").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(ClusterSecretEnabled());
}

TEST_F(ClusterSecretTest, NewSecretsAreLongRandomAndDistinct) {
  const std::string a = NewClusterSecret();
  const std::string b = NewClusterSecret();
  EXPECT_EQ(a.size(), 64u);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_NE(a, b);
}

TEST_F(ClusterSecretTest, WithoutASecretEveryCallPasses) {
  Server server;
  EXPECT_TRUE(Call(CreateClusterChannel(server.address())).ok());
  EXPECT_TRUE(Call(grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials())).ok());
}

TEST_F(ClusterSecretTest, OnlyCallsPresentingTheSecretPass) {
  SetClusterSecret("the-secret");
  Server server;
  EXPECT_TRUE(Call(CreateClusterChannel(server.address())).ok());

  const grpc::Status plain =
      Call(grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
  EXPECT_EQ(plain.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(plain.error_message(), HasSubstr("cluster secret"));

  // A channel made with another secret (installed when it was created) is refused, and
  // the refusal does not echo what it presented.
  SetClusterSecret("another-secret");
  std::shared_ptr<grpc::Channel> other = CreateClusterChannel(server.address());
  SetClusterSecret("the-secret");
  const grpc::Status wrong = Call(other);
  EXPECT_EQ(wrong.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(wrong.error_message(), Not(HasSubstr("another-secret")));

  // So is one presenting an empty value under the key.
  grpc::ClientContext context;
  context.AddMetadata(kClusterSecretMetadataKey, "");
  loom::v1::StoreSetResponse response;
  const grpc::Status empty =
      loom::v1::Coordinator::NewStub(
          grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()))
          ->StoreSet(&context, {}, &response);
  EXPECT_EQ(empty.error_code(), grpc::StatusCode::UNAUTHENTICATED);
}

}  // namespace
}  // namespace loom::common
