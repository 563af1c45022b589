// EpExchange: count all-to-all, then row all-to-all-v plus the plan's local permutation.
#include "comm/ep_exchange.hpp"

#include <algorithm>
#include <climits>
#include <cstring>
#include <stdexcept>
#include <string>

namespace moe {

EpExchange::EpExchange(const Comm& ep) : ep_(ep) {}

void EpExchange::exchange_counts(DispatchPlan& plan) {
  if (plan.placement.ep_size != ep_.size() || plan.ep_rank != ep_.rank()) {
    throw std::invalid_argument("EpExchange: plan built for EP rank " +
                                std::to_string(plan.ep_rank) + " of " +
                                std::to_string(plan.placement.ep_size) + ", communicator is rank " +
                                std::to_string(ep_.rank()) + " of " + std::to_string(ep_.size()));
  }
  plan.recv_counts_by_source.resize(plan.count_message.size());
  ep_.alltoall(std::span<const int>(plan.count_message),
               std::span<int>(plan.recv_counts_by_source));
  dispatch_plan_set_recv(plan, plan.recv_counts_by_source);
}

void EpExchange::scale_counts(const DispatchPlan& plan, int D) {
  const int P = ep_.size();
  const long long max_rows = std::max(plan.num_send(), plan.num_recv);
  if (max_rows * D > INT_MAX) {
    throw std::overflow_error("EpExchange: " + std::to_string(max_rows) + " rows of width " +
                              std::to_string(D) + " exceed MPI's int element counts");
  }
  send_elems_.resize(P);
  send_displs_.resize(P);
  recv_elems_.resize(P);
  recv_displs_.resize(P);
  for (int r = 0; r < P; ++r) {
    send_elems_[r] = plan.send_counts[r] * D;
    send_displs_[r] = plan.send_offsets[r] * D;
    recv_elems_[r] = plan.recv_counts[r] * D;
    recv_displs_[r] = plan.recv_offsets[r] * D;
  }
}

namespace {

template <class T>
void check_rows(std::span<const T> rows, long long num_rows, int D, const char* what) {
  if (static_cast<long long>(rows.size()) < num_rows * D) {
    throw std::invalid_argument(std::string("EpExchange: ") + what + " holds " +
                                std::to_string(rows.size()) + " elements, needs " +
                                std::to_string(num_rows) + " rows of " + std::to_string(D));
  }
}

}  // namespace

template <class T>
void EpExchange::dispatch(std::span<T> expert_rows, std::span<T> staging,
                          std::span<const T> send_rows, const DispatchPlan& plan, int D) {
  dispatch_begin(expert_rows, staging, send_rows, plan, D);
  dispatch_end(expert_rows, std::span<const T>(staging), plan, D);
}

template <class T>
void EpExchange::dispatch_begin(std::span<T> expert_rows, std::span<T> staging,
                                std::span<const T> send_rows, const DispatchPlan& plan, int D) {
  if (pending_ != MPI_REQUEST_NULL) {
    throw std::logic_error("EpExchange: dispatch_begin while another dispatch is open");
  }
  std::span<T> arrival = plan.recv_identity ? expert_rows : staging;
  check_rows<T>(send_rows, plan.num_send(), D, "dispatch send_rows");
  check_rows<T>(arrival, plan.num_recv, D, "dispatch receive buffer");
  scale_counts(plan, D);
  // Send rows are already destination-major (the plan's send order), so they go as they are.
  pending_ = ep_.ialltoallv(send_rows, std::span<const int>(send_elems_),
                            std::span<const int>(send_displs_), arrival,
                            std::span<const int>(recv_elems_), std::span<const int>(recv_displs_));
}

template <class T>
void EpExchange::dispatch_end(std::span<T> expert_rows, std::span<const T> staging,
                              const DispatchPlan& plan, int D) {
  if (pending_ == MPI_REQUEST_NULL) {
    throw std::logic_error("EpExchange: dispatch_end without dispatch_begin");
  }
  ep_.wait(pending_);
  if (plan.recv_identity) return;  // received in place
  check_rows<T>(expert_rows, plan.num_recv, D, "dispatch expert_rows");
  const size_t row_bytes = sizeof(T) * D;
  for (int r = 0; r < plan.num_recv; ++r) {
    std::memcpy(&expert_rows[static_cast<size_t>(plan.recv_to_expert[r]) * D],
                &staging[static_cast<size_t>(r) * D], row_bytes);
  }
}

template <class T>
void EpExchange::combine(std::span<T> send_rows, std::span<T> staging,
                         std::span<const T> expert_rows, const DispatchPlan& plan, int D) {
  check_rows<T>(send_rows, plan.num_send(), D, "combine send_rows");
  check_rows<T>(expert_rows, plan.num_recv, D, "combine expert_rows");
  scale_counts(plan, D);
  // The inverse of dispatch: expert-major back to source-major (nothing to do when the orders
  // coincide), then the reverse all-to-all-v.
  std::span<const T> departure = expert_rows;
  if (!plan.recv_identity) {
    check_rows<T>(staging, plan.num_recv, D, "combine staging");
    const size_t row_bytes = sizeof(T) * D;
    for (int r = 0; r < plan.num_recv; ++r) {
      std::memcpy(&staging[static_cast<size_t>(r) * D],
                  &expert_rows[static_cast<size_t>(plan.recv_to_expert[r]) * D], row_bytes);
    }
    departure = staging;
  }
  ep_.alltoallv(departure, std::span<const int>(recv_elems_), std::span<const int>(recv_displs_),
                send_rows, std::span<const int>(send_elems_), std::span<const int>(send_displs_));
}

template void EpExchange::dispatch<float>(std::span<float>, std::span<float>,
                                          std::span<const float>, const DispatchPlan&, int);
template void EpExchange::dispatch<double>(std::span<double>, std::span<double>,
                                           std::span<const double>, const DispatchPlan&, int);
template void EpExchange::dispatch_begin<float>(std::span<float>, std::span<float>,
                                                std::span<const float>, const DispatchPlan&, int);
template void EpExchange::dispatch_begin<double>(std::span<double>, std::span<double>,
                                                 std::span<const double>, const DispatchPlan&, int);
template void EpExchange::dispatch_end<float>(std::span<float>, std::span<const float>,
                                              const DispatchPlan&, int);
template void EpExchange::dispatch_end<double>(std::span<double>, std::span<const double>,
                                               const DispatchPlan&, int);
template void EpExchange::combine<float>(std::span<float>, std::span<float>, std::span<const float>,
                                         const DispatchPlan&, int);
template void EpExchange::combine<double>(std::span<double>, std::span<double>,
                                          std::span<const double>, const DispatchPlan&, int);

}  // namespace moe
