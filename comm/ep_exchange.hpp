// The token exchange of expert parallelism: rows move between the ranks of an EP group as the
// dispatch plan says. Two directions only, used four times per MoE layer:
//   dispatch (source -> expert owner): forward input rows, backward output-gradient rows;
//   combine  (expert owner -> source): forward expert outputs, backward input-gradient rows.
// Legend: D row width, T·K send rows in the plan's send order, R received rows expert-major.
#pragma once

#include <span>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/dispatch_plan.hpp"

namespace moe {

class EpExchange {
 public:
  explicit EpExchange(const Comm& ep);

  // All-to-all of the plan's per-(destination, expert) counts, then the plan's receive side.
  void exchange_counts(DispatchPlan& plan);

  // send_rows [T·K, D] in send order -> expert_rows [R, D] expert-major.
  // staging [R, D] holds the rows source-major as MPI delivers them.
  template <class T>
  void dispatch(std::span<T> expert_rows, std::span<T> staging, std::span<const T> send_rows,
                const DispatchPlan& plan, int D);

  // dispatch in two halves, so that computation can overlap the all-to-all: begin posts it
  // (send_rows, staging and expert_rows must stay untouched), end waits and permutes into
  // expert_rows. When the arrival order already is expert-major (plan.recv_identity), rows are
  // received straight into expert_rows and staging is not used.
  template <class T>
  void dispatch_begin(std::span<T> expert_rows, std::span<T> staging, std::span<const T> send_rows,
                      const DispatchPlan& plan, int D);
  template <class T>
  void dispatch_end(std::span<T> expert_rows, std::span<const T> staging, const DispatchPlan& plan,
                    int D);

  // expert_rows [R, D] expert-major -> send_rows [T·K, D] in send order, back on their source.
  template <class T>
  void combine(std::span<T> send_rows, std::span<T> staging, std::span<const T> expert_rows,
               const DispatchPlan& plan, int D);

  const Comm& comm() const { return ep_; }

 private:
  // Row counts and offsets scaled to elements of width D, checked against int overflow.
  void scale_counts(const DispatchPlan& plan, int D);

  const Comm& ep_;
  MPI_Request pending_ = MPI_REQUEST_NULL;                                // an open dispatch_begin
  std::vector<int> send_elems_, send_displs_, recv_elems_, recv_displs_;  // [P] each
};

}  // namespace moe
