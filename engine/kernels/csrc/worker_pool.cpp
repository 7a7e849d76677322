// formwork::parallel_chunks (worker_pool.h): a job is published as a ticket (generation, open);
// a helper joins by counting itself in, then checking that the ticket is still the one it saw;
// the caller, its own chunks done, closes the ticket and waits only for helpers that joined.
//
// Helpers are not bound to CPUs: when the other CPUs are busy, Linux wakes a helper on the caller's
// CPU, where its chunks only time-slice the caller's (pool_stats' same_cpu counts those joins);
// bound to another CPU instead it waited there for a time slice while the caller spun for the
// chunk it held, which was slower still (docs/benchmarks.md, "Prefill GEMMs").
#include "worker_pool.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <sched.h>
#include <sys/prctl.h>
#include <time.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace formwork {
namespace {

// how long a helper stays awake after a job: longer than the gaps between one forward's kernels
constexpr auto kSpin = std::chrono::microseconds(300);
// checks between two looks at the clock
constexpr int kPauses = 64;
// how long one wait spins before it naps between checks: most of a quiet machine's waits inside a
// forward end sooner; spinning longer holds the CPU from a busy neighbour (50 us cost a probe beside
// a busy loop 20-30 % against this)
constexpr auto kSpinBeforeNap = std::chrono::microseconds(10);
constexpr timespec kNap = {0, 10'000};

// One wait for another thread, check by check: spin on pause for kSpinBeforeNap, then nap between
// checks. When the machine has more runnable threads than CPUs, a thread that only spins holds its CPU
// to the end of its time slice while the thread it waits for (or the caller, when Linux woke a helper
// on the caller's CPU) waits for that CPU; napping hands it over. A nap, not sched_yield: a yielded
// thread stays runnable, so an idle-class thread (a grammar compile) that got the CPU keeps it to the
// scheduler's next tick (a 16-token probe +54 % beside one), while a sleeper's wake-up preempts it.
class Wait {
 public:
  void check() {
    if (++checks_ % kPauses != 0) {
#if defined(__x86_64__)
      _mm_pause();
#endif
      return;
    }
    if (napping_) {
      nanosleep(&kNap, nullptr);
      return;
    }
    const auto now = std::chrono::steady_clock::now();
    if (checks_ == kPauses) {
      nap_from_ = now + kSpinBeforeNap;
    } else if (now >= nap_from_) {
      napping_ = true;
    }
  }

 private:
  int checks_ = 0;
  bool napping_ = false;
  std::chrono::steady_clock::time_point nap_from_;
};

// naps as short as asked: Linux's default timer slack (50 us) would stretch each 10 us nap six-fold
inline void tighten_timer_slack() {
  thread_local bool done = false;
  if (!done) {
    prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
    done = true;
  }
}

class Pool {
 public:
  explicit Pool(int num_helpers) {
    for (int i = 0; i < num_helpers; ++i) helpers_.emplace_back([this] { serve(); });
    for (auto& t : helpers_) t.detach();  // they live as long as the process
  }

  bool has_helpers() const { return !helpers_.empty(); }

  PoolStats stats() const {
    return {jobs_.load(), joined_jobs_.load(), chunks_.load(), helper_chunks_.load(), wakeups_.load(),
            same_cpu_.load()};
  }

  void run(int64_t num_chunks, const std::function<void(int64_t)>& fn) {
    std::unique_lock<std::mutex> caller(caller_mutex_, std::try_to_lock);
    if (!caller.owns_lock()) {  // another thread's job is running: do this one alone
      for (int64_t c = 0; c < num_chunks; ++c) fn(c);
      return;
    }
    tighten_timer_slack();
    job_ = &fn;
    num_chunks_ = num_chunks;
    caller_cpu_.store(sched_getcpu(), std::memory_order_relaxed);
    helper_joined_.store(false, std::memory_order_relaxed);
    next_.store(0, std::memory_order_relaxed);
    const uint64_t ticket = ticket_.load(std::memory_order_relaxed) + 2 | 1;  // next generation, open
    {
      std::lock_guard<std::mutex> lock(sleep_mutex_);
      ticket_.store(ticket, std::memory_order_seq_cst);
    }
    wake_.notify_all();
    work();
    ticket_.store(ticket & ~uint64_t{1}, std::memory_order_seq_cst);  // closed: no one joins any more
    for (Wait wait; joined_.load(std::memory_order_seq_cst) != 0;) wait.check();
    jobs_.fetch_add(1, std::memory_order_relaxed);
    chunks_.fetch_add(num_chunks, std::memory_order_relaxed);
    if (helper_joined_.load(std::memory_order_relaxed)) joined_jobs_.fetch_add(1, std::memory_order_relaxed);
  }

 private:
  // the chunks this thread ran
  int64_t work() {
    int64_t done = 0;
    for (int64_t c; (c = next_.fetch_add(1, std::memory_order_relaxed)) < num_chunks_; ++done) (*job_)(c);
    return done;
  }

  void serve() {
    tighten_timer_slack();
    uint64_t seen = 0;
    for (;;) {
      const auto deadline = std::chrono::steady_clock::now() + kSpin;
      uint64_t ticket;
      Wait wait;
      while ((ticket = ticket_.load(std::memory_order_acquire)) == seen || !(ticket & 1)) {
        if (std::chrono::steady_clock::now() > deadline) {
          std::unique_lock<std::mutex> lock(sleep_mutex_);
          wake_.wait(lock, [&] {
            const uint64_t t = ticket_.load(std::memory_order_acquire);
            return t != seen && (t & 1);
          });
          wakeups_.fetch_add(1, std::memory_order_relaxed);
          wait = Wait();
        }
        wait.check();
      }
      seen = ticket;
      joined_.fetch_add(1, std::memory_order_seq_cst);
      if (ticket_.load(std::memory_order_seq_cst) == ticket) {  // else: closed before we joined
        const int64_t done = work();
        if (done > 0) {
          helper_joined_.store(true, std::memory_order_relaxed);
          helper_chunks_.fetch_add(done, std::memory_order_relaxed);
          if (sched_getcpu() == caller_cpu_.load(std::memory_order_relaxed))
            same_cpu_.fetch_add(1, std::memory_order_relaxed);
        }
      }
      joined_.fetch_sub(1, std::memory_order_seq_cst);
    }
  }

  std::vector<std::thread> helpers_;
  std::mutex caller_mutex_, sleep_mutex_;
  std::condition_variable wake_;
  std::atomic<uint64_t> ticket_{0};  // generation * 2 + open
  std::atomic<int> joined_{0};
  std::atomic<int64_t> next_{0};
  const std::function<void(int64_t)>* job_ = nullptr;
  int64_t num_chunks_ = 0;
  // what pool_stats() reports
  std::atomic<int> caller_cpu_{-1};
  std::atomic<bool> helper_joined_{false};
  std::atomic<int64_t> jobs_{0}, joined_jobs_{0}, chunks_{0}, helper_chunks_{0}, wakeups_{0}, same_cpu_{0};
};

Pool& pool() {
  static Pool* instance = new Pool(std::max(0, at::get_num_threads() - 1));  // never destroyed: helpers outlive exit
  return *instance;
}

}  // namespace

PoolStats pool_stats() { return pool().stats(); }

void parallel_chunks(int64_t num_chunks, const std::function<void(int64_t)>& fn) {
  static const bool use_openmp = [] {
    const char* choice = std::getenv("FORMWORK_CPU_POOL");
    return choice != nullptr && std::string(choice) == "openmp";
  }();
  if (num_chunks <= 1 || at::in_parallel_region()) {
    for (int64_t c = 0; c < num_chunks; ++c) fn(c);
  } else if (use_openmp) {
    at::parallel_for(0, num_chunks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) fn(c);
    });
  } else if (pool().has_helpers()) {
    pool().run(num_chunks, fn);
  } else {
    for (int64_t c = 0; c < num_chunks; ++c) fn(c);
  }
}

}  // namespace formwork
