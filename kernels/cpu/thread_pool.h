#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace loom::kernels::cpu {

/// A fixed set of worker threads for data-parallel kernels. ParallelFor splits [0, n)
/// into contiguous chunks, runs them on the pool's threads and the caller's thread, and
/// returns when all are done. One ParallelFor at a time per pool (the forward pass
/// owns one pool); not re-entrant.
class ThreadPool {
 public:
  /// `num_threads` >= 1 counts the calling thread: 1 runs everything inline.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  /// Calls fn(begin, end) over disjoint chunks covering [0, n), each at least `grain`
  /// long (except the last), at most `chunks_per_thread` per thread. One chunk per thread
  /// keeps each thread on its own stretch of memory; compute-bound work asks for more, so
  /// a thread the machine slowed down takes fewer of them.
  void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn,
                   int chunks_per_thread = 1);

 private:
  void WorkerLoop(int index);

  int num_threads_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable work_cv_;
  // The job being run; written under mu_ before generation_ is bumped.
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0;
  int64_t job_chunk_ = 0;
  int64_t next_chunk_ = 0;  // guarded by mu_
  int64_t num_chunks_ = 0;
  // Chunks of the current job finished (by workers and the caller); the caller returns
  // when it reaches num_chunks_. Workers spin briefly on generation_ before sleeping on
  // work_cv_, so back-to-back kernels do not pay a futex wake each.
  std::atomic<int64_t> chunks_done_{0};
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> stop_{false};
};

/// For work done once, such as preparing weights at load: fn(begin, end) over disjoint
/// chunks covering [0, n), each at least `grain` long (except the last), on up to one
/// thread per CPU this process may use, started for the call (the caller's thread runs
/// one chunk; chunks whose thread cannot be started run there too); inline when one chunk
/// would do. Returns when all are done.
void ParallelForOnce(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace loom::kernels::cpu
