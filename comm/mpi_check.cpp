// Out-of-line part of MOE_MPI_CHECK.
#include "comm/mpi_check.hpp"

#include <cstdio>

namespace moe {

int mpi_world_rank_or_minus_one() {
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
  throw MpiError("MPI call failed on rank " + std::to_string(mpi_world_rank_or_minus_one()) +
                 ": " + call + " -> " + text + " (" + file + ":" + std::to_string(line) + ")");
}

}  // namespace moe
