// The token exchange of expert parallelism: rows move between the ranks of an EP group as the
// dispatch plan says. Two directions only, used four times per MoE layer:
//   dispatch (source -> expert owner): forward input rows, backward output-gradient rows;
//   combine  (expert owner -> source): forward expert outputs, backward input-gradient rows.
// Each block (one source's rows for one expert) is contiguous on both sides
// (comm/dispatch_plan.hpp), so it travels as one point-to-point message from its send position
// straight to its expert-major position and back, with no row permutation. A pair of ranks with
// few rows between them (under whole_message_bytes) exchanges them as one message instead, which
// the owner copies block by block out of or into a small staging area: at that size a copy costs
// less than a message. A rank's blocks for its own experts are copied. An EP group of one rank
// makes no exchange (dispatch_counted_alone): its send order is the expert-major order.
//
// Legend: D row width, T·K send rows in the plan's send order, R received rows expert-major.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/dispatch_plan.hpp"

namespace moe {

class EpExchange {
 public:
  // Pairs with fewer bytes than this go as one message (64 KiB: about where a copy costs as much
  // as a message's overhead; docs/performance.md).
  static constexpr size_t kWholeMessageBytes = 64 * 1024;
  // The rank's own blocks are copied on its OpenMP threads from this many bytes on.
  static constexpr size_t kParallelCopyBytes = 256 * 1024;

  // How a new plan's counts reach the experts' owners. kBeforeRows: an all-to-all of the counts,
  // then every receive is posted before any row is sent; best within a host, where a message
  // costs about a microsecond and rows that arrive before their receive cost extra copies and
  // hand-shakes. kWithRows: each peer gets its counts and its rows at once, one network latency
  // fewer per MoE layer (a small round trip takes two one-way delays instead of three, as the
  // bare MPI_Alltoallv pair does: docs/cluster.md); best when the EP group spans hosts.
  enum class Counts { kBeforeRows, kWithRows };
  // kWithRows when the EP ranks' hosts (ParallelGroups::ep_hosts) are not all the same.
  static Counts counts_for_hosts(std::span<const int> ep_hosts);

  // Every rank of the EP group must pass the same `counts` and `whole_message_bytes`: both ends
  // of a pair decide its message form from them.
  explicit EpExchange(const Comm& ep, Counts counts = Counts::kBeforeRows,
                      size_t whole_message_bytes = kWholeMessageBytes);

  // The first dispatch of a freshly built plan, whose receive side is not known yet: exchanges
  // the plan's counts (as `Counts` says), sets its receive side (dispatch_plan_set_recv), makes
  // expert_rows [R, D] and posts the rows' messages. send_rows [T·K, D] in send order ->
  // expert_rows expert-major; dispatch_end completes it. It returns once the counts are in (with
  // kWithRows: once every peer's count message has arrived), so work between it and
  // dispatch_end overlaps the rows' transfer only. The plan's other exchanges (combine, the
  // backward pass) take dispatch_begin and combine.
  template <class T>
  void dispatch_counted_begin(std::vector<T>& expert_rows, std::span<const T> send_rows,
                              DispatchPlan& plan, int D);
  template <class T>
  void dispatch_counted(std::vector<T>& expert_rows, std::span<const T> send_rows,
                        DispatchPlan& plan, int D);

  // A dispatch on a plan whose receive side is set: send_rows [T·K, D] in send order ->
  // expert_rows [R, D] expert-major.
  template <class T>
  void dispatch(std::span<T> expert_rows, std::span<const T> send_rows, const DispatchPlan& plan,
                int D);

  // dispatch in two halves, so that computation can overlap the transfer: begin posts every
  // message's receive and send and copies this rank's own blocks; end waits for the messages.
  // send_rows and expert_rows must stay alive and untouched in between.
  template <class T>
  void dispatch_begin(std::span<T> expert_rows, std::span<const T> send_rows,
                      const DispatchPlan& plan, int D);
  void dispatch_end();

  // expert_rows [R, D] expert-major -> send_rows [T·K, D] in send order, back on their source.
  template <class T>
  void combine(std::span<T> send_rows, std::span<const T> expert_rows, const DispatchPlan& plan,
               int D);

  // What dispatch_counted_begin does to the plan when this rank is its whole EP group, without
  // moving a row: it sets the plan's receive side, where expert row p is send position p, so
  // that the caller reads each row where it lies (model/moe_layer.cpp). std::logic_error on a
  // larger group.
  void dispatch_counted_alone(DispatchPlan& plan, int D);

  const Comm& comm() const { return ep_; }

 private:
  enum class Direction { kToExperts, kToSources };

  // What post() does, in this order: post the receives, post the sends, copy this rank's own
  // blocks.
  enum Parts { kReceives = 1, kSends = 2, kOwnBlocks = 4, kAll = 7 };

  // Posts one direction's messages into pending_ (a pair's blocks, or its whole rows as one
  // message) and copies the rank's own blocks, as `parts` says, through the three functions
  // below. Sends need only the plan's send side; receives and own blocks need its receive side.
  template <class T>
  void post(Direction direction, std::span<const T> from, std::span<T> to, const DispatchPlan& plan,
            int D, int parts);
  // What one post() shares among its parts (defined in ep_exchange.cpp).
  struct Posting;
  // Posts the receive of every peer's rows into `to`, or into staging_ (then scatters_ says where
  // they go).
  template <class T> void post_receives(Posting& posting, std::span<T> to);
  // Posts the send of `from`'s rows to every peer, an owner's small pairs gathered into staging_.
  template <class T> void post_sends(Posting& posting, std::span<const T> from);
  // The messages of one pair (this rank, peer) for post_receives (`receive`) or post_sends: one
  // per block, or the whole pair as one, an owner's staged at posting.staged in staging_.
  template <class T>
  void post_pair(Posting& posting, int peer, bool receive, std::span<const T> from,
                 std::span<T> to);
  // Copies this rank's rows for its own experts from `from` to `to`: no message.
  template <class T>
  void copy_own_blocks(const Posting& posting, std::span<const T> from, std::span<T> to);
  // The plan was built for this EP group, its rows fit MPI's int counts, and its tags MPI's.
  void check_plan(const DispatchPlan& plan, long long rows, int D) const;
  // check_plan for both sides, and that each side's rows fit (`what`: "dispatch" or "combine").
  template <class T>
  void check_sides(const DispatchPlan& plan, std::span<const T> send_rows,
                   std::span<const T> expert_rows, int D, const char* what) const;

  // Completes the posted messages.
  void wait_pending();

  struct Scatter {  // a block received into the staging area, to copy out after the wait
    size_t from;    // byte offset in staging_
    std::byte* to;
    size_t bytes;
  };

  const Comm& ep_;
  Counts counts_;
  size_t whole_message_bytes_;
  std::vector<std::byte> staging_;           // [P · whole_message_bytes] bytes
  std::vector<MPI_Request> pending_;         // posted messages not yet complete
  std::vector<MPI_Request> count_requests_;  // dispatch_counted_begin's count receives
  std::vector<Scatter> scatters_;            // of the posted receives
  bool open_ = false;                        // between dispatch_begin and dispatch_end
};

}  // namespace moe
