// Out-of-line part of MOE_MPI_CHECK.
#include "comm/mpi_check.hpp"

#include <atomic>
#include <cstdio>

namespace moe {

namespace {

// The world rank, remembered by MpiSession: error messages built on other threads (a BLAS check
// failing inside a parallel task) must not call MPI there, which MPI_THREAD_FUNNELED forbids.
std::atomic<int> g_world_rank{-1};

}  // namespace

void mpi_remember_world_rank(int rank) {
  g_world_rank.store(rank);
}

int mpi_world_rank_or_minus_one() {
  if (const int rank = g_world_rank.load(); rank >= 0) return rank;
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return -1;
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

void mpi_fail(int code, const char* call, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) {
    std::snprintf(text, sizeof text, "MPI error code %d", code);
  }
  throw MpiError("MPI call failed on rank " + std::to_string(mpi_world_rank_or_minus_one()) + ": " +
                 call + " -> " + text + " (" + file + ":" + std::to_string(line) + ")");
}

}  // namespace moe
