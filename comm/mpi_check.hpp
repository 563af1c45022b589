// MPI error checking: every MPI call goes through MOE_MPI_CHECK, which throws MpiError naming the
// call, MPI's own error text, file:line and the world rank. main() catches it and aborts the job.
#pragma once

#include <mpi.h>

#include <stdexcept>
#include <string>

namespace moe {

class MpiError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Builds the message and throws; kept out of line so the macro stays small.
[[noreturn]] void mpi_fail(int code, const char* call, const char* file, int line);

// World rank for messages, or -1 before MPI_Init / after MPI_Finalize. Safe on any thread once
// MpiSession has remembered the rank (it calls MPI only when nothing is remembered).
int mpi_world_rank_or_minus_one();
// Called by MpiSession: the rank to report from now on (-1: ask MPI again).
void mpi_remember_world_rank(int rank);

}  // namespace moe

#define MOE_MPI_CHECK(call)                                    \
  do {                                                         \
    const int moe_mpi_rc_ = (call);                            \
    if (moe_mpi_rc_ != MPI_SUCCESS) {                          \
      ::moe::mpi_fail(moe_mpi_rc_, #call, __FILE__, __LINE__); \
    }                                                          \
  } while (0)
