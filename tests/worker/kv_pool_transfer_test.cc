#include "worker/kv_pool_transfer.h"

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "model/cpu_kv_cache.h"
#include "tests/worker/kv_pool_test_util.h"
#include "tests/worker/local_server.h"

namespace loom::worker {
namespace {

using ::testing::HasSubstr;

using test_util::PoolConfig;

std::unique_ptr<model::CpuKvCache> Pool(bool shared, int64_t blocks = 150, int64_t kv_heads = 2,
                                        kernels::cpu::KvDtype dtype = kernels::cpu::KvDtype::kF16) {
  return *model::CpuKvCache::Create(PoolConfig(kv_heads), blocks, 16, dtype, shared);
}

using test_util::SavedBlock;

// A worker serving only ReadKvBlocks for pool blocks from `pool`, on a real local gRPC server,
// with the fence a WorkerService would keep.
class Source final : public loom::v1::Worker::Service {
 public:
  explicit Source(const model::KvCache* pool) : pool_(pool), fence_(*KvPoolFence::Create()) {}
  void Stop() { server_.Stop(); }
  std::string address() const { return server_.address(); }
  std::atomic<uint64_t> executed{0};
  std::atomic<uint64_t> stream{9};  // the source's current step stream
  // A new step stream begins right after the answer (before the reader copies).
  std::atomic<bool> new_stream_after_answer{false};

  grpc::Status ReadKvBlocks(grpc::ServerContext* context,
                            const loom::v1::ReadKvBlocksRequest* request,
                            grpc::ServerWriter<loom::v1::KvBlockChunk>* writer) override {
    const grpc::Status status = ServeKvPoolBlocks(
        context, pool_, *fence_, [this](uint64_t id) { return id == stream.load(); }, *request,
        writer,
        [this](uint64_t step) {
          return executed.load() >= step ? KvStepState::kRan : KvStepState::kPending;
        });
    if (new_stream_after_answer.load()) fence_->NewStream();
    return status;
  }

 private:
  const model::KvCache* pool_;
  std::unique_ptr<KvPoolFence> fence_;
  test_util::LocalServer server_{this};
};

loom::v1::FetchKvBlocksRequest Fetch(const std::string& address, std::vector<int32_t> source,
                                     std::vector<int32_t> dest) {
  loom::v1::FetchKvBlocksRequest request;
  loom::v1::KvBlockSource* from = request.add_sources();
  from->set_address(address);
  from->mutable_pool_blocks()->Add(source.begin(), source.end());
  from->set_stream_id(9);
  request.mutable_dest_blocks()->Add(dest.begin(), dest.end());
  request.set_dest_step_id(7);
  request.set_dest_stream_id(42);
  request.set_timeout_ms(20000);
  return request;
}

// The destination side: `pool` and a fence, on step stream `stream` (42 unless changed),
// where step `ran` ran (7 unless changed).
struct Dest {
  explicit Dest(const model::KvCache* pool) : fence(*KvPoolFence::Create()) {
    dest.pool = pool;
    dest.fence = fence.get();
    dest.current_stream = [this](uint64_t id) { return id == stream.load(); };
    dest.step_state = [this](uint64_t step) {
      return ran.load() >= step ? KvStepState::kRan : KvStepState::kPending;
    };
    dest.written = [this](absl::Span<const int32_t> blocks) {
      written.insert(written.end(), blocks.begin(), blocks.end());
    };
  }
  absl::StatusOr<loom::v1::FetchKvBlocksResponse> Run(const loom::v1::FetchKvBlocksRequest& r) {
    return FetchKvPoolBlocks(dest, r);
  }
  std::unique_ptr<KvPoolFence> fence;
  std::atomic<uint64_t> stream{42};
  std::atomic<uint64_t> ran{7};
  std::vector<int32_t> written;
  KvPoolDestination dest;
};

class KvPoolTransferTest : public ::testing::TestWithParam<kernels::cpu::KvDtype> {};

TEST_P(KvPoolTransferTest, BlocksAreCopiedStraightOutOfAnotherWorkersPool) {
  const std::unique_ptr<model::CpuKvCache> source_pool = Pool(true, 150, 2, GetParam());
  const std::unique_ptr<model::CpuKvCache> dest_pool = Pool(false, 150, 2, GetParam());
  test_util::RandomizeKvPool(*source_pool, 1);
  Source source(source_pool.get());
  Dest dest(dest_pool.get());
  // More than one batch, scattered both ways.
  std::vector<int32_t> from, to;
  for (int32_t i = 0; i < 100; ++i) {
    from.push_back((i * 37 + 5) % 150);
    to.push_back(149 - i);
  }
  const std::vector<uint8_t> untouched = SavedBlock(*dest_pool, 0);
  absl::StatusOr<loom::v1::FetchKvBlocksResponse> fetched =
      dest.Run(Fetch(source.address(), from, to));
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_EQ(fetched->bytes(), 100 * dest_pool->block_bytes());
  for (size_t i = 0; i < from.size(); ++i) {
    ASSERT_EQ(SavedBlock(*dest_pool, to[i]), SavedBlock(*source_pool, from[i])) << i;
  }
  EXPECT_EQ(dest.written, to);                 // the ledger forgets what they held
  EXPECT_EQ(SavedBlock(*dest_pool, 0), untouched);  // a block not named
}

INSTANTIATE_TEST_SUITE_P(KvDtypes, KvPoolTransferTest,
                         ::testing::Values(kernels::cpu::KvDtype::kF16,
                                           kernels::cpu::KvDtype::kInt8));

TEST(KvPoolTransfer, TheSourceAnswersOnlyAfterTheStepThatWritesTheBlocks) {
  const std::unique_ptr<model::CpuKvCache> source_pool = Pool(true), dest_pool = Pool(false);
  test_util::RandomizeKvPool(*source_pool, 2);
  Source source(source_pool.get());
  Dest dest(dest_pool.get());
  loom::v1::FetchKvBlocksRequest request = Fetch(source.address(), {4}, {9});
  request.set_after_step_id(3);
  request.set_timeout_ms(200);
  absl::StatusOr<loom::v1::FetchKvBlocksResponse> early = dest.Run(request);
  EXPECT_EQ(early.status().code(), absl::StatusCode::kDeadlineExceeded) << early.status();
  source.executed = 3;
  ASSERT_TRUE(dest.Run(request).ok());
  EXPECT_EQ(SavedBlock(*dest_pool, 9), SavedBlock(*source_pool, 4));
}

TEST(KvPoolTransfer, ACopyDuringTheSourcesStreamChangeIsDiscarded) {
  const std::unique_ptr<model::CpuKvCache> source_pool = Pool(true), dest_pool = Pool(false);
  Source source(source_pool.get());
  source.new_stream_after_answer = true;  // its blocks may be another sequence's by the copy
  Dest dest(dest_pool.get());
  absl::StatusOr<loom::v1::FetchKvBlocksResponse> fetched =
      dest.Run(Fetch(source.address(), {1, 2}, {3, 4}));
  EXPECT_EQ(fetched.status().code(), absl::StatusCode::kAborted) << fetched.status();
  EXPECT_THAT(fetched.status().message(), HasSubstr("step stream"));
}

TEST(KvPoolTransfer, ANewerStreamOnTheDestinationWritesNothing) {
  const std::unique_ptr<model::CpuKvCache> source_pool = Pool(true), dest_pool = Pool(false);
  test_util::RandomizeKvPool(*source_pool, 3);
  Source source(source_pool.get());
  Dest dest(dest_pool.get());
  dest.stream = 43;  // the transfer was planned on stream 42
  const std::vector<uint8_t> before = SavedBlock(*dest_pool, 3);
  absl::StatusOr<loom::v1::FetchKvBlocksResponse> fetched =
      dest.Run(Fetch(source.address(), {1}, {3}));
  EXPECT_EQ(fetched.status().code(), absl::StatusCode::kAborted) << fetched.status();
  // Waiting for its step, too.
  dest.ran = 6;
  fetched = dest.Run(Fetch(source.address(), {1}, {3}));
  EXPECT_EQ(fetched.status().code(), absl::StatusCode::kAborted) << fetched.status();
  EXPECT_EQ(SavedBlock(*dest_pool, 3), before);
  EXPECT_TRUE(dest.written.empty());
}

TEST(KvPoolTransfer, TheDestinationWritesAfterItsPlansThatMayTouchTheBlocksRan) {
  const std::unique_ptr<model::CpuKvCache> source_pool = Pool(true), dest_pool = Pool(false);
  test_util::RandomizeKvPool(*source_pool, 4);
  Source source(source_pool.get());
  Dest dest(dest_pool.get());
  dest.ran = 6;
  loom::v1::FetchKvBlocksRequest request = Fetch(source.address(), {2}, {5});
  request.set_timeout_ms(100);
  absl::StatusOr<loom::v1::FetchKvBlocksResponse> fetched = dest.Run(request);
  EXPECT_EQ(fetched.status().code(), absl::StatusCode::kDeadlineExceeded) << fetched.status();
  EXPECT_TRUE(dest.written.empty());
  dest.ran = 7;
  ASSERT_TRUE(dest.Run(request).ok());
  EXPECT_EQ(SavedBlock(*dest_pool, 5), SavedBlock(*source_pool, 2));
}

TEST(KvPoolTransfer, RefusesBadRequestsWithTheReason) {
  const std::unique_ptr<model::CpuKvCache> source_pool = Pool(true), dest_pool = Pool(false);
  Source source(source_pool.get());
  Dest dest(dest_pool.get());
  auto refused = [&](const loom::v1::FetchKvBlocksRequest& request, absl::StatusCode code,
                     const std::string& reason) {
    const absl::StatusOr<loom::v1::FetchKvBlocksResponse> fetched = dest.Run(request);
    EXPECT_EQ(fetched.status().code(), code) << fetched.status();
    EXPECT_THAT(fetched.status().message(), HasSubstr(reason));
  };
  refused(Fetch(source.address(), {150}, {0}), absl::StatusCode::kInvalidArgument,
          "outside this worker's pool");
  refused(Fetch(source.address(), {0}, {150}), absl::StatusCode::kInvalidArgument,
          "destination block 150");
  refused(Fetch(source.address(), {0, 1}, {2, 2}), absl::StatusCode::kInvalidArgument,
          "named twice");
  refused(Fetch(source.address(), {0, 1}, {2}), absl::StatusCode::kInvalidArgument,
          "2 source blocks for 1 destination");
  loom::v1::FetchKvBlocksRequest two = Fetch(source.address(), {0}, {1});
  *two.add_sources() = two.sources(0);
  refused(two, absl::StatusCode::kInvalidArgument, "one source");
  // Another layout: three KV heads here.
  const std::unique_ptr<model::CpuKvCache> wide = Pool(false, 150, 3);
  Dest wide_dest(wide.get());
  const absl::StatusOr<loom::v1::FetchKvBlocksResponse> mismatched =
      wide_dest.Run(Fetch(source.address(), {0}, {1}));
  EXPECT_EQ(mismatched.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(mismatched.status().message(), HasSubstr("bytes in the source pool"));
  // Other heads of the same count (another tensor-parallel rank).
  dest.dest.heads.kv_head_begin = 0;
  dest.dest.heads.num_kv_heads = 2;
  loom::v1::FetchKvBlocksRequest other_rank = Fetch(source.address(), {0}, {1});
  other_rank.mutable_sources(0)->set_kv_head_begin(2);
  other_rank.mutable_sources(0)->set_num_kv_heads(2);
  refused(other_rank, absl::StatusCode::kFailedPrecondition, "the same heads");
  // The source's stream that held the blocks is gone.
  source.stream = 10;
  refused(Fetch(source.address(), {0}, {1}), absl::StatusCode::kFailedPrecondition,
          "not this worker's any more");
  source.stream = 9;
  // A source pool that is not shared.
  const std::unique_ptr<model::CpuKvCache> private_pool = Pool(false);
  Source unshared(private_pool.get());
  refused(Fetch(unshared.address(), {0}, {1}), absl::StatusCode::kFailedPrecondition,
          "not in shared memory");
  // A source that is gone.
  source.Stop();
  refused(Fetch(source.address(), {0}, {1}), absl::StatusCode::kUnavailable, "");
}

}  // namespace
}  // namespace loom::worker
