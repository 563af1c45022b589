// A communicator over MPI with typed collectives, and the sub-communicators of expert parallelism.
// Every collective takes std::span of a typed element, so counts are always elements, never bytes.
// W ranks, P expert-parallel group size, W/P replicas of each expert shard.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <span>
#include <vector>

#include "comm/mpi_check.hpp"

namespace moe {

template <class T> MPI_Datatype mpi_type();
template <> inline MPI_Datatype mpi_type<float>() {
  return MPI_FLOAT;
}
template <> inline MPI_Datatype mpi_type<double>() {
  return MPI_DOUBLE;
}
template <> inline MPI_Datatype mpi_type<int>() {
  return MPI_INT;
}
template <> inline MPI_Datatype mpi_type<int64_t>() {
  return MPI_INT64_T;
}
template <> inline MPI_Datatype mpi_type<uint8_t>() {
  return MPI_UINT8_T;
}
template <> inline MPI_Datatype mpi_type<uint64_t>() {
  return MPI_UINT64_T;
}

// MPI_Init / MPI_Finalize for one program. Sets MPI_ERRORS_RETURN on MPI_COMM_WORLD so that
// MOE_MPI_CHECK sees error codes instead of MPI aborting without saying which call failed.
class MpiSession {
 public:
  MpiSession(int* argc, char*** argv);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
};

// Prints `message` once (prefixed with the rank) to stderr and ends every rank of the job with
// `exit_code`. Used by main() when an exception escapes, so no rank is left waiting in a
// collective.
[[noreturn]] void mpi_abort_job(const char* message, int exit_code);

class Comm {
 public:
  static Comm world();  // MPI_COMM_WORLD, not owned
  static Comm self();   // MPI_COMM_SELF, not owned: a one-rank world for reference runs

  Comm(Comm&& other) noexcept;
  Comm& operator=(Comm&& other) noexcept;
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;
  ~Comm();

  // Ranks with equal color form a new communicator, ordered by key (MPI_Comm_split).
  Comm split(int color, int key) const;
  // The ranks of this communicator that share this rank's node (MPI_COMM_TYPE_SHARED).
  Comm split_shared() const;

  int rank() const { return rank_; }
  int size() const { return size_; }
  MPI_Comm raw() const { return comm_; }

  template <class T> void allreduce_sum(std::span<T> data) const;
  template <class T> void allreduce_max(std::span<T> data) const;
  // Sum over ranks in one fixed order, whatever MPI's algorithms: along a binary tree over the
  // ranks (a range of n ranks splits after the largest power of two below n), reduced to rank 0
  // and broadcast. Its bits depend only on each rank's values: with model/tree_sum.hpp's per-rank
  // sums it gives the one-rank sum on any rank count. `scratch` holds data.size() elements.
  template <class T> void allreduce_sum_tree(std::span<T> data, std::span<T> scratch) const;
  // allreduce_sum_tree's sum (the same tree over the ranks, the same bits) of rank r's block only:
  // afterwards data[displs[r], displs[r] + counts[r]) holds it on rank r, and the rest of data is
  // as it was. Every rank sends each block to its rank once (MPI_Alltoallv) and adds what it
  // receives along the tree. `scratch` holds size() · counts[rank()] elements.
  template <class T>
  void reduce_scatter_tree(std::span<T> data, std::span<const int> counts,
                           std::span<const int> displs, std::span<T> scratch) const;
  // Rank r's block data[displs[r], displs[r] + counts[r]) to every rank (MPI_Allgatherv in place).
  template <class T>
  void allgatherv_blocks(std::span<T> data, std::span<const int> counts,
                         std::span<const int> displs) const;
  // Every rank sends `send.size() / size()` elements to each rank (MPI_Alltoall).
  template <class T> void alltoall(std::span<const T> send, std::span<T> recv) const;
  // Counts and displacements are in elements of T, one entry per rank.
  template <class T>
  void alltoallv(std::span<const T> send, std::span<const int> send_counts,
                 std::span<const int> send_displs, std::span<T> recv,
                 std::span<const int> recv_counts, std::span<const int> recv_displs) const;
  // Non-blocking alltoallv: returns the request to pass to wait(); the buffers must stay alive
  // and untouched until then.
  template <class T>
  MPI_Request ialltoallv(std::span<const T> send, std::span<const int> send_counts,
                         std::span<const int> send_displs, std::span<T> recv,
                         std::span<const int> recv_counts, std::span<const int> recv_displs) const;
  void wait(MPI_Request& request) const;
  // Point-to-point, non-blocking: data.size() elements to or from one rank. The buffer must stay
  // alive and untouched until the request completes (waitall).
  template <class T> MPI_Request isend(std::span<const T> data, int dest, int tag) const;
  template <class T> MPI_Request irecv(std::span<T> data, int source, int tag) const;
  // Completes every request (MPI_Waitall); each is MPI_REQUEST_NULL afterwards.
  void waitall(std::span<MPI_Request> requests) const;
  // The largest tag point-to-point calls accept (MPI_TAG_UB; MPI guarantees at least 32767).
  int tag_upper_bound() const { return tag_ub_; }
  // Gathers `send` (the same size on every rank) from every rank into recv, rank-major.
  template <class T> void allgather(std::span<const T> send, std::span<T> recv) const;
  // Gathers `send` (the same size on every rank) to `root`, rank-major; recv is used on root only.
  template <class T> void gather(std::span<const T> send, std::span<T> recv, int root) const;
  // Gathers `send` (its size may differ between ranks) to `root`: rank r's elements land at
  // recv[displs[r]], counts[r] of them; recv, counts and displs are used on root only.
  template <class T>
  void gatherv(std::span<const T> send, std::span<T> recv, std::span<const int> counts,
               std::span<const int> displs, int root) const;
  template <class T> void broadcast(std::span<T> data, int root) const;
  void barrier() const;

 private:
  Comm(MPI_Comm comm, bool owned);
  MPI_Comm comm_ = MPI_COMM_NULL;
  bool owned_ = false;
  int rank_ = 0;
  int size_ = 1;
  int tag_ub_ = 32767;                   // MPI_TAG_UB
  mutable std::vector<int> block_args_;  // [2·size] reduce_scatter_tree's receive counts and
                                         //   displacements, sized at construction
};

// The communicators of expert parallelism over a world of W ranks with EP group size P:
// EP group g holds positions [g·P, g·P + P) of the layout order (comm/host_layout.hpp: the world
// order unless the launcher interleaves hosts) and one copy of all E experts; the replica group of
// EP rank r holds the W/P ranks at positions whose index mod P is r, which own the same shard.
struct ParallelGroups {
  Comm ep;       // P ranks: token dispatch and combine
  Comm replica;  // W/P ranks: expert gradient all-reduce
  int ep_size = 1;
  int num_replicas = 1;
  int ep_group = 0;           // g: this rank's EP group (group 0 holds world rank 0)
  std::vector<int> ep_hosts;  // [P] host of each EP rank of this rank's group
};

// Collective over `world`, all ranks on one host: EP group g is world ranks [g·P, g·P + P).
// Throws ConfigError-like std::invalid_argument when P does not divide W.
ParallelGroups parallel_groups_make(const Comm& world, int ep_size);

}  // namespace moe
