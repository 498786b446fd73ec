#include "worker/kv_pool_transfer.h"

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
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

// Between tensor-parallel sizes: a TP-1 destination reads its 4 KV heads from the two ranks of
// a TP-2 source (heads [0, 2) and [2, 4)), and rank 1 of a TP-2 destination reads heads
// [2, 4) out of a TP-1 source's 4: each block then holds what a pool of those heads computed.
TEST_P(KvPoolTransferTest, HeadsAreMappedBetweenTensorParallelSizes) {
  const kernels::cpu::KvDtype dtype = GetParam();
  const std::unique_ptr<model::CpuKvCache> full = Pool(true, 40, 4, dtype);
  const std::unique_ptr<model::CpuKvCache> low = Pool(true, 40, 2, dtype);
  const std::unique_ptr<model::CpuKvCache> high = Pool(true, 40, 2, dtype);
  test_util::RandomizeKvPool(*full, 5);
  test_util::CopyKvHeads(*full, 0, 2, *low);
  test_util::CopyKvHeads(*full, 2, 2, *high);
  Source rank0(low.get()), rank1(high.get()), whole(full.get());
  const std::vector<int32_t> from = {3, 39, 0, 17}, to = {5, 1, 38, 20};

  const std::unique_ptr<model::CpuKvCache> tp1 = Pool(false, 40, 4, dtype);
  Dest gather(tp1.get());
  gather.dest.heads.kv_head_begin = 0;
  gather.dest.heads.num_kv_heads = 4;
  loom::v1::FetchKvBlocksRequest request = Fetch(rank0.address(), from, to);
  request.mutable_sources(0)->set_num_kv_heads(2);
  *request.add_sources() = Fetch(rank1.address(), from, to).sources(0);
  request.mutable_sources(1)->set_kv_head_begin(2);
  request.mutable_sources(1)->set_num_kv_heads(2);
  absl::StatusOr<loom::v1::FetchKvBlocksResponse> fetched = gather.Run(request);
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_EQ(fetched->bytes(), 4 * tp1->block_bytes());
  for (size_t i = 0; i < from.size(); ++i) {
    EXPECT_EQ(SavedBlock(*tp1, to[i]), SavedBlock(*full, from[i])) << i;
  }
  EXPECT_EQ(gather.written, to);  // once, not once per source

  // 3 KV heads over 2 ranks share head 1 (ranks hold [0, 2) and [1, 3)): it comes from the
  // first, the second gives head 2 alone.
  const std::unique_ptr<model::CpuKvCache> three = Pool(true, 40, 3, dtype);
  const std::unique_ptr<model::CpuKvCache> first = Pool(true, 40, 2, dtype);
  const std::unique_ptr<model::CpuKvCache> second = Pool(true, 40, 2, dtype);
  test_util::RandomizeKvPool(*three, 6);
  test_util::CopyKvHeads(*three, 0, 2, *first);
  test_util::CopyKvHeads(*three, 1, 2, *second);
  Source shared0(first.get()), shared1(second.get());
  const std::unique_ptr<model::CpuKvCache> tp1_three = Pool(false, 40, 3, dtype);
  Dest overlap(tp1_three.get());
  overlap.dest.heads.kv_head_begin = 0;
  overlap.dest.heads.num_kv_heads = 3;
  request = Fetch(shared1.address(), from, to);  // the request's order need not be the heads'
  request.mutable_sources(0)->set_kv_head_begin(1);
  request.mutable_sources(0)->set_num_kv_heads(2);
  *request.add_sources() = Fetch(shared0.address(), from, to).sources(0);
  request.mutable_sources(1)->set_num_kv_heads(2);
  fetched = overlap.Run(request);
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_EQ(fetched->bytes(), 4 * tp1_three->block_bytes());
  for (size_t i = 0; i < from.size(); ++i) {
    EXPECT_EQ(SavedBlock(*tp1_three, to[i]), SavedBlock(*three, from[i])) << i;
  }

  const std::unique_ptr<model::CpuKvCache> tp2_rank1 = Pool(false, 40, 2, dtype);
  Dest slice(tp2_rank1.get());
  slice.dest.heads.kv_head_begin = 2;
  slice.dest.heads.num_kv_heads = 2;
  request = Fetch(whole.address(), from, to);
  request.mutable_sources(0)->set_num_kv_heads(4);
  fetched = slice.Run(request);
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_EQ(fetched->bytes(), 4 * tp2_rank1->block_bytes());
  for (size_t i = 0; i < from.size(); ++i) {
    EXPECT_EQ(SavedBlock(*tp2_rank1, to[i]), SavedBlock(*high, from[i])) << i;
  }
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
  refused(two, absl::StatusCode::kFailedPrecondition, "needs every side's KV heads");
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
  refused(other_rank, absl::StatusCode::kFailedPrecondition, "this worker's [0, 2) exactly once");
  // Sources whose heads give this worker's twice, or not all of them.
  for (const auto& ranges : std::vector<std::vector<std::pair<int, int>>>{
           {{0, 1}, {0, 1}}, {{0, 1}}, {{0, 1}, {1, 2}, {1, 2}}}) {
    loom::v1::FetchKvBlocksRequest request = Fetch(source.address(), {0}, {1});
    request.clear_sources();
    for (const auto& [begin, count] : ranges) {
      *request.add_sources() = Fetch(source.address(), {0}, {1}).sources(0);
      request.mutable_sources(request.sources_size() - 1)->set_kv_head_begin(begin);
      request.mutable_sources(request.sources_size() - 1)->set_num_kv_heads(count);
    }
    refused(request, absl::StatusCode::kFailedPrecondition, "exactly once");
  }
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
