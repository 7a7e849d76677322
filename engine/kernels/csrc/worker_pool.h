// The kernels' own worker threads, for the splits of one forward pass (GEMM panels, attention items).
//
// With OMP_WAIT_POLICY=PASSIVE (which the engine needs: grammar work runs beside the forward) an
// OpenMP parallel region wakes sleeping threads, about 50 us a wake on this VM, and a decode step
// opens ~150 of them. These helpers stay awake for a while after each job before they sleep, so the
// kernels of one forward find them awake, and sleep between steps; awake, they yield their CPU to
// any other runnable thread (a loaded machine's, or the caller woken on the same CPU). Work is claimed chunk by chunk
// and the caller works too: a helper the OS has not scheduled delays at most the chunk it holds,
// and one that never woke up is simply not waited for.
#pragma once

#include <cstdint>
#include <functional>

namespace formwork {

// Runs fn(chunk) once for every chunk in [0, num_chunks), on the calling thread and the helpers
// (at::get_num_threads() - 1 of them, started on first use). Returns when every chunk has run.
// Calls from several threads at once are safe: one of them runs its chunks alone.
// FORMWORK_CPU_POOL=openmp splits the chunks with at::parallel_for instead (to compare).
void parallel_chunks(int64_t num_chunks, const std::function<void(int64_t)>& fn);

// Counts since the process started, to see whether the helpers take part: jobs the pool ran with
// helpers, those a helper ran a chunk of, their chunks, the chunks helpers ran, a helper's wake-ups
// from sleep, and helper joins that ran on the CPU the caller was on when it published the job
// (there they only time-slice the caller: no faster than one thread).
struct PoolStats {
  int64_t jobs, joined_jobs, chunks, helper_chunks, wakeups, same_cpu;
};
PoolStats pool_stats();

}  // namespace formwork
