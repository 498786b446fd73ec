// Client behaviour that needs no cluster: option checks, and retries against a port where
// nothing listens (a real refused connection, which gRPC reports as UNAVAILABLE).
#include "client/client.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <thread>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace loom::client {
namespace {

// A loopback port that was free a moment ago (bound, then closed): connections are refused.
std::string RefusingAddress() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  EXPECT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  close(fd);
  return "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
}

TEST(ClientTest, MissingRootCertificatesFileIsNotFound) {
  ClientOptions options;
  options.tls.enabled = true;
  options.tls.root_certs_path = "/nonexistent/roots.pem";
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(options);
  EXPECT_EQ(client.status().code(), absl::StatusCode::kNotFound) << client.status();
}

TEST(ClientTest, ClientCertificateWithoutKeyIsInvalid) {
  ClientOptions options;
  options.tls.enabled = true;
  options.tls.cert_chain_path = "/etc/hostname";
  EXPECT_EQ(Client::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ClientTest, ZeroAttemptsIsInvalid) {
  ClientOptions options;
  options.retry.max_attempts = 0;
  EXPECT_EQ(Client::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ClientTest, UnavailableIsRetriedUpToMaxAttemptsWithBackoff) {
  ClientOptions options;
  options.address = RefusingAddress();
  options.retry.max_attempts = 3;
  options.retry.initial_backoff = absl::Milliseconds(100);
  options.retry.max_backoff = absl::Milliseconds(100);
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(options);
  ASSERT_TRUE(client.ok()) << client.status();
  const absl::Time start = absl::Now();
  std::unique_ptr<GenerateStream> stream =
      (*client)->StartGenerate(GenerateRequest::FromText("Hello", 4));
  absl::StatusOr<std::optional<GenerateChunk>> chunk = stream->Next();
  EXPECT_EQ(chunk.status().code(), absl::StatusCode::kUnavailable) << chunk.status();
  EXPECT_EQ(stream->attempts(), 3);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(200));  // two backoffs
  // The unary calls follow the same policy.
  EXPECT_EQ((*client)->ListModels().status().code(), absl::StatusCode::kUnavailable);
}

TEST(ClientTest, NoRetryStartsPastTheDeadline) {
  ClientOptions options;
  options.address = RefusingAddress();
  options.retry.max_attempts = 100;
  options.retry.initial_backoff = absl::Milliseconds(200);
  options.retry.max_backoff = absl::Milliseconds(200);
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(options);
  ASSERT_TRUE(client.ok()) << client.status();
  CallOptions call;
  call.timeout = absl::Milliseconds(700);
  const absl::Time start = absl::Now();
  absl::StatusOr<Completion> completion =
      (*client)->Generate(GenerateRequest::FromText("Hello", 4), call);
  EXPECT_FALSE(completion.ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
}

TEST(ClientTest, CancelDuringBackoffEndsTheStreamCancelled) {
  ClientOptions options;
  options.address = RefusingAddress();
  options.retry.max_attempts = 100;
  options.retry.initial_backoff = absl::Seconds(30);
  options.retry.max_backoff = absl::Seconds(30);
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(options);
  ASSERT_TRUE(client.ok()) << client.status();
  std::unique_ptr<GenerateStream> stream =
      (*client)->StartGenerate(GenerateRequest::FromText("Hello", 4));
  std::thread canceller([&] {
    absl::SleepFor(absl::Milliseconds(300));
    stream->Cancel();
  });
  const absl::Time start = absl::Now();
  absl::StatusOr<std::optional<GenerateChunk>> chunk = stream->Next();
  canceller.join();
  EXPECT_EQ(chunk.status().code(), absl::StatusCode::kCancelled) << chunk.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

}  // namespace
}  // namespace loom::client
