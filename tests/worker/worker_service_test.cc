#include "worker/worker_service.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <thread>

#include "common/formats/model_config.h"
#include "worker/noop_backend.h"

namespace loom::worker {
namespace {

common::ModelConfig SmallConfig() {
  common::ModelConfig config;
  config.architecture = "llama";
  config.vocab_size = 1000;
  config.context_length = 256;
  config.num_layers = 1;
  config.num_heads = 1;
  config.num_kv_heads = 1;
  config.head_dim = 8;
  config.hidden_size = 8;
  return config;
}

loom::v1::StepPlan AddAndPrefill(uint64_t step_id, uint64_t seq_id, int32_t block) {
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
  entry->add_new_block_ids(block);
  return plan;
}

loom::v1::StepPlan Decode(uint64_t step_id, uint64_t seq_id) {
  loom::v1::StepPlan plan;
  plan.set_step_id(step_id);
  loom::v1::ScheduledSequence* entry = plan.add_scheduled();
  entry->set_seq_id(seq_id);
  entry->set_num_tokens(1);
  entry->set_sample(true);
  return plan;
}

class WorkerServiceTest : public ::testing::Test {
 protected:
  WorkerServiceTest()
      : backend_(SmallConfig(), 16, 4, {}), executor_(backend_), service_(executor_) {}

  void SetUp() override {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_NE(port, 0);
    stub_ = loom::v1::Worker::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                                          grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }

  NoopBackend backend_;
  StepExecutor executor_;
  WorkerService service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<loom::v1::Worker::Stub> stub_;
};

TEST_F(WorkerServiceTest, AnswersEveryPlanInOrderAndReportsBadPlansAsResults) {
  grpc::ClientContext context;
  auto stream = stub_->Step(&context);
  ASSERT_TRUE(stream->Write(AddAndPrefill(1, 7, 0)));
  ASSERT_TRUE(stream->Write(Decode(2, 7)));
  ASSERT_TRUE(stream->Write(Decode(2, 7)));   // stale step id
  ASSERT_TRUE(stream->Write(Decode(3, 99)));  // unknown sequence
  loom::v1::StepResult result;
  ASSERT_TRUE(stream->Read(&result));
  EXPECT_EQ(result.step_id(), 1u);
  EXPECT_EQ(result.error_code(), 0) << result.error_message();
  EXPECT_EQ(result.outputs(0).token_id(), backend_.TokenFor(7, 2));
  ASSERT_TRUE(stream->Read(&result));
  EXPECT_EQ(result.step_id(), 2u);
  EXPECT_EQ(result.outputs(0).token_id(), backend_.TokenFor(7, 3));
  ASSERT_TRUE(stream->Read(&result));
  EXPECT_EQ(result.step_id(), 2u);
  EXPECT_EQ(result.error_code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  ASSERT_TRUE(stream->Read(&result));
  EXPECT_EQ(result.step_id(), 3u);
  EXPECT_NE(result.error_code(), 0);
  EXPECT_EQ(service_.num_sequences(), 0);  // 7 was named by the stale plan: dropped
  ASSERT_TRUE(stream->WritesDone());
  EXPECT_TRUE(stream->Finish().ok());
}

TEST_F(WorkerServiceTest, NewStreamReplacesTheOldOneAndDropsItsSequences) {
  grpc::ClientContext first_context;
  auto first = stub_->Step(&first_context);
  ASSERT_TRUE(first->Write(AddAndPrefill(1, 7, 0)));
  loom::v1::StepResult result;
  ASSERT_TRUE(first->Read(&result));
  ASSERT_EQ(result.error_code(), 0);
  EXPECT_EQ(service_.num_sequences(), 1);

  grpc::ClientContext second_context;
  auto second = stub_->Step(&second_context);
  // The new stream's first plan may start over at step 1; sequence 7 is gone.
  ASSERT_TRUE(second->Write(Decode(1, 7)));
  ASSERT_TRUE(second->Read(&result));
  EXPECT_NE(result.error_code(), 0);
  EXPECT_NE(result.error_message().find("unknown"), std::string::npos) << result.error_message();

  // The old stream was cancelled by the server.
  first->Write(Decode(2, 7));
  EXPECT_FALSE(first->Read(&result));
  EXPECT_FALSE(first->Finish().ok());

  ASSERT_TRUE(second->Write(AddAndPrefill(2, 8, 1)));
  ASSERT_TRUE(second->Read(&result));
  EXPECT_EQ(result.error_code(), 0) << result.error_message();
  second->WritesDone();
  EXPECT_TRUE(second->Finish().ok());
}

TEST_F(WorkerServiceTest, ShutdownEndsTheStreamAndRefusesNewOnes) {
  grpc::ClientContext context;
  auto stream = stub_->Step(&context);
  ASSERT_TRUE(stream->Write(AddAndPrefill(1, 7, 0)));
  loom::v1::StepResult result;
  ASSERT_TRUE(stream->Read(&result));
  service_.BeginShutdown();
  EXPECT_FALSE(stream->Read(&result));
  EXPECT_FALSE(stream->Finish().ok());

  grpc::ClientContext late_context;
  auto late = stub_->Step(&late_context);
  late->WritesDone();
  EXPECT_FALSE(late->Read(&result));
  EXPECT_EQ(late->Finish().error_code(), grpc::StatusCode::UNAVAILABLE);
}

}  // namespace
}  // namespace loom::worker
