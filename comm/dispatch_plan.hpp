// The dispatch plan of expert parallelism (docs/architecture.md): a pure function from one rank's
// routing (`[T, K]` global expert ids) and the expert placement to everything the token exchange
// needs. Dispatch, combine and both backward passes take the same plan, so the directions cannot
// drift.
//
// Legend: T local tokens, K experts per token, E experts, P EP group size, E_loc experts owned by
// this rank, R rows this rank receives. An "assignment" is one (token, slot) pair a = t·K + j.
//
// Send order: assignments sorted by their expert's slot in the placement (destination rank, then
// local expert), ties by assignment index: destination-major, then local expert, then token order.
// Receive order (the "expert-major" layout handed to the experts): local expert, then source rank,
// then the source's token order. A "block" is the rows of one source for one expert: contiguous
// in the source's send order and in the owner's expert-major order alike, so the exchange moves
// each block straight from its send position to its expert-major position, with no permutation.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace moe {

// Which EP rank holds which experts. By default experts [0, E) lie in contiguous blocks over P
// ranks, as equal as possible: the first E mod P ranks own one expert more than the others. Any
// other assignment (--expert-placement) may be given as each rank's list of experts: counts may be
// uneven, every rank holds at least one expert, every expert is on at least one rank. An expert on
// several ranks is replicated (the redundant experts of DeepSeek's EPLB): each replica holds its
// own copy of the weights and optimizer state, and a source sends the expert's rows of each of its
// sequences to one replica, chosen by the sequence (replica_for), so the weight gradients still
// add along the one tree over the sequences (model/expert_grads.hpp).
//
// An "instance" is one (rank, expert) pair. A rank's instances are in ascending global id, so
// "local expert i of rank q" names one expert however the placement was written; slots number the
// instances rank-major, and the dispatch sends in slot order.
class ExpertPlacement {
 public:
  ExpertPlacement() : ExpertPlacement(1, 1) {}
  // The contiguous layout. Throws std::invalid_argument unless 1 <= P <= E.
  ExpertPlacement(int num_experts, int ep_size);
  // Rank q holds the experts of ranks[q]. Throws std::invalid_argument naming the problem: a rank
  // with no expert, an id outside [0, E), an expert twice on one rank, an expert on no rank.
  ExpertPlacement(int num_experts, const std::vector<std::vector<int>>& ranks);

  int num_experts = 1;  // E
  int ep_size = 1;      // P

  int num_instances() const { return static_cast<int>(experts_.size()); }
  int num_local(int ep_rank) const { return rank_first_[ep_rank + 1] - rank_first_[ep_rank]; }
  int max_local() const { return max_local_; }
  // Global id of rank q's local expert i; the slot of that instance.
  int expert(int ep_rank, int i) const { return experts_[rank_first_[ep_rank] + i]; }
  int slot_of(int ep_rank, int i) const { return rank_first_[ep_rank] + i; }
  int expert_at_slot(int slot) const { return experts_[slot]; }
  int rank_of_slot(int slot) const { return slot_rank_[slot]; }
  int local_of_slot(int slot) const { return slot - rank_first_[slot_rank_[slot]]; }

  // The ranks holding expert e, in rank order: replica j is at slot replica_slot(e, j).
  int num_replicas(int expert) const { return replica_first_[expert + 1] - replica_first_[expert]; }
  int replica_slot(int expert, int j) const { return replica_slots_[replica_first_[expert] + j]; }
  // Which replica of its expert the instance in `slot` is (0 for an expert on one rank).
  int replica_of_slot(int slot) const { return slot_replica_[slot]; }
  bool has_replicas() const { return num_instances() > num_experts; }
  // The first holder of an expert, and the expert's index among that rank's local experts: where
  // the expert is counted once (the gradient norm, the parameter digest, a checkpoint's tensor).
  int owner(int expert) const { return rank_of_slot(replica_slot(expert, 0)); }
  int local_index(int expert) const { return local_of_slot(replica_slot(expert, 0)); }

  // Which replica of `expert` takes the rows of sequence `seq` of the EP group's `num_seqs`: the
  // sequences in contiguous chunks, replica j taking replica_chunk(j, k, num_seqs).
  int replica_for(int expert, int seq, int num_seqs) const {
    return static_cast<int>(static_cast<int64_t>(seq) * num_replicas(expert) / num_seqs);
  }
  // The sequences [first, end) of the EP group's n that replica j of k takes: [⌈j·n/k⌉,
  // ⌈(j+1)·n/k⌉).
  static std::pair<int, int> replica_chunk(int j, int k, int n) {
    const auto bound = [&](int i) {
      return static_cast<int>((static_cast<int64_t>(i) * n + k - 1) / k);
    };
    return {bound(j), bound(j + 1)};
  }
  bool is_contiguous() const;

  friend bool operator==(const ExpertPlacement& a, const ExpertPlacement& b) {
    return a.num_experts == b.num_experts && a.ep_size == b.ep_size && a.experts_ == b.experts_ &&
           a.rank_first_ == b.rank_first_;
  }

 private:
  void index_replicas();  // replica_first_ and replica_slots_ from experts_ and slot_rank_

  std::vector<int> experts_;        // [I] global id of each instance, rank-major, ascending
  std::vector<int> rank_first_;     // [P + 1] rank q's instances: slots [rank_first_[q], ..)
  std::vector<int> slot_rank_;      // [I] the rank of each instance
  std::vector<int> replica_first_;  // [E + 1] expert e's replicas: replica_slots_[first ..)
  std::vector<int> replica_slots_;  // [I] the slots of each expert's replicas, in rank order
  std::vector<int> slot_replica_;   // [I] the inverse: which replica each instance is
  int max_local_ = 1;
};

struct DispatchPlan {
  int num_tokens = 0;         // T
  int top_k = 0;              // K
  int ep_rank = 0;            // this rank within the EP group
  ExpertPlacement placement;  // E, P

  // ---- send side: this rank as the source of its tokens ----
  std::vector<int32_t> send_assignment;  // [sent] assignment a = t·K + j at each send position
  std::vector<int32_t> send_position;    // [T·K] inverse: send position of assignment a (−1:
                                         //   dropped, not sent)
  int num_sent = 0;                      // assignments sent: T·K less those dropped
  std::vector<int> send_counts;          // [P] rows to each EP rank
  std::vector<int> send_offsets;         // [P] first send position for each EP rank
  std::vector<int64_t> expert_counts;    // [E] local assignments per global expert (local load)
  std::vector<int> slot_counts;          // [I] local assignments per instance (replica)
  std::vector<int32_t> send_slot;  // [T·K] the instance each assignment goes to (−1: dropped)
  std::vector<int> count_message;  // [P, max_local] per-(destination, its local expert)
  std::vector<int> send_block_offsets;  // [P, max_local] first send position of each such block

  // ---- receive side: this rank as the owner of experts; set by dispatch_plan_set_recv ----
  std::vector<int> recv_counts_by_source;  // [P, max_local] rows from each source for each expert
  std::vector<int> recv_counts;            // [P] rows from each source
  std::vector<int> recv_offsets;           // [P] first row of each source, source-major
  std::vector<int> expert_offsets;         // [E_loc + 1] row ranges per local expert, expert-major
  std::vector<int> recv_block_offsets;     // [P, max_local] expert-major row of each source's block
  int num_recv = 0;                        // R

  std::vector<int> expert_cursor;  // scratch for the counting sorts, kept to avoid reallocation

  int num_send() const { return num_sent; }
  int num_local_experts() const { return placement.num_local(ep_rank); }
};

// Fills the send side of `plan` from `expert_idx` ([T, K], every id in [0, E), or −1 for an
// assignment a token capacity dropped: it is not sent, model/capacity.hpp). The T tokens are
// sequences of `seq_len` (0: one sequence), every rank of the EP group holding as many: a
// replicated expert's rows go to the replica of their sequence (ExpertPlacement::replica_for).
// Reuses the plan's vectors, so a plan built once at full size never allocates again. Throws
// std::invalid_argument on an out-of-range expert id, tokens that are not whole sequences, or a
// bad placement.
void dispatch_plan_build(DispatchPlan& plan, std::span<const int32_t> expert_idx, int num_tokens,
                         int top_k, const ExpertPlacement& placement, int ep_rank, int seq_len = 0);

// Fills the receive side from the count messages this rank received: `counts_from_sources` is
// [P, max_local], row s being source s's count_message block addressed to this rank.
void dispatch_plan_set_recv(DispatchPlan& plan, std::span<const int> counts_from_sources);

// Rows of the plan's send side that leave this rank's host: the send counts of every EP rank whose
// host differs from this rank's. `ep_hosts` [P] is the host of each EP rank of the group
// (ParallelGroups::ep_hosts). Throws std::invalid_argument when it has not P entries.
int64_t dispatch_plan_cross_host_rows(const DispatchPlan& plan, std::span<const int> ep_hosts);

// The token copies that cross hosts when each token goes once to each host holding one of its
// experts (and on to the experts' ranks inside that host, as DeepSeek-V3's dispatch does): per
// token of `expert_idx` ([T, K]), the number of hosts other than this rank's holding one of its K
// experts. Node-limited routing (at most M hosts per token) bounds it by M per token; the rows of
// dispatch_plan_cross_host_rows count each (token, slot) instead. Throws std::invalid_argument on
// sizes that do not fit.
int64_t dispatch_cross_host_tokens(std::span<const int32_t> expert_idx, int top_k,
                                   const ExpertPlacement& placement, int ep_rank,
                                   std::span<const int> ep_hosts);
// The same for the plan's routing, each assignment counted at the rank it is sent to: with
// replicas, the replica its sequence goes to (dispatch_cross_host_tokens takes each expert's
// first holder).
int64_t dispatch_plan_cross_host_tokens(const DispatchPlan& plan, std::span<const int> ep_hosts);

}  // namespace moe
