#include "coordinator/replica_connection.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "worker/noop_backend.h"
#include "worker/step_executor.h"
#include "worker/worker_service.h"

namespace loom::coordinator {
namespace {

using ::testing::HasSubstr;

common::ModelConfig SmallConfig(int64_t vocab) {
  common::ModelConfig config;
  config.architecture = "llama";
  config.vocab_size = vocab;
  config.context_length = 256;
  config.num_layers = 1;
  config.num_heads = 1;
  config.num_kv_heads = 1;
  config.head_dim = 8;
  config.hidden_size = 8;
  return config;
}

// One in-process worker rank (the no-op backend) on a free port.
struct RankServer {
  explicit RankServer(int64_t vocab)
      : backend(SmallConfig(vocab), 16, 4, {}), executor(backend), service(executor) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
  }
  ~RankServer() { Stop(); }
  void Stop() {
    if (server == nullptr) return;
    service.BeginShutdown();
    server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
    server.reset();
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port); }

  worker::NoopBackend backend;
  worker::StepExecutor executor;
  worker::WorkerService service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};

// A rank whose answers are scripted: each plan's step id, no outputs, and `push_error` as
// its KV push error (a push of its KV heads that failed while its forward pass succeeded).
class ScriptedRank final : public loom::v1::Worker::Service {
 public:
  explicit ScriptedRank(std::string push_error) : push_error_(std::move(push_error)) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
  }
  ~ScriptedRank() override {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
  }
  grpc::Status Step(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<loom::v1::StepResult, loom::v1::StepPlan>* stream) override {
    loom::v1::StepPlan plan;
    while (stream->Read(&plan)) {
      loom::v1::StepResult result;
      result.set_step_id(plan.step_id());
      result.set_kv_push_error(push_error_);
      if (!stream->Write(result)) break;
    }
    return grpc::Status::OK;
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  std::string push_error_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

loom::v1::StepPlan AddAndPrefill(uint64_t step_id, uint64_t seq_id) {
  loom::v1::StepPlan plan;
  plan.set_step_id(step_id);
  loom::v1::NewSequence* added = plan.add_added();
  added->set_seq_id(seq_id);
  added->add_prompt_token_ids(5);
  added->add_prompt_token_ids(6);
  added->mutable_sampling()->set_temperature(0.0f);
  loom::v1::ScheduledSequence* entry = plan.add_scheduled();
  entry->set_seq_id(seq_id);
  entry->set_num_tokens(2);
  entry->set_sample(true);
  entry->add_new_block_ids(static_cast<int32_t>(seq_id % 4));
  return plan;
}

// Collects the connection's events.
class Events {
 public:
  void Add(ReplicaConnection::Event event) {
    absl::MutexLock lock(&mu_);
    events_.push_back(std::move(event));
  }
  std::vector<ReplicaConnection::Event> WaitFor(size_t count) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return events_.size() >= count; };
    mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10));
    return events_;
  }

 private:
  absl::Mutex mu_;
  std::vector<ReplicaConnection::Event> events_ ABSL_GUARDED_BY(mu_);
};

TEST(ReplicaConnectionTest, AStepCompletesWhenEveryRankAnsweredAndUsesRankZero) {
  std::vector<std::unique_ptr<RankServer>> ranks;
  std::vector<std::string> addresses;
  for (int r = 0; r < 3; ++r) {
    ranks.push_back(std::make_unique<RankServer>(1000));
    addresses.push_back(ranks.back()->address());
  }
  Events events;
  auto connection = ReplicaConnection::Connect(addresses, absl::Seconds(5),
                                               [&](ReplicaConnection::Event e) { events.Add(std::move(e)); });
  ASSERT_TRUE(connection.ok()) << connection.status();
  EXPECT_EQ((*connection)->world_size(), 3);
  ASSERT_TRUE((*connection)->Write(AddAndPrefill(1, 1)));
  ASSERT_TRUE((*connection)->Write(AddAndPrefill(2, 2)));
  std::vector<ReplicaConnection::Event> got = events.WaitFor(2);
  ASSERT_EQ(got.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(got[i].result.has_value()) << got[i].failure;
    EXPECT_EQ(got[i].result->step_id(), static_cast<uint64_t>(i + 1));
    ASSERT_EQ(got[i].result->outputs_size(), 1);
    EXPECT_EQ(got[i].result->outputs(0).token_id(), ranks[0]->backend.TokenFor(i + 1, 2));
  }
  // Every rank executed both steps.
  for (const auto& rank : ranks) EXPECT_EQ(rank->service.num_steps(), 2);

  // A rank that goes away fails the replica.
  ranks[1]->Stop();
  got = events.WaitFor(3);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_FALSE(got[2].result.has_value());
  EXPECT_THAT(got[2].failure, HasSubstr("rank 1"));
  EXPECT_FALSE((*connection)->Write(AddAndPrefill(3, 3)));
}

TEST(ReplicaConnectionTest, RanksThatSampleDifferentTokensFailTheReplica) {
  // Rank 1's vocabulary differs, so its no-op tokens do.
  RankServer rank0(1000), rank1(999);
  Events events;
  auto connection = ReplicaConnection::Connect({rank0.address(), rank1.address()},
                                               absl::Seconds(5),
                                               [&](ReplicaConnection::Event e) { events.Add(std::move(e)); });
  ASSERT_TRUE(connection.ok()) << connection.status();
  // (40 * 31 + 2) is 242 mod 1000 but 243 mod 999.
  ASSERT_TRUE((*connection)->Write(AddAndPrefill(1, 40)));
  std::vector<ReplicaConnection::Event> got = events.WaitFor(1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_FALSE(got[0].result.has_value());
  EXPECT_THAT(got[0].failure, HasSubstr("disagree"));
}

// Each rank pushes only its own KV heads: a push that failed on any rank fails the step's
// push (the coordinator then pulls instead), not only one on the rank whose result is used.
TEST(ReplicaConnectionTest, AKvPushErrorOfAnyRankReachesTheStepsResult) {
  ScriptedRank rank0(""), rank1("cannot map the decode worker's tier");
  Events events;
  auto connection =
      ReplicaConnection::Connect({rank0.address(), rank1.address()}, absl::Seconds(5),
                                 [&](ReplicaConnection::Event e) { events.Add(std::move(e)); });
  ASSERT_TRUE(connection.ok()) << connection.status();
  loom::v1::StepPlan plan;
  plan.set_step_id(1);
  ASSERT_TRUE((*connection)->Write(plan));
  std::vector<ReplicaConnection::Event> got = events.WaitFor(1);
  ASSERT_EQ(got.size(), 1u);
  ASSERT_TRUE(got[0].result.has_value()) << got[0].failure;
  EXPECT_EQ(got[0].result->kv_push_error(), "rank 1: cannot map the decode worker's tier");
}

TEST(ReplicaConnectionTest, AnUnreachableRankIsUnavailable) {
  RankServer rank0(1000);
  auto connection = ReplicaConnection::Connect({rank0.address(), "127.0.0.1:1"},
                                               absl::Milliseconds(300), [](ReplicaConnection::Event) {});
  EXPECT_EQ(connection.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(connection.status().message(), HasSubstr("rank 1"));
}

}  // namespace
}  // namespace loom::coordinator
