#include "worker/registration.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace loom::worker {
namespace {

// A scripted coordinator: Register fails `unavailable_registrations` times, then
// succeeds (or always refuses when `refuse`); the `forget_after`-th heartbeat answers
// NOT_FOUND once.
class FakeCoordinator final : public loom::v1::Coordinator::Service {
 public:
  grpc::Status Register(grpc::ServerContext*, const loom::v1::RegisterRequest* request,
                        loom::v1::RegisterResponse* response) override {
    absl::MutexLock lock(&mu);
    ++register_calls;
    last_request = *request;
    if (refuse) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "protocol version 1 != 2");
    }
    if (register_calls <= unavailable_registrations) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "starting");
    }
    ++registrations;
    if (register_delay_ms > 0) {  // the answer is slow to come, as on a loaded machine
      mu.Unlock();
      std::this_thread::sleep_for(std::chrono::milliseconds(register_delay_ms));
      mu.Lock();
    }
    response->set_worker_id("w" + std::to_string(registrations));
    response->set_heartbeat_interval_ms(20);
    return grpc::Status::OK;
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const loom::v1::HeartbeatRequest* request,
                         loom::v1::HeartbeatResponse*) override {
    absl::MutexLock lock(&mu);
    ++heartbeats;
    last_heartbeat = *request;
    if (heartbeats == forget_after) return grpc::Status(grpc::StatusCode::NOT_FOUND, "who?");
    return grpc::Status::OK;
  }

  grpc::Status Drain(grpc::ServerContext*, const loom::v1::DrainRequest* request,
                     loom::v1::DrainResponse* response) override {
    absl::MutexLock lock(&mu);
    drained_worker_ids.push_back(request->worker_id());
    response->set_num_requests_left(0);
    return grpc::Status::OK;
  }

  absl::Mutex mu;
  bool refuse = false;
  int register_delay_ms = 0;
  std::vector<std::string> drained_worker_ids;
  int unavailable_registrations = 0;
  int forget_after = -1;
  int register_calls = 0;
  int registrations = 0;
  int heartbeats = 0;
  loom::v1::RegisterRequest last_request;
  loom::v1::HeartbeatRequest last_heartbeat;
};

class RegistrationTest : public ::testing::Test {
 protected:
  void StartCoordinator() {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&coordinator_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    address_ = "127.0.0.1:" + std::to_string(port);
  }
  void TearDown() override {
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }
  RegistrationOptions Options() {
    RegistrationOptions options;
    options.coordinator_address = address_;
    options.request.set_replica_id("replica-3");
    options.request.set_num_kv_blocks(77);
    options.initial_backoff = absl::Milliseconds(10);
    options.max_backoff = absl::Milliseconds(40);
    return options;
  }
  // Waits up to 10 s for `done` (checked under the coordinator's lock).
  bool WaitFor(const std::function<bool()>& done) {
    for (int i = 0; i < 1000; ++i) {
      {
        absl::MutexLock lock(&coordinator_.mu);
        if (done()) return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

  FakeCoordinator coordinator_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

TEST_F(RegistrationTest, RetriesUntilRegisteredThenHeartbeatsAndReRegistersWhenForgotten) {
  coordinator_.unavailable_registrations = 3;
  coordinator_.forget_after = 3;
  StartCoordinator();
  WorkerRegistration registration(Options(), [](loom::v1::HeartbeatRequest& heartbeat) {
    heartbeat.set_num_sequences(5);
    heartbeat.mutable_progress()->set_units_done(42);
  });
  registration.Start();
  ASSERT_TRUE(
      WaitFor([&] { return coordinator_.registrations >= 2 && coordinator_.heartbeats >= 5; }));
  registration.Stop();
  absl::MutexLock lock(&coordinator_.mu);
  EXPECT_GE(coordinator_.register_calls, 5);
  EXPECT_EQ(coordinator_.last_request.protocol_version(),
            static_cast<uint32_t>(loom::v1::PROTOCOL_VERSION_CURRENT));
  EXPECT_EQ(coordinator_.last_request.replica_id(), "replica-3");
  EXPECT_EQ(coordinator_.last_heartbeat.worker_id(), "w2");
  EXPECT_EQ(coordinator_.last_heartbeat.num_sequences(), 5);
  EXPECT_EQ(coordinator_.last_heartbeat.progress().units_done(), 42u);
  EXPECT_EQ(coordinator_.last_heartbeat.num_kv_blocks(), 77);
  EXPECT_TRUE(registration.fatal_status().ok());
}

TEST_F(RegistrationTest, DrainWaitsForARegistrationInFlight) {
  // SIGTERM right after start-up: the coordinator has the Register call but its answer has
  // not reached the worker yet. The drain must still reach the coordinator under the id.
  coordinator_.register_delay_ms = 300;
  StartCoordinator();
  WorkerRegistration registration(Options(), nullptr);
  registration.Start();
  ASSERT_TRUE(WaitFor([&] { return coordinator_.register_calls >= 1; }));
  absl::StatusOr<int64_t> left = registration.Drain(absl::Seconds(2));
  ASSERT_TRUE(left.ok()) << left.status();
  EXPECT_EQ(*left, 0);
  registration.Stop();
  absl::MutexLock lock(&coordinator_.mu);
  EXPECT_EQ(coordinator_.drained_worker_ids, std::vector<std::string>{"w1"});
}

TEST_F(RegistrationTest, DrainWithoutACoordinatorIsFailedPreconditionAfterTheRpcTimeout) {
  address_ = "127.0.0.1:1";
  RegistrationOptions options = Options();
  options.rpc_timeout = absl::Milliseconds(200);
  WorkerRegistration registration(options, nullptr);
  registration.Start();
  absl::StatusOr<int64_t> left = registration.Drain(absl::Seconds(2));
  EXPECT_EQ(left.status().code(), absl::StatusCode::kFailedPrecondition) << left.status();
  registration.Stop();
}

TEST_F(RegistrationTest, RefusalIsFatal) {
  coordinator_.refuse = true;
  StartCoordinator();
  WorkerRegistration registration(Options(), nullptr);
  registration.Start();
  ASSERT_TRUE(WaitFor([&] { return coordinator_.register_calls >= 1; }));
  for (int i = 0; i < 500 && registration.fatal_status().ok(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(registration.fatal_status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(registration.fatal_status().message().find("protocol version"), std::string::npos);
  registration.Stop();
  absl::MutexLock lock(&coordinator_.mu);
  EXPECT_EQ(coordinator_.register_calls, 1);
}

TEST_F(RegistrationTest, KeepsRetryingWhileNoCoordinatorListensAndStopsPromptly) {
  address_ = "127.0.0.1:1";
  WorkerRegistration registration(Options(), nullptr);
  registration.Start();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_TRUE(registration.worker_id().empty());
  EXPECT_TRUE(registration.fatal_status().ok());
  const auto start = std::chrono::steady_clock::now();
  registration.Stop();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
}

}  // namespace
}  // namespace loom::worker
