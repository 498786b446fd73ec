#include "kernels/cpu/thread_pool.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <system_error>

#include "common/check.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define LOOM_CPU_RELAX() _mm_pause()
#else
#define LOOM_CPU_RELAX() ((void)0)
#endif

namespace loom::kernels::cpu {
namespace {

// How long an idle worker spins before sleeping: long enough to cover the serial work
// between two kernels of a decode step, short enough not to burn a core when idle.
constexpr auto kSpinTime = std::chrono::microseconds(200);

}  // namespace

ThreadPool::ThreadPool(int num_threads) : num_threads_(std::max(1, num_threads)) {
  for (int i = 1; i < num_threads_; ++i) threads_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
  }
  work_cv_.notify_all();
  for (std::thread& thread : threads_) thread.join();
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain,
                             const std::function<void(int64_t, int64_t)>& fn,
                             int chunks_per_thread) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  // Contiguous chunks, claimed dynamically: a thread that was descheduled takes fewer.
  const int64_t num_chunks = std::min<int64_t>(
      std::max<int64_t>(1, n / grain),
      int64_t{num_threads_} * std::max(1, chunks_per_thread));
  if (num_chunks <= 1) {
    fn(0, n);
    return;
  }
  const int64_t chunk = (n + num_chunks - 1) / num_chunks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    LOOM_CHECK(job_ == nullptr);  // not re-entrant
    job_ = &fn;
    job_n_ = n;
    job_chunk_ = chunk;
    next_chunk_ = 0;
    num_chunks_ = (n + chunk - 1) / chunk;
    chunks_done_.store(0, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
  }
  work_cv_.notify_all();
  // The caller claims chunks too.
  int64_t done_here = 0;
  while (true) {
    int64_t index;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (next_chunk_ >= num_chunks_) break;
      index = next_chunk_++;
    }
    fn(index * chunk, std::min(n, (index + 1) * chunk));
    ++done_here;
  }
  // Wait for the chunks the workers claimed, not for the workers: one still asleep when
  // the caller has done everything is not waited for (it finds the job gone).
  chunks_done_.fetch_add(done_here, std::memory_order_acq_rel);
  for (int spins = 0; chunks_done_.load(std::memory_order_acquire) != num_chunks_; ++spins) {
    if (spins < 4096) {
      LOOM_CPU_RELAX();
    } else {
      std::this_thread::yield();
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  job_ = nullptr;
}

void ThreadPool::WorkerLoop(int index) {
  (void)index;
  uint64_t seen = 0;
  while (true) {
    const auto spin_start = std::chrono::steady_clock::now();
    for (int spins = 0; generation_.load(std::memory_order_acquire) == seen && !stop_.load();
         ++spins) {
      LOOM_CPU_RELAX();
      if ((spins & 63) == 63 && std::chrono::steady_clock::now() - spin_start > kSpinTime) break;
    }
    std::unique_lock<std::mutex> lock(mu_);
    work_cv_.wait(lock, [&] { return stop_.load() || generation_.load() != seen; });
    if (stop_.load()) return;
    seen = generation_.load();
    // Claim chunks of the job of generation `seen` while it has any. A job the caller
    // already finished left job_ null or no chunk; once the last chunk lands the caller
    // may return and publish the next job (a new generation), so every claim re-checks.
    while (job_ != nullptr && generation_.load() == seen && next_chunk_ < num_chunks_) {
      const std::function<void(int64_t, int64_t)>* job = job_;
      const int64_t n = job_n_;
      const int64_t chunk = job_chunk_;
      const int64_t chunk_index = next_chunk_++;
      lock.unlock();
      (*job)(chunk_index * chunk, std::min(n, (chunk_index + 1) * chunk));
      chunks_done_.fetch_add(1, std::memory_order_acq_rel);
      lock.lock();
    }
  }
}

void ParallelForOnce(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  // The CPUs this process may run on (its affinity: a container's or taskset's share),
  // not every CPU of the machine.
  int64_t cpus = std::max<int64_t>(1, std::thread::hardware_concurrency());
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) == 0) {
    cpus = std::max<int64_t>(1, CPU_COUNT(&allowed));
  }
  const int64_t chunks = std::min(cpus, std::max<int64_t>(1, n / std::max<int64_t>(grain, 1)));
  if (chunks <= 1) {
    fn(0, n);
    return;
  }
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(chunks - 1));
  int64_t started = 1;  // chunk 0 is the caller's
  try {
    for (; started < chunks; ++started) {
      threads.emplace_back(fn, n * started / chunks, n * (started + 1) / chunks);
    }
  } catch (const std::system_error&) {
    // No thread to be had (a process limit): the chunks not started run here.
  }
  for (int64_t c = started; c < chunks; ++c) fn(n * c / chunks, n * (c + 1) / chunks);
  fn(0, n / chunks);
  for (std::thread& thread : threads) thread.join();
}

}  // namespace loom::kernels::cpu
