// Independent tasks, blocks and rows on the OpenMP threads of a rank (blas_set_threads). A GEMM
// inside a task runs on the task's thread (model/gemm/), so a task's result is the same whichever
// thread runs it and however many there are: results never depend on the schedule. An exception
// thrown by a task is carried out of the parallel region and rethrown.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>

namespace moe {

// Row loops (tokens) with at least this many rows run on the threads, split in static blocks; each
// row's result is computed the same way whichever thread has it.
constexpr int kParallelRows = 64;

// Calls task(i) for every i in [0, n), tasks handed out one at a time (their sizes may differ).
// Without threads to share (one thread, or n < 2) the loop runs in order on the calling thread;
// a single task runs outside any parallel region, so that work inside it (a large GEMM) can still
// use the threads.
template <class F> void parallel_tasks(int64_t n, F&& task) {
  if (n == 1) {
    task(int64_t{0});
    return;
  }
  std::exception_ptr error;
#pragma omp parallel for schedule(dynamic, 1) if (n > 1)
  for (int64_t i = 0; i < n; ++i) {
    try {
      task(i);
    } catch (...) {
#pragma omp critical(moe_parallel_tasks_error)
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

// Splits [0, n) into one contiguous block per thread (lengths multiples of 64) and calls
// block(begin, end) for each; below min_parallel elements, or inside a parallel region (a task),
// one call on the calling thread. For loops whose elements are independent, so that the results
// do not depend on the split. The block must not throw.
template <class F> void parallel_blocks(int64_t n, int64_t min_parallel, F&& block) {
  if (n < min_parallel || omp_get_level() > 0) {
    if (n > 0) block(int64_t{0}, n);
    return;
  }
#pragma omp parallel
  {
    const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t per = ((n + threads - 1) / threads + 63) / 64 * 64;
    const int64_t begin = std::min(n, t * per), end = std::min(n, begin + per);
    if (begin < end) block(begin, end);
  }
}

// Elementwise passes over at least this many values go to the threads (parallel_blocks).
constexpr int64_t kParallelValues = int64_t{1} << 16;

// p[0, n) = 0, on the threads from kParallelValues values.
template <class T> void parallel_zero(T* p, size_t n) {
  parallel_blocks(static_cast<int64_t>(n), kParallelValues,
                  [p](int64_t b, int64_t e) { std::fill(p + b, p + e, T(0)); });
}

// dst[i] += src[i] for i in [0, n), on the threads from kParallelValues values.
template <class T> void parallel_add(T* dst, const T* src, size_t n) {
  parallel_blocks(static_cast<int64_t>(n), kParallelValues, [dst, src](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) dst[i] += src[i];
  });
}

}  // namespace moe
