// EpExchange: one point-to-point message per (peer, expert) block, or per pair when it is small.
// A new plan's counts go first by an all-to-all, or with its first dispatch's rows (Counts).
#include "comm/ep_exchange.hpp"

#include <algorithm>
#include <climits>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

namespace moe {

EpExchange::Counts EpExchange::counts_for_hosts(std::span<const int> ep_hosts) {
  for (int host : ep_hosts) {
    if (host != ep_hosts.front()) return Counts::kWithRows;
  }
  return Counts::kBeforeRows;
}

EpExchange::EpExchange(const Comm& ep, Counts counts, size_t whole_message_bytes)
    : ep_(ep),
      counts_(counts),
      whole_message_bytes_(whole_message_bytes),
      staging_(static_cast<size_t>(ep.size()) * whole_message_bytes) {}

// Tags, per EP communicator: dispatch's block messages 0..max_local-1 (the owner's local
// expert) and its whole-pair message max_local; combine's the same shifted by max_local + 1; the
// count messages 2·max_local + 2. So no message of one kind can match another kind's receive, and
// MPI's in-order delivery between a pair keeps one exchange's messages from matching the next's.
namespace {

int combine_tag_base(int max_local) {
  return max_local + 1;
}
int count_tag(int max_local) {
  return 2 * max_local + 2;
}

}  // namespace

void EpExchange::check_plan(const DispatchPlan& plan, long long rows, int D) const {
  if (plan.placement.ep_size != ep_.size() || plan.ep_rank != ep_.rank()) {
    throw std::invalid_argument("EpExchange: plan built for EP rank " +
                                std::to_string(plan.ep_rank) + " of " +
                                std::to_string(plan.placement.ep_size) + ", communicator is rank " +
                                std::to_string(ep_.rank()) + " of " + std::to_string(ep_.size()));
  }
  if (rows > INT_MAX / std::max(D, 1)) {
    throw std::overflow_error("EpExchange: " + std::to_string(rows) + " rows of width " +
                              std::to_string(D) + " exceed MPI's int element counts");
  }
  const int max_local = plan.placement.max_local();
  if (count_tag(max_local) > ep_.tag_upper_bound()) {
    throw std::overflow_error("EpExchange: " + std::to_string(max_local) +
                              " experts per rank need more message tags than MPI's " +
                              std::to_string(ep_.tag_upper_bound()));
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

// What one post() shares among its parts: the plan, the direction's tags, how each pair travels,
// and how much of the staging area its messages hold so far.
struct EpExchange::Posting {
  // The pair (this rank, peer) in this direction. On the source, its rows for the owner's experts
  // are one contiguous range of the send order; on the owner they are one block per local expert.
  // A pair whose rows are few (under whole_message_bytes), or in one block, travels as one
  // message: the owner sends it gathered from, or receives it into, its staging area and copies
  // the blocks out or in. Otherwise each block is a message of its own, straight from its place to
  // its place. Both ends decide alike: they hold the same counts.
  struct Pair {
    int source, owner;
    long long rows = 0;
    int blocks = 0;  // non-empty ones
    bool whole = true;
  };

  const DispatchPlan& plan;
  int P, me, max_local;
  bool to_experts;
  int tag_base;   // a block's message has tag_base + its local expert
  int whole_tag;  // a whole pair's message
  size_t Dz, row_bytes;
  size_t whole_message_bytes;
  size_t staged;  // bytes of staging_ in use

  Pair pair_of(int peer, bool i_am_owner) const {
    const ExpertPlacement& pl = plan.placement;
    Pair pr{i_am_owner ? peer : me, i_am_owner ? me : peer};
    const size_t base = static_cast<size_t>(i_am_owner ? peer : pr.owner) * max_local;
    for (int i = 0; i < pl.num_local(pr.owner); ++i) {
      const int rows =
          i_am_owner ? plan.recv_counts_by_source[base + i] : plan.count_message[base + i];
      pr.rows += rows;
      pr.blocks += rows > 0;
    }
    pr.whole = pr.blocks <= 1 || static_cast<double>(pr.rows) * row_bytes < whole_message_bytes;
    return pr;
  }
  // Block i of the pair: its rows, and its element offset on this rank.
  std::pair<int, size_t> block(const Pair& pr, bool i_am_owner, int i) const {
    if (i_am_owner) {
      const size_t b = static_cast<size_t>(pr.source) * max_local + i;
      return std::pair<int, size_t>(plan.recv_counts_by_source[b], Dz * plan.recv_block_offsets[b]);
    }
    const size_t b = static_cast<size_t>(pr.owner) * max_local + i;
    return std::pair<int, size_t>(plan.count_message[b], Dz * plan.send_block_offsets[b]);
  }
};

template <class T>
void EpExchange::post(Direction direction, std::span<const T> from, std::span<T> to,
                      const DispatchPlan& plan, int D, int parts) {
  const int P = ep_.size(), max_local = plan.placement.max_local();
  const size_t blocks = static_cast<size_t>(P) * max_local;
  if ((parts & (kReceives | kOwnBlocks)) != 0 && plan.recv_block_offsets.size() != blocks) {
    throw std::logic_error("EpExchange: the plan's receive side is not set (dispatch_counted)");
  }
  const bool to_experts = direction == Direction::kToExperts;
  const int tag_base = to_experts ? 0 : combine_tag_base(max_local);
  const size_t Dz = static_cast<size_t>(D);
  Posting posting{.plan = plan,
                  .P = P,
                  .me = ep_.rank(),
                  .max_local = max_local,
                  .to_experts = to_experts,
                  .tag_base = tag_base,
                  .whole_tag = tag_base + max_local,
                  .Dz = Dz,
                  .row_bytes = Dz * sizeof(T),
                  .whole_message_bytes = whole_message_bytes_,
                  .staged = 0};
  // Receives first, so that rows arriving early land in place.
  if ((parts & kReceives) != 0) post_receives(posting, to);
  if ((parts & kSends) != 0) post_sends(posting, from);
  if ((parts & kOwnBlocks) != 0) copy_own_blocks(posting, from, to);
}

// Peers in the order me ± 1, ± 2, ... so that no rank is every rank's first destination.
template <class T> void EpExchange::post_receives(Posting& posting, std::span<T> to) {
  const int P = posting.P, me = posting.me;
  for (int k = 1; k < P; ++k) post_pair<T>(posting, (me - k + P) % P, /*receive=*/true, {}, to);
}

template <class T> void EpExchange::post_sends(Posting& posting, std::span<const T> from) {
  const int P = posting.P, me = posting.me;
  for (int k = 1; k < P; ++k) post_pair<T>(posting, (me + k) % P, /*receive=*/false, from, {});
}

template <class T>
void EpExchange::post_pair(Posting& posting, int peer, bool receive, std::span<const T> from,
                           std::span<T> to) {
  const bool i_am_owner = posting.to_experts == receive;
  const Posting::Pair pr = posting.pair_of(peer, i_am_owner);
  if (pr.rows == 0) return;
  const int experts = posting.plan.placement.num_local(pr.owner);
  const size_t Dz = posting.Dz;
  if (!pr.whole) {
    for (int i = 0; i < experts; ++i) {
      const auto [rows, at] = posting.block(pr, i_am_owner, i);
      if (rows == 0) continue;
      const size_t n = Dz * rows;
      const int tag = posting.tag_base + i;
      pending_.push_back(receive ? ep_.irecv(to.subspan(at, n), peer, tag)
                                 : ep_.isend(from.subspan(at, n), peer, tag));
    }
    return;
  }
  const size_t n = Dz * pr.rows;
  const int whole_tag = posting.whole_tag;
  if (!i_am_owner || pr.blocks == 1) {  // one contiguous range on this rank
    size_t at = 0;
    for (int i = 0; i < experts; ++i) {
      const auto [rows, offset] = posting.block(pr, i_am_owner, i);
      if (rows > 0) {
        at = offset;
        break;
      }
    }
    pending_.push_back(receive ? ep_.irecv(to.subspan(at, n), peer, whole_tag)
                               : ep_.isend(from.subspan(at, n), peer, whole_tag));
    return;
  }
  // The owner's blocks through the staging area: gathered before the send, or copied out of it
  // once the receive completes (wait_pending).
  std::byte* staging = staging_.data();
  const size_t staged = posting.staged;
  std::span<T> area(reinterpret_cast<T*>(staging + staged), n);
  size_t offset = 0;
  for (int i = 0; i < experts; ++i) {
    const auto [rows, at] = posting.block(pr, i_am_owner, i);
    if (rows == 0) continue;  // an empty block's offset may be one past the buffer's end
    const size_t bytes = posting.row_bytes * rows;
    if (receive) {
      scatters_.push_back({staged + offset, reinterpret_cast<std::byte*>(&to[at]), bytes});
    } else {
      std::memcpy(staging + staged + offset, &from[at], bytes);
    }
    offset += bytes;
  }
  posting.staged += n * sizeof(T);
  pending_.push_back(receive ? ep_.irecv(area, peer, whole_tag)
                             : ep_.isend(std::span<const T>(area), peer, whole_tag));
}

// This rank's own blocks, while the messages travel.
template <class T>
void EpExchange::copy_own_blocks(const Posting& posting, std::span<const T> from, std::span<T> to) {
  const DispatchPlan& plan = posting.plan;
  const size_t Dz = posting.Dz;
  const bool to_experts = posting.to_experts;
  const int experts = plan.num_local_experts();
  size_t total = 0;
  for (int i = 0; i < experts; ++i) {
    total += plan.count_message[static_cast<size_t>(posting.me) * posting.max_local + i];
  }
  // The blocks are disjoint: on the rank's threads when there is enough to copy (at one rank this
  // is the whole dispatch).
#pragma omp parallel for schedule(dynamic) if (total * Dz * sizeof(T) >= kParallelCopyBytes)
  for (int i = 0; i < experts; ++i) {
    const size_t b = static_cast<size_t>(posting.me) * posting.max_local + i;
    const size_t send_at = Dz * plan.send_block_offsets[b],
                 expert_at = Dz * plan.recv_block_offsets[b];
    const size_t n = Dz * plan.count_message[b];
    if (n == 0) continue;
    std::memcpy(&to[to_experts ? expert_at : send_at], &from[to_experts ? send_at : expert_at],
                n * sizeof(T));
  }
}

template <class T>
void EpExchange::dispatch_counted_begin(std::vector<T>& expert_rows, std::span<const T> send_rows,
                                        DispatchPlan& plan, int D) {
  if (open_) throw std::logic_error("EpExchange: dispatch while another dispatch is open");
  check_plan(plan, plan.num_send(), D);
  check_rows<T>(send_rows, plan.num_send(), D, "dispatch send_rows");
  plan.recv_counts_by_source.resize(plan.count_message.size());
  if (counts_ == Counts::kBeforeRows) {
    ep_.alltoall(std::span<const int>(plan.count_message),
                 std::span<int>(plan.recv_counts_by_source));
    dispatch_plan_set_recv(plan, plan.recv_counts_by_source);
    check_plan(plan, plan.num_recv, D);
    expert_rows.resize(static_cast<size_t>(plan.num_recv) * D);
    post(Direction::kToExperts, send_rows, std::span<T>(expert_rows), plan, D, kAll);
    open_ = true;
    return;
  }
  const int P = ep_.size(), me = ep_.rank(), max_local = plan.placement.max_local();
  const int tag = count_tag(max_local);
  // The counts addressed to this rank, [P, max_local]: posted first, then this rank's counts and
  // rows go out to every peer, and the rows travel while the counts are awaited.
  std::span<int> counts(plan.recv_counts_by_source);
  const std::span<const int> message(plan.count_message);
  const size_t ml = static_cast<size_t>(max_local);
  count_requests_.clear();
  for (int k = 1; k < P; ++k) {
    const int source = (me - k + P) % P;
    count_requests_.push_back(ep_.irecv(counts.subspan(source * ml, ml), source, tag));
  }
  for (int k = 1; k < P; ++k) {
    const int dest = (me + k) % P;
    pending_.push_back(ep_.isend(message.subspan(dest * ml, ml), dest, tag));
  }
  std::copy_n(&message[me * ml], ml, &counts[me * ml]);
  post(Direction::kToExperts, send_rows, std::span<T>(), plan, D, kSends);
  open_ = true;  // from here on dispatch_end completes what was posted
  ep_.waitall(std::span<MPI_Request>(count_requests_));
  dispatch_plan_set_recv(plan, plan.recv_counts_by_source);
  check_plan(plan, plan.num_recv, D);
  expert_rows.resize(static_cast<size_t>(plan.num_recv) * D);
  post(Direction::kToExperts, send_rows, std::span<T>(expert_rows), plan, D,
       kReceives | kOwnBlocks);
}

template <class T>
void EpExchange::dispatch_counted(std::vector<T>& expert_rows, std::span<const T> send_rows,
                                  DispatchPlan& plan, int D) {
  dispatch_counted_begin(expert_rows, send_rows, plan, D);
  dispatch_end();
}

template <class T>
void EpExchange::dispatch(std::span<T> expert_rows, std::span<const T> send_rows,
                          const DispatchPlan& plan, int D) {
  dispatch_begin(expert_rows, send_rows, plan, D);
  dispatch_end();
}

template <class T>
void EpExchange::dispatch_begin(std::span<T> expert_rows, std::span<const T> send_rows,
                                const DispatchPlan& plan, int D) {
  if (open_) throw std::logic_error("EpExchange: dispatch_begin while another dispatch is open");
  check_sides<T>(plan, send_rows, expert_rows, D, "dispatch");
  post(Direction::kToExperts, send_rows, expert_rows, plan, D, kAll);
  open_ = true;
}

template <class T>
void EpExchange::check_sides(const DispatchPlan& plan, std::span<const T> send_rows,
                             std::span<const T> expert_rows, int D, const char* what) const {
  check_plan(plan, std::max(plan.num_send(), plan.num_recv), D);
  check_rows<T>(send_rows, plan.num_send(), D, (std::string(what) + " send_rows").c_str());
  check_rows<T>(expert_rows, plan.num_recv, D, (std::string(what) + " expert_rows").c_str());
}

void EpExchange::dispatch_end() {
  if (!open_) throw std::logic_error("EpExchange: dispatch_end without dispatch_begin");
  open_ = false;
  wait_pending();
}

void EpExchange::wait_pending() {
  ep_.waitall(std::span<MPI_Request>(pending_));
  pending_.clear();
  for (const Scatter& c : scatters_) std::memcpy(c.to, staging_.data() + c.from, c.bytes);
  scatters_.clear();
}

template <class T>
void EpExchange::combine(std::span<T> send_rows, std::span<const T> expert_rows,
                         const DispatchPlan& plan, int D) {
  if (open_) throw std::logic_error("EpExchange: combine while a dispatch is open");
  check_sides<T>(plan, send_rows, expert_rows, D, "combine");
  post(Direction::kToSources, expert_rows, send_rows, plan, D, kAll);
  wait_pending();
}

void EpExchange::dispatch_counted_alone(DispatchPlan& plan, int D) {
  if (ep_.size() > 1) {
    throw std::logic_error("EpExchange: dispatch_counted_alone in an EP group of " +
                           std::to_string(ep_.size()) + " ranks");
  }
  if (open_) throw std::logic_error("EpExchange: dispatch while another dispatch is open");
  check_plan(plan, plan.num_send(), D);
  plan.recv_counts_by_source = plan.count_message;  // the all-to-all of one rank
  dispatch_plan_set_recv(plan, plan.recv_counts_by_source);
  check_plan(plan, plan.num_recv, D);
}

template void EpExchange::dispatch_counted_begin<float>(std::vector<float>&, std::span<const float>,
                                                        DispatchPlan&, int);
template void EpExchange::dispatch_counted_begin<double>(std::vector<double>&,
                                                         std::span<const double>, DispatchPlan&,
                                                         int);
template void EpExchange::dispatch_counted<float>(std::vector<float>&, std::span<const float>,
                                                  DispatchPlan&, int);
template void EpExchange::dispatch_counted<double>(std::vector<double>&, std::span<const double>,
                                                   DispatchPlan&, int);
template void EpExchange::dispatch<float>(std::span<float>, std::span<const float>,
                                          const DispatchPlan&, int);
template void EpExchange::dispatch<double>(std::span<double>, std::span<const double>,
                                           const DispatchPlan&, int);
template void EpExchange::dispatch_begin<float>(std::span<float>, std::span<const float>,
                                                const DispatchPlan&, int);
template void EpExchange::dispatch_begin<double>(std::span<double>, std::span<const double>,
                                                 const DispatchPlan&, int);
template void EpExchange::combine<float>(std::span<float>, std::span<const float>,
                                         const DispatchPlan&, int);
template void EpExchange::combine<double>(std::span<double>, std::span<const double>,
                                          const DispatchPlan&, int);

}  // namespace moe
