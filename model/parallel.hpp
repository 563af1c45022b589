// Independent tasks on the OpenMP threads of a rank (the same threads OpenBLAS uses: the OpenMP
// build, see CMakeLists.txt). Inside a task OpenBLAS runs single-threaded, so a task's result is
// the same whichever thread runs it and however many there are: results never depend on the
// schedule. An exception thrown by a task is carried out of the parallel region and rethrown.
#pragma once

#include <cstdint>
#include <exception>

namespace moe {

// Row loops (tokens) with at least this many rows run on the threads, split in static blocks; each
// row's result is computed the same way whichever thread has it.
constexpr int kParallelRows = 64;

// Calls task(i) for every i in [0, n), tasks handed out one at a time (their sizes may differ).
// Without threads to share (one thread, or n < 2) the loop runs in order on the calling thread.
template <class F>
void parallel_tasks(int64_t n, F&& task) {
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

}  // namespace moe
