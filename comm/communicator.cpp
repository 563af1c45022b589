// Comm: typed MPI collectives with every call checked.
#include "comm/communicator.hpp"

#include <algorithm>
#include <array>
#include <climits>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <utility>

namespace moe {

MpiSession::MpiSession(int* argc, char*** argv) {
  int provided = 0;
  MOE_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided));
  MOE_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  MOE_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN));
  int rank = -1;
  MOE_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  mpi_remember_world_rank(rank);
}

MpiSession::~MpiSession() {
  // Everything a rank printed is out before it leaves MPI_Finalize's fence: once one rank of a job
  // exits with a non-zero status, mpirun kills the others after its grace time, and a buffered
  // line of theirs (stdout to a pipe is fully buffered) would be lost with them.
  std::fflush(nullptr);
  mpi_remember_world_rank(-1);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

void mpi_abort_job(const char* message, int exit_code) {
  const int rank = mpi_world_rank_or_minus_one();
  std::fprintf(stderr, "moe_rt: error (rank %d): %s\n", rank, message);
  std::fflush(stderr);
  if (rank >= 0) MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::exit(exit_code);
}

Comm::Comm(MPI_Comm comm, bool owned) : comm_(comm), owned_(owned) {
  MOE_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  MOE_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  void* tag_ub = nullptr;
  int found = 0;
  // A property of the MPI library, attached to MPI_COMM_WORLD (split communicators copy no
  // attributes).
  MOE_MPI_CHECK(MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tag_ub, &found));
  if (found) tag_ub_ = *static_cast<int*>(tag_ub);
  block_args_.resize(2 * static_cast<size_t>(size_));
}

Comm Comm::world() {
  return Comm(MPI_COMM_WORLD, false);
}
Comm Comm::self() {
  return Comm(MPI_COMM_SELF, false);
}

Comm::Comm(Comm&& o) noexcept
    : comm_(std::exchange(o.comm_, MPI_COMM_NULL)),
      owned_(std::exchange(o.owned_, false)),
      rank_(o.rank_),
      size_(o.size_),
      tag_ub_(o.tag_ub_),
      block_args_(std::move(o.block_args_)) {}

Comm& Comm::operator=(Comm&& o) noexcept {
  if (this != &o) {
    if (owned_) MPI_Comm_free(&comm_);
    comm_ = std::exchange(o.comm_, MPI_COMM_NULL);
    owned_ = std::exchange(o.owned_, false);
    rank_ = o.rank_;
    size_ = o.size_;
    tag_ub_ = o.tag_ub_;
    block_args_ = std::move(o.block_args_);
  }
  return *this;
}

Comm::~Comm() {
  // MPI_Comm_free after MPI_Finalize is an error; a Comm outliving MPI just leaks its handle.
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owned_ && !finalized) MPI_Comm_free(&comm_);
}

Comm Comm::split(int color, int key) const {
  MPI_Comm out = MPI_COMM_NULL;
  MOE_MPI_CHECK(MPI_Comm_split(comm_, color, key, &out));
  MOE_MPI_CHECK(MPI_Comm_set_errhandler(out, MPI_ERRORS_RETURN));
  return Comm(out, true);
}

Comm Comm::split_shared() const {
  MPI_Comm out = MPI_COMM_NULL;
  MOE_MPI_CHECK(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &out));
  MOE_MPI_CHECK(MPI_Comm_set_errhandler(out, MPI_ERRORS_RETURN));
  return Comm(out, true);
}

template <class T> void Comm::allreduce_sum(std::span<T> data) const {
  MOE_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data.data(), static_cast<int>(data.size()),
                              mpi_type<T>(), MPI_SUM, comm_));
}

template <class T> void Comm::allreduce_max(std::span<T> data) const {
  MOE_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data.data(), static_cast<int>(data.size()),
                              mpi_type<T>(), MPI_MAX, comm_));
}

template <class T> void Comm::alltoall(std::span<const T> send, std::span<T> recv) const {
  if (send.size() % size_ != 0 || recv.size() != send.size()) {
    throw std::invalid_argument("Comm::alltoall: buffers must hold the same multiple of " +
                                std::to_string(size_) + " elements");
  }
  const int per_rank = static_cast<int>(send.size() / size_);
  MOE_MPI_CHECK(MPI_Alltoall(send.data(), per_rank, mpi_type<T>(), recv.data(), per_rank,
                             mpi_type<T>(), comm_));
}

namespace {

// Counts and displacements: one per rank, every block inside its buffer.
template <class T>
void check_alltoallv_args(int size, std::span<const T> send, std::span<const int> send_counts,
                          std::span<const int> send_displs, std::span<T> recv,
                          std::span<const int> recv_counts, std::span<const int> recv_displs) {
  const auto n = static_cast<size_t>(size);
  if (send_counts.size() != n || send_displs.size() != n || recv_counts.size() != n ||
      recv_displs.size() != n) {
    throw std::invalid_argument(
        "Comm::alltoallv: counts and displacements need one entry per rank");
  }
  for (size_t r = 0; r < n; ++r) {
    if (static_cast<size_t>(send_displs[r]) + send_counts[r] > send.size() ||
        static_cast<size_t>(recv_displs[r]) + recv_counts[r] > recv.size()) {
      throw std::invalid_argument("Comm::alltoallv: a block for rank " + std::to_string(r) +
                                  " lies outside its buffer");
    }
  }
}

}  // namespace

template <class T>
void Comm::alltoallv(std::span<const T> send, std::span<const int> send_counts,
                     std::span<const int> send_displs, std::span<T> recv,
                     std::span<const int> recv_counts, std::span<const int> recv_displs) const {
  check_alltoallv_args(size_, send, send_counts, send_displs, recv, recv_counts, recv_displs);
  MOE_MPI_CHECK(MPI_Alltoallv(send.data(), send_counts.data(), send_displs.data(), mpi_type<T>(),
                              recv.data(), recv_counts.data(), recv_displs.data(), mpi_type<T>(),
                              comm_));
}

template <class T>
MPI_Request Comm::ialltoallv(std::span<const T> send, std::span<const int> send_counts,
                             std::span<const int> send_displs, std::span<T> recv,
                             std::span<const int> recv_counts,
                             std::span<const int> recv_displs) const {
  check_alltoallv_args(size_, send, send_counts, send_displs, recv, recv_counts, recv_displs);
  MPI_Request request = MPI_REQUEST_NULL;
  MOE_MPI_CHECK(MPI_Ialltoallv(send.data(), send_counts.data(), send_displs.data(), mpi_type<T>(),
                               recv.data(), recv_counts.data(), recv_displs.data(), mpi_type<T>(),
                               comm_, &request));
  return request;
}

void Comm::wait(MPI_Request& request) const {
  MOE_MPI_CHECK(MPI_Wait(&request, MPI_STATUS_IGNORE));
}

namespace {

void check_point_to_point(const char* what, size_t count, int peer, int tag, int size, int tag_ub) {
  if (count > static_cast<size_t>(INT_MAX) || peer < 0 || peer >= size || tag < 0 || tag > tag_ub) {
    throw std::invalid_argument(std::string("Comm::") + what + ": " + std::to_string(count) +
                                " elements, rank " + std::to_string(peer) + " of " +
                                std::to_string(size) + ", tag " + std::to_string(tag) +
                                " (at most " + std::to_string(tag_ub) + ")");
  }
}

}  // namespace

template <class T> MPI_Request Comm::isend(std::span<const T> data, int dest, int tag) const {
  check_point_to_point("isend", data.size(), dest, tag, size_, tag_ub_);
  MPI_Request request = MPI_REQUEST_NULL;
  MOE_MPI_CHECK(MPI_Isend(data.data(), static_cast<int>(data.size()), mpi_type<T>(), dest, tag,
                          comm_, &request));
  return request;
}

template <class T> MPI_Request Comm::irecv(std::span<T> data, int source, int tag) const {
  check_point_to_point("irecv", data.size(), source, tag, size_, tag_ub_);
  MPI_Request request = MPI_REQUEST_NULL;
  MOE_MPI_CHECK(MPI_Irecv(data.data(), static_cast<int>(data.size()), mpi_type<T>(), source, tag,
                          comm_, &request));
  return request;
}

void Comm::waitall(std::span<MPI_Request> requests) const {
  MOE_MPI_CHECK(
      MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE));
}

template <class T> void Comm::allgather(std::span<const T> send, std::span<T> recv) const {
  if (recv.size() != send.size() * size_) {
    throw std::invalid_argument("Comm::allgather: recv must hold size() times send");
  }
  MOE_MPI_CHECK(MPI_Allgather(send.data(), static_cast<int>(send.size()), mpi_type<T>(),
                              recv.data(), static_cast<int>(send.size()), mpi_type<T>(), comm_));
}

template <class T> void Comm::gather(std::span<const T> send, std::span<T> recv, int root) const {
  if (rank_ == root && recv.size() != send.size() * size_) {
    throw std::invalid_argument("Comm::gather: recv must hold size() times send on the root");
  }
  MOE_MPI_CHECK(MPI_Gather(send.data(), static_cast<int>(send.size()), mpi_type<T>(), recv.data(),
                           static_cast<int>(send.size()), mpi_type<T>(), root, comm_));
}

namespace {

// Where the tree over n >= 2 ranks splits: after the largest power of two below n (the split of
// model/tree_sum.hpp's tree over sequences, so that a rank's subtree is a node of it).
int tree_split_ranks(int n) {
  int half = 1;
  while (half * 2 < n) half *= 2;
  return half;
}

}  // namespace

template <class T> void Comm::allreduce_sum_tree(std::span<T> data, std::span<T> scratch) const {
  if (scratch.size() < data.size()) {
    throw std::invalid_argument("Comm::allreduce_sum_tree: scratch smaller than data");
  }
  const int count = static_cast<int>(data.size());
  // Walk down the tree to this rank's leaf, remembering the nodes on the way; then, leaf first,
  // at each node the right half's first rank sends its sum to the left half's first rank, which
  // adds it. Subtrees proceed independently; each rank sends at most once, to a lower rank.
  // The path has at most ceil(log2(size)) <= 31 nodes: a fixed array, so that the step loop
  // allocates nothing.
  int lo = 0, hi = size_;
  std::array<std::pair<int, int>, 32> path;  // (lo, mid) of each node above this rank's leaf
  int depth = 0;
  while (hi - lo > 1) {
    const int mid = lo + tree_split_ranks(hi - lo);
    path[depth++] = {lo, mid};
    if (rank_ < mid) {
      hi = mid;
    } else {
      lo = mid;
    }
  }
  for (int level = depth - 1; level >= 0; --level) {
    const auto [node_lo, mid] = path[level];
    if (rank_ == mid) {
      MOE_MPI_CHECK(MPI_Send(data.data(), count, mpi_type<T>(), node_lo, 0, comm_));
    } else if (rank_ == node_lo) {
      MOE_MPI_CHECK(
          MPI_Recv(scratch.data(), count, mpi_type<T>(), mid, 0, comm_, MPI_STATUS_IGNORE));
      for (int i = 0; i < count; ++i) data[i] += scratch[i];
    }
  }
  broadcast(data, 0);
}

namespace {

void check_blocks(const char* fn, int size, size_t n, std::span<const int> counts,
                  std::span<const int> displs) {
  if (counts.size() != static_cast<size_t>(size) || displs.size() != counts.size()) {
    throw std::invalid_argument(std::string(fn) + ": counts and displs need one entry per rank");
  }
  for (int r = 0; r < size; ++r) {
    if (counts[r] < 0 || displs[r] < 0 ||
        static_cast<size_t>(displs[r]) + static_cast<size_t>(counts[r]) > n) {
      throw std::invalid_argument(std::string(fn) + ": rank " + std::to_string(r) +
                                  "'s block lies outside the data");
    }
  }
}

}  // namespace

template <class T>
void Comm::reduce_scatter_tree(std::span<T> data, std::span<const int> counts,
                               std::span<const int> displs, std::span<T> scratch) const {
  check_blocks("Comm::reduce_scatter_tree", size_, data.size(), counts, displs);
  const size_t mine = static_cast<size_t>(counts[rank_]);
  if (scratch.size() < mine * size_) {
    throw std::invalid_argument("Comm::reduce_scatter_tree: scratch smaller than size() blocks");
  }
  // Rank q's share of this rank's block lands at scratch[q·mine]: the leaves of the tree over
  // ranks, which are then added in place as allreduce_sum_tree adds them (left += right at each
  // node, a range of n ranks split after the largest power of two below n).
  int* recv_counts = block_args_.data();
  int* recv_displs = recv_counts + size_;
  for (int q = 0; q < size_; ++q) {
    recv_counts[q] = static_cast<int>(mine);
    recv_displs[q] = static_cast<int>(mine * q);
  }
  MOE_MPI_CHECK(MPI_Alltoallv(data.data(), counts.data(), displs.data(), mpi_type<T>(),
                              scratch.data(), recv_counts, recv_displs, mpi_type<T>(), comm_));
  auto node = [&](auto&& self, int first, int n) -> void {
    if (n < 2) return;
    const int half = tree_split_ranks(n);
    self(self, first, half);
    self(self, first + half, n - half);
    T* left = scratch.data() + mine * first;
    const T* right = scratch.data() + mine * (first + half);
    for (size_t i = 0; i < mine; ++i) left[i] += right[i];
  };
  node(node, 0, size_);
  std::copy_n(scratch.data(), mine, data.data() + displs[rank_]);
}

template <class T>
void Comm::allgatherv_blocks(std::span<T> data, std::span<const int> counts,
                             std::span<const int> displs) const {
  check_blocks("Comm::allgatherv_blocks", size_, data.size(), counts, displs);
  MOE_MPI_CHECK(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data.data(), counts.data(),
                               displs.data(), mpi_type<T>(), comm_));
}

template <class T>
void Comm::gatherv(std::span<const T> send, std::span<T> recv, std::span<const int> counts,
                   std::span<const int> displs, int root) const {
  if (rank_ == root) {
    if (counts.size() != static_cast<size_t>(size_) || displs.size() != counts.size()) {
      throw std::invalid_argument("Comm::gatherv: counts and displs need one entry per rank");
    }
    for (int r = 0; r < size_; ++r) {
      if (counts[r] < 0 || displs[r] < 0 ||
          static_cast<size_t>(displs[r]) + static_cast<size_t>(counts[r]) > recv.size()) {
        throw std::invalid_argument("Comm::gatherv: rank " + std::to_string(r) +
                                    "'s block does not fit in recv");
      }
    }
  }
  MOE_MPI_CHECK(MPI_Gatherv(send.data(), static_cast<int>(send.size()), mpi_type<T>(), recv.data(),
                            counts.data(), displs.data(), mpi_type<T>(), root, comm_));
}

template <class T> void Comm::broadcast(std::span<T> data, int root) const {
  MOE_MPI_CHECK(MPI_Bcast(data.data(), static_cast<int>(data.size()), mpi_type<T>(), root, comm_));
}

void Comm::barrier() const {
  MOE_MPI_CHECK(MPI_Barrier(comm_));
}

#define MOE_COMM_INSTANTIATE(T)                                                                    \
  template void Comm::allreduce_sum<T>(std::span<T>) const;                                        \
  template void Comm::allreduce_max<T>(std::span<T>) const;                                        \
  template void Comm::allreduce_sum_tree<T>(std::span<T>, std::span<T>) const;                     \
  template void Comm::reduce_scatter_tree<T>(std::span<T>, std::span<const int>,                   \
                                             std::span<const int>, std::span<T>) const;            \
  template void Comm::allgatherv_blocks<T>(std::span<T>, std::span<const int>,                     \
                                           std::span<const int>) const;                            \
  template void Comm::alltoall<T>(std::span<const T>, std::span<T>) const;                         \
  template void Comm::alltoallv<T>(std::span<const T>, std::span<const int>, std::span<const int>, \
                                   std::span<T>, std::span<const int>, std::span<const int>)       \
      const;                                                                                       \
  template MPI_Request Comm::ialltoallv<T>(std::span<const T>, std::span<const int>,               \
                                           std::span<const int>, std::span<T>,                     \
                                           std::span<const int>, std::span<const int>) const;      \
  template MPI_Request Comm::isend<T>(std::span<const T>, int, int) const;                         \
  template MPI_Request Comm::irecv<T>(std::span<T>, int, int) const;                               \
  template void Comm::allgather<T>(std::span<const T>, std::span<T>) const;                        \
  template void Comm::gather<T>(std::span<const T>, std::span<T>, int) const;                      \
  template void Comm::gatherv<T>(std::span<const T>, std::span<T>, std::span<const int>,           \
                                 std::span<const int>, int) const;                                 \
  template void Comm::broadcast<T>(std::span<T>, int) const;
MOE_COMM_INSTANTIATE(float)
MOE_COMM_INSTANTIATE(double)
MOE_COMM_INSTANTIATE(int)
MOE_COMM_INSTANTIATE(int64_t)
MOE_COMM_INSTANTIATE(uint8_t)
MOE_COMM_INSTANTIATE(uint64_t)
#undef MOE_COMM_INSTANTIATE

}  // namespace moe
