#include "kernels/cpu/thread_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace loom::kernels::cpu {
namespace {

TEST(ThreadPoolTest, CoversEveryIndexExactlyOnceInChunksOfAtLeastGrain) {
  for (int threads : {1, 2, 4}) {
    ThreadPool pool(threads);
    for (int chunks_per_thread : {1, 4}) {
      for (int64_t n : {1, 2, 7, 100, 1001}) {
        for (int64_t grain : {1, 3, 64}) {
          std::vector<std::atomic<int>> hits(n);
          std::mutex mu;
          std::vector<std::pair<int64_t, int64_t>> chunks;
          pool.ParallelFor(
              n, grain,
              [&](int64_t begin, int64_t end) {
                for (int64_t i = begin; i < end; ++i) hits[i]++;
                std::lock_guard<std::mutex> lock(mu);
                chunks.emplace_back(begin, end);
              },
              chunks_per_thread);
          for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n " << n << " i " << i;
          for (auto [begin, end] : chunks) {
            if (end != n) {
              EXPECT_GE(end - begin, grain);
            }
          }
          EXPECT_LE(static_cast<int>(chunks.size()), threads * chunks_per_thread);
          // Enough work is split about as finely as asked (equal chunks, rounded up).
          if (n / grain >= threads * chunks_per_thread) {
            EXPECT_GT(static_cast<int>(chunks.size()), threads * (chunks_per_thread - 1))
                << "n " << n << " grain " << grain << " threads " << threads;
          }
        }
      }
    }
  }
}

// The load-time form: every index once, chunks of at least `grain`, at most one per hardware
// thread, inline on the caller when one chunk will do, nothing for nothing.
TEST(ParallelForOnceTest, CoversEveryIndexOnceInChunksOfAtLeastGrain) {
  const int hardware = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int64_t n : {1, 2, 7, 100, 1001, 1 << 16}) {
    for (int64_t grain : {1, 3, 64}) {
      std::vector<std::atomic<int>> hits(n);
      std::mutex mu;
      std::vector<std::pair<int64_t, int64_t>> chunks;
      std::set<std::thread::id> threads;
      ParallelForOnce(n, grain, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) hits[i]++;
        std::lock_guard<std::mutex> lock(mu);
        chunks.emplace_back(begin, end);
        threads.insert(std::this_thread::get_id());
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n " << n << " i " << i;
      for (auto [begin, end] : chunks) {
        if (end != n) {
          EXPECT_GE(end - begin, grain);
        }
      }
      EXPECT_LE(static_cast<int>(chunks.size()), hardware);
      if (n < 2 * grain) {
        EXPECT_EQ(chunks.size(), 1u);
        EXPECT_EQ(*threads.begin(), std::this_thread::get_id()) << "one chunk runs inline";
      }
    }
  }
  bool called = false;
  ParallelForOnce(0, 1, [&](int64_t, int64_t) { called = true; });
  EXPECT_FALSE(called);
}

TEST(ThreadPoolTest, UsesTheWorkerThreadsAndTheCaller) {
  ThreadPool pool(2);
  std::mutex mu;
  std::set<std::thread::id> ids;
  for (int round = 0; round < 50 && ids.size() < 2; ++round) {
    pool.ParallelFor(2, 1, [&](int64_t, int64_t) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      std::lock_guard<std::mutex> lock(mu);
      ids.insert(std::this_thread::get_id());
    });
  }
  EXPECT_EQ(ids.size(), 2u);
}

TEST(ThreadPoolTest, ManyBackToBackJobsAllComplete) {
  ThreadPool pool(3);
  std::atomic<int64_t> total{0};
  for (int round = 0; round < 2000; ++round) {
    pool.ParallelFor(10, 1, [&](int64_t begin, int64_t end) { total += end - begin; });
  }
  EXPECT_EQ(total.load(), 20000);
}

// The caller returns once every chunk is done, possibly before a worker woke up; that
// worker must then join the next job (or none), never run an old job's function with the
// next job's chunk indices. Alternating jobs of different sizes, each checking its own
// indices, would catch it.
TEST(ThreadPoolTest, LateWorkersNeverRunAFinishedJob) {
  for (int threads : {2, 3}) {
    ThreadPool pool(threads);
    for (int round = 0; round < 3000; ++round) {
      const int64_t n = round % 3 == 0 ? 1000 : 2 + round % 5;
      std::vector<std::atomic<int>> hits(n);
      std::atomic<bool> out_of_range{false};
      pool.ParallelFor(n, 1, [&](int64_t begin, int64_t end) {
        if (begin < 0 || end > n) {
          out_of_range = true;
          return;
        }
        for (int64_t i = begin; i < end; ++i) hits[i]++;
      });
      ASSERT_FALSE(out_of_range.load()) << "round " << round;
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "round " << round;
      if (round % 500 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
}

}  // namespace
}  // namespace loom::kernels::cpu
