#include "worker/pipeline_link.h"

#include <chrono>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "gloo/rendezvous/hash_store.h"
#include "gtest/gtest.h"

namespace loom::worker {
namespace {

using std::chrono::milliseconds;

// Runs `body(stage, link)` on `stages` threads joined through one in-process store (the
// coordinator's gRPC store plays this part between processes).
void RunStages(int stages, milliseconds timeout,
               const std::function<void(int, PipelineLink&)>& body) {
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  std::vector<std::thread> threads;
  for (int stage = 0; stage < stages; ++stage) {
    threads.emplace_back([&, stage] {
      PipelineLinkOptions options;
      options.timeout = timeout;
      auto link = PipelineLink::Connect(store, stage, stages, options);
      ASSERT_TRUE(link.ok()) << link.status();
      body(stage, **link);
    });
  }
  for (std::thread& thread : threads) thread.join();
}

std::vector<float> Ramp(size_t n, float start) {
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = start + 0.25f * static_cast<float>(i);
  return out;
}

TEST(PipelineLinkTest, StepsPassThroughEveryStageInOrderWithTheirSizes) {
  // Three stages; each step has its own size, and each stage adds 1 to what it got.
  const std::vector<size_t> sizes = {6, 1, 4000, 96};
  RunStages(3, milliseconds(20000), [&](int stage, PipelineLink& link) {
    EXPECT_EQ(link.has_previous(), stage > 0);
    EXPECT_EQ(link.has_next(), stage < 2);
    for (size_t s = 0; s < sizes.size(); ++s) {
      const uint64_t step = 10 + s;
      std::vector<float> residual = Ramp(sizes[s], static_cast<float>(s));
      std::vector<float> proj = Ramp(sizes[s], -static_cast<float>(s));
      if (stage > 0) {
        std::vector<float> got_residual(sizes[s]), got_proj(sizes[s]);
        ASSERT_TRUE(
            link.Receive(step, absl::MakeSpan(got_residual), absl::MakeSpan(got_proj)).ok());
        for (size_t i = 0; i < sizes[s]; ++i) {
          ASSERT_EQ(got_residual[i], residual[i] + static_cast<float>(stage - 1)) << i;
          ASSERT_EQ(got_proj[i], proj[i] + static_cast<float>(stage - 1)) << i;
        }
      }
      if (stage < 2) {
        for (float& v : residual) v += static_cast<float>(stage);
        for (float& v : proj) v += static_cast<float>(stage);
        // The link copies: changing the arrays after Send changes nothing downstream.
        ASSERT_TRUE(link.Send(step, residual, proj).ok());
        std::fill(residual.begin(), residual.end(), -1.0f);
      }
    }
  });
}

TEST(PipelineLinkTest, AFailureTravelsDownstreamAndTheStagesStayAligned) {
  RunStages(3, milliseconds(20000), [&](int stage, PipelineLink& link) {
    std::vector<float> residual(8, 1.0f), proj(8, 2.0f);
    // Step 1 fails on stage 0 before its layers: the later stages see stage 0's reason.
    if (stage == 0) {
      ASSERT_TRUE(link.SendFailure(1, absl::InvalidArgumentError("bad plan")).ok());
    } else {
      absl::Status status = link.Receive(1, absl::MakeSpan(residual), absl::MakeSpan(proj));
      EXPECT_EQ(status.code(), absl::StatusCode::kAborted);
      EXPECT_NE(status.message().find("bad plan"), std::string::npos) << status;
      if (stage == 1) {
        ASSERT_TRUE(link.SendFailure(1, status).ok());
      }
    }
    // Step 2 fails on stage 1 before it received: it drops stage 0's activations.
    if (stage == 0) {
      ASSERT_TRUE(link.Send(2, residual, proj).ok());
    }
    if (stage == 1) {
      ASSERT_TRUE(link.Discard(2).ok());
      ASSERT_TRUE(link.SendFailure(2, absl::InternalError("stage 1 broke")).ok());
    }
    if (stage == 2) {
      absl::Status status = link.Receive(2, absl::MakeSpan(residual), absl::MakeSpan(proj));
      EXPECT_NE(status.message().find("stage 1 broke"), std::string::npos) << status;
    }
    // Step 3 runs normally: nothing of the failed steps is left on the links.
    std::vector<float> values(8, static_cast<float>(stage));
    if (stage > 0) {
      ASSERT_TRUE(link.Receive(3, absl::MakeSpan(values), absl::MakeSpan(proj)).ok());
      EXPECT_EQ(values[0], static_cast<float>(stage - 1));
      values.assign(8, static_cast<float>(stage));
    }
    if (stage < 2) {
      ASSERT_TRUE(link.Send(3, values, proj).ok());
    }
  });
}

TEST(PipelineLinkTest, AMessageOfAnotherStepOrSizeIsAnErrorNotAMisreadStep) {
  RunStages(2, milliseconds(20000), [&](int stage, PipelineLink& link) {
    std::vector<float> four(4, 1.0f), five(5, 1.0f);
    if (stage == 0) {
      ASSERT_TRUE(link.Send(7, four, four).ok());
      ASSERT_TRUE(link.Send(8, four, four).ok());
      return;
    }
    // Sizes differ: taken off the link anyway, then reported.
    absl::Status size = link.Receive(7, absl::MakeSpan(five), absl::MakeSpan(five));
    EXPECT_EQ(size.code(), absl::StatusCode::kInternal) << size;
    // The next message is step 8's; expecting step 9 breaks the link.
    absl::Status step = link.Receive(9, absl::MakeSpan(four), absl::MakeSpan(four));
    EXPECT_EQ(step.code(), absl::StatusCode::kInternal) << step;
    EXPECT_NE(step.message().find("step 8"), std::string::npos) << step;
  });
}

TEST(PipelineLinkTest, ADeadPredecessorFailsTheReceiveInsteadOfHanging) {
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  PipelineLinkOptions options;
  options.timeout = milliseconds(3000);
  std::unique_ptr<PipelineLink> first;
  std::thread connect([&] {
    auto link = PipelineLink::Connect(store, 0, 2, options);
    ASSERT_TRUE(link.ok()) << link.status();
    first = *std::move(link);
  });
  auto second = PipelineLink::Connect(store, 1, 2, options);
  connect.join();
  ASSERT_TRUE(second.ok()) << second.status();
  first.reset();  // the first stage goes away without sending
  std::vector<float> residual(4), proj(4);
  const auto start = std::chrono::steady_clock::now();
  absl::Status status = (*second)->Receive(1, absl::MakeSpan(residual), absl::MakeSpan(proj));
  EXPECT_FALSE(status.ok());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  // Broken from now on.
  EXPECT_FALSE((*second)->Receive(2, absl::MakeSpan(residual), absl::MakeSpan(proj)).ok());
}

TEST(PipelineLinkTest, BadArgumentsAreRefused) {
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  EXPECT_EQ(PipelineLink::Connect(store, 0, 1, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PipelineLink::Connect(store, 2, 2, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace loom::worker
