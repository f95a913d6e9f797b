// The products' thread pool (cpu_kernels.h: run_chunks, run_chunks_fn).
//
// Contract: run_chunks_fn(n, blocks, fn, ctx) runs fn(ctx, i) for i in [0, n) and returns when
// all have run. Small work (`blocks` blocks of 32 weights in all, under MIN_BLOCKS_PER_THREAD a
// thread), one chunk, or a second caller while another holds the pool: on the calling thread
// alone. Else on the calling thread and up to torch.get_num_threads() - 1 pool threads (not
// OpenMP's), in chunks that threads claim one at a time: helper threads that are late (on a busy
// machine a woken thread may wait a whole scheduler slice for a core) find the chunks taken and
// go back to waiting, so nobody waits for a thread that has not started, where an OpenMP region
// (or llama.cpp's barrier after every op) waits for all of its threads. The pool is made again
// after a fork (its threads do not survive one).
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "cpu_kernels.h"

// torch's intra-op thread count (ATen/Parallel.h), declared here so that this file needs no
// torch header; the library links libtorch_cpu, which defines it.
namespace at {
int get_num_threads();
}

namespace tinyllm_cpu {
namespace {

class Pool {
 public:
  // Runs fn(ctx, i) for i in [0, n) on the calling thread and up to `helpers` pool threads.
  void run(int helpers, int64_t n, void (*fn)(const void*, int64_t), const void* ctx) {
    grow(helpers);
    fn_.store(fn, std::memory_order_relaxed);
    ctx_.store(ctx, std::memory_order_relaxed);
    n_.store(n, std::memory_order_relaxed);
    helpers_.store(helpers, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    const uint64_t gen = (next_.load(std::memory_order_relaxed) >> 32) + 1;
    next_.store(gen << 32, std::memory_order_seq_cst);  // publish (the fields above first)
    if (sleeping_.load(std::memory_order_seq_cst) > 0) {
      std::lock_guard<std::mutex> lock(mu_);
      cv_.notify_all();
    }
    work(gen);
    while (done_.load(std::memory_order_acquire) < n) __builtin_ia32_pause();  // chunks still running elsewhere
    next_.store(gen << 32 | CLOSED, std::memory_order_seq_cst);  // no claim on this job from now on
  }

 private:
  // A helper waits for the next job spinning PAUSE_S, then yielding its core to any other thread
  // that wants it (between two products an eager step runs torch's own threaded ops) until
  // SPIN_S, then sleeping.
  static constexpr double PAUSE_S = 30e-6, SPIN_S = 300e-6;

  void grow(int helpers) {
    while (static_cast<int>(threads_) < helpers) {
      const int id = threads_++;
      std::thread([this, id] { loop(id); }).detach();
    }
  }

  // Claims and runs chunks of job `gen` until none is left. A helper that comes late may read
  // the next job's fields, but its claim (a compare-and-swap on the generation and chunk) then
  // fails: the job was closed before those fields were written.
  void work(uint64_t gen) {
    uint64_t v = next_.load(std::memory_order_acquire);
    if ((v >> 32) != gen) return;
    void (*fn)(const void*, int64_t) = fn_.load(std::memory_order_relaxed);
    const void* ctx = ctx_.load(std::memory_order_relaxed);
    const int64_t n = n_.load(std::memory_order_relaxed);
    while ((v >> 32) == gen && static_cast<int64_t>(v & CLOSED) < n) {
      if (!next_.compare_exchange_weak(v, v + 1, std::memory_order_acq_rel)) continue;  // v reloaded
      fn(ctx, static_cast<int64_t>(v & CLOSED));
      done_.fetch_add(1, std::memory_order_release);
      v = next_.load(std::memory_order_acquire);
    }
  }

  void loop(int id) {
    uint64_t seen = next_.load(std::memory_order_acquire) >> 32;
    for (;;) {
      uint64_t gen = next_.load(std::memory_order_acquire) >> 32;
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; gen == seen; ++i) {
        __builtin_ia32_pause();
        gen = next_.load(std::memory_order_acquire) >> 32;
        if ((i & 255) != 255) continue;
        const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (waited > PAUSE_S) sched_yield();  // let another thread that wants this core (torch's own) run
        if (waited > SPIN_S) {
          std::unique_lock<std::mutex> lock(mu_);
          sleeping_.fetch_add(1, std::memory_order_seq_cst);
          cv_.wait(lock, [&] { return (next_.load(std::memory_order_seq_cst) >> 32) != seen; });
          sleeping_.fetch_sub(1, std::memory_order_seq_cst);
          gen = next_.load(std::memory_order_acquire) >> 32;
        }
      }
      seen = gen;
      if (id < helpers_.load(std::memory_order_relaxed)) work(gen);  // a stale gen claims nothing
    }
  }

  // The job: read by helpers after they see its generation in next_ (release/acquire), and
  // used only through a successful claim.
  static constexpr uint64_t CLOSED = 0xFFFFFFFFu;  // the chunk field of a finished job
  std::atomic<void (*)(const void*, int64_t)> fn_{nullptr};
  std::atomic<const void*> ctx_{nullptr};
  std::atomic<int64_t> n_{0};
  std::atomic<int> helpers_{0};
  std::atomic<uint64_t> next_{0};  // generation << 32 | next chunk
  std::atomic<int64_t> done_{0};
  std::atomic<int> sleeping_{0};
  std::atomic<int> threads_{0};
  std::mutex mu_;
  std::condition_variable cv_;
};

std::mutex g_pool_busy;
Pool* g_pool = nullptr;  // reset in a forked child (pthread_atfork): getpid() on every call was 4.7%
                         // of a SmolLM2 step's samples on the main thread (a system call each time)

// The blocks a thread must have before a product takes another: MIN_BLOCKS_PER_THREAD, or
// TINYLLM_CPU_MIN_BLOCKS (read once, at the first product; to measure on a machine of many cores).
int64_t min_blocks() {
  const char* e = std::getenv("TINYLLM_CPU_MIN_BLOCKS");
  const int64_t v = e ? std::atoll(e) : 0;
  return v > 0 ? v : MIN_BLOCKS_PER_THREAD;
}

}  // namespace

void run_chunks_fn(int64_t n, int64_t blocks, void (*fn)(const void*, int64_t), const void* ctx) {
  static const int64_t per_thread = min_blocks();
  const int threads = std::min<int64_t>(at::get_num_threads(), std::max<int64_t>(1, blocks / per_thread));
  std::unique_lock<std::mutex> lock(g_pool_busy, std::try_to_lock);
  if (threads <= 1 || n <= 1 || !lock.owns_lock()) {
    for (int64_t i = 0; i < n; ++i) fn(ctx, i);
    return;
  }
  static const bool reset_at_fork = (pthread_atfork(nullptr, nullptr, [] { g_pool = nullptr; }), true);
  (void)reset_at_fork;
  if (g_pool == nullptr) g_pool = new Pool();  // never freed
  g_pool->run(threads - 1, n, fn, ctx);
}

}  // namespace tinyllm_cpu
