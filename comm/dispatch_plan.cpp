// Dispatch plan construction: counting sorts over expert ids, no communication.
#include "comm/dispatch_plan.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace moe {

ExpertPlacement::ExpertPlacement(int num_experts_in, int ep_size_in)
    : num_experts(num_experts_in), ep_size(ep_size_in) {
  if (ep_size < 1 || num_experts < ep_size) {
    throw std::invalid_argument("expert placement: " + std::to_string(num_experts) +
                                " experts cannot be placed on " + std::to_string(ep_size) +
                                " ranks (every rank holds at least one)");
  }
  const int base = num_experts / ep_size, extra = num_experts % ep_size;
  experts_.resize(num_experts);
  slot_rank_.resize(num_experts);
  rank_first_.assign(ep_size + 1, 0);
  for (int q = 0; q < ep_size; ++q) {
    rank_first_[q + 1] = rank_first_[q] + base + (q < extra ? 1 : 0);
    for (int e = rank_first_[q]; e < rank_first_[q + 1]; ++e) slot_rank_[e] = q;
  }
  for (int e = 0; e < num_experts; ++e) experts_[e] = e;
  max_local_ = base + (extra > 0 ? 1 : 0);
  index_replicas();
}

ExpertPlacement::ExpertPlacement(int num_experts_in, const std::vector<std::vector<int>>& ranks)
    : num_experts(num_experts_in), ep_size(static_cast<int>(ranks.size())) {
  if (ep_size < 1 || num_experts < 1) {
    throw std::invalid_argument("expert placement: no ranks or no experts");
  }
  rank_first_.assign(ep_size + 1, 0);
  experts_.clear();
  slot_rank_.clear();
  max_local_ = 0;
  for (int q = 0; q < ep_size; ++q) {
    std::vector<int> held = ranks[q];
    if (held.empty()) {
      throw std::invalid_argument("rank " + std::to_string(q) + " holds no expert");
    }
    std::sort(held.begin(), held.end());
    for (size_t i = 0; i < held.size(); ++i) {
      const int e = held[i];
      if (e < 0 || e >= num_experts) {
        throw std::invalid_argument("rank " + std::to_string(q) + ": expert " + std::to_string(e) +
                                    " outside [0, " + std::to_string(num_experts) + ")");
      }
      if (i > 0 && held[i - 1] == e) {
        throw std::invalid_argument("rank " + std::to_string(q) + " lists expert " +
                                    std::to_string(e) + " twice");
      }
      experts_.push_back(e);
      slot_rank_.push_back(q);
    }
    rank_first_[q + 1] = static_cast<int>(experts_.size());
    max_local_ = std::max(max_local_, static_cast<int>(held.size()));
  }
  index_replicas();
  for (int e = 0; e < num_experts; ++e) {
    if (num_replicas(e) == 0) {
      throw std::invalid_argument("expert " + std::to_string(e) + " is on no rank");
    }
  }
}

void ExpertPlacement::index_replicas() {
  // A counting sort of the slots by expert, stable in slot order, hence in rank order.
  replica_first_.assign(num_experts + 1, 0);
  for (const int e : experts_) ++replica_first_[e + 1];
  for (int e = 0; e < num_experts; ++e) replica_first_[e + 1] += replica_first_[e];
  replica_slots_.resize(experts_.size());
  slot_replica_.resize(experts_.size());
  std::vector<int> next(replica_first_.begin(), replica_first_.end() - 1);
  for (int slot = 0; slot < num_instances(); ++slot) {
    const int e = experts_[slot];
    slot_replica_[slot] = next[e] - replica_first_[e];
    replica_slots_[next[e]++] = slot;
  }
}

bool ExpertPlacement::is_contiguous() const {
  return !has_replicas() && ep_size <= num_experts &&
         *this == ExpertPlacement(num_experts, ep_size);
}

void dispatch_plan_build(DispatchPlan& plan, std::span<const int32_t> expert_idx, int num_tokens,
                         int top_k, const ExpertPlacement& placement, int ep_rank, int seq_len) {
  const int E = placement.num_experts, P = placement.ep_size;
  if (ep_rank < 0 || ep_rank >= P) {
    throw std::invalid_argument("dispatch_plan_build: placement of " + std::to_string(E) +
                                " experts on " + std::to_string(P) + " ranks (rank " +
                                std::to_string(ep_rank) + ") is impossible");
  }
  const int num_send = num_tokens * top_k;
  if (expert_idx.size() != static_cast<size_t>(num_send)) {
    throw std::invalid_argument("dispatch_plan_build: routing holds " +
                                std::to_string(expert_idx.size()) +
                                " ids, expected T*K = " + std::to_string(num_send));
  }
  plan.num_tokens = num_tokens;
  plan.top_k = top_k;
  plan.ep_rank = ep_rank;
  plan.placement = placement;
  // The receive side belongs to the previous routing: unset until the new counts are exchanged.
  plan.recv_block_offsets.clear();
  plan.num_recv = 0;

  // The slot of each assignment: its expert's instance, the replica its sequence goes to (this
  // rank's sequence b is the EP group's ep_rank·Bs + b). Then a counting sort by slot (destination
  // rank, then local expert), stable in the assignment index.
  const int S = seq_len > 0 ? seq_len : std::max(num_tokens, 1);
  if (num_tokens % S != 0) {
    throw std::invalid_argument("dispatch_plan_build: " + std::to_string(num_tokens) +
                                " tokens are not whole sequences of " + std::to_string(S));
  }
  const int Bs = num_tokens / S, group_seqs = P * Bs;
  plan.expert_counts.assign(E, 0);
  plan.slot_counts.assign(placement.num_instances(), 0);
  plan.send_slot.resize(num_send);
  int sent = 0;
  for (int a = 0; a < num_send; ++a) {
    const int e = expert_idx[a];
    if (e == -1) {  // dropped
      plan.send_slot[a] = -1;
      continue;
    }
    if (e < 0 || e >= E) {
      throw std::invalid_argument("dispatch_plan_build: token " + std::to_string(a / top_k) +
                                  " is routed to expert " + std::to_string(e) + ", outside [0, " +
                                  std::to_string(E) + ")");
    }
    const int replica = placement.num_replicas(e) == 1
                            ? 0
                            : placement.replica_for(e, ep_rank * Bs + (a / top_k) / S, group_seqs);
    const int slot = placement.replica_slot(e, replica);
    plan.send_slot[a] = slot;
    ++plan.expert_counts[e];
    ++plan.slot_counts[slot];
    ++sent;
  }
  plan.num_sent = sent;
  // cursor[slot]: next free send position of the instance in that slot.
  std::vector<int>& cursor = plan.expert_cursor;
  cursor.assign(placement.num_instances(), 0);
  for (int slot = 1; slot < placement.num_instances(); ++slot) {
    cursor[slot] = cursor[slot - 1] + plan.slot_counts[slot - 1];
  }
  plan.send_assignment.resize(sent);
  plan.send_position.resize(num_send);
  for (int a = 0; a < num_send; ++a) {
    if (plan.send_slot[a] == -1) {
      plan.send_position[a] = -1;
      continue;
    }
    const int p = cursor[plan.send_slot[a]]++;
    plan.send_assignment[p] = a;
    plan.send_position[a] = p;
  }

  // Per destination rank: row counts, offsets, and the per-local-expert count message.
  const int max_local = placement.max_local();
  plan.send_counts.assign(P, 0);
  plan.send_offsets.assign(P, 0);
  plan.count_message.assign(static_cast<size_t>(P) * max_local, 0);
  plan.send_block_offsets.assign(plan.count_message.size(), 0);
  int position = 0;
  for (int d = 0; d < P; ++d) {
    for (int i = 0; i < placement.num_local(d); ++i) {
      const int c = plan.slot_counts[placement.slot_of(d, i)];
      plan.count_message[static_cast<size_t>(d) * max_local + i] = c;
      plan.send_block_offsets[static_cast<size_t>(d) * max_local + i] = position;
      position += c;
      plan.send_counts[d] += c;
    }
    if (d > 0) plan.send_offsets[d] = plan.send_offsets[d - 1] + plan.send_counts[d - 1];
  }
}

void dispatch_plan_set_recv(DispatchPlan& plan, std::span<const int> counts_from_sources) {
  const ExpertPlacement& pl = plan.placement;
  const int P = pl.ep_size, max_local = pl.max_local(), E_loc = plan.num_local_experts();
  if (counts_from_sources.size() != static_cast<size_t>(P) * max_local) {
    throw std::invalid_argument(
        "dispatch_plan_set_recv: expected P*max_local = " + std::to_string(P * max_local) +
        " counts, got " + std::to_string(counts_from_sources.size()));
  }
  if (counts_from_sources.data() !=
      plan.recv_counts_by_source.data()) {  // may be received in place
    plan.recv_counts_by_source.assign(counts_from_sources.begin(), counts_from_sources.end());
  }
  plan.recv_counts.assign(P, 0);
  plan.recv_offsets.assign(P, 0);
  plan.expert_offsets.assign(E_loc + 1, 0);
  for (int s = 0; s < P; ++s) {
    for (int i = 0; i < E_loc; ++i) {
      const int c = counts_from_sources[static_cast<size_t>(s) * max_local + i];
      if (c < 0) throw std::invalid_argument("dispatch_plan_set_recv: negative count");
      plan.recv_counts[s] += c;
      plan.expert_offsets[i + 1] += c;
    }
    if (s > 0) plan.recv_offsets[s] = plan.recv_offsets[s - 1] + plan.recv_counts[s - 1];
  }
  for (int i = 0; i < E_loc; ++i) plan.expert_offsets[i + 1] += plan.expert_offsets[i];
  plan.num_recv = plan.expert_offsets[E_loc];

  // Source s's block for local expert i goes after the rows of expert i from sources 0..s-1.
  plan.recv_block_offsets.assign(static_cast<size_t>(P) * max_local, 0);
  std::vector<int>& cursor = plan.expert_cursor;  // next free expert-major row of each local expert
  cursor.assign(plan.expert_offsets.begin(), plan.expert_offsets.end() - 1);
  for (int s = 0; s < P; ++s) {
    for (int i = 0; i < E_loc; ++i) {
      const size_t block = static_cast<size_t>(s) * max_local + i;
      plan.recv_block_offsets[block] = cursor[i];
      cursor[i] += counts_from_sources[block];
    }
  }
}

int64_t dispatch_plan_cross_host_rows(const DispatchPlan& plan, std::span<const int> ep_hosts) {
  const int P = plan.placement.ep_size;
  if (ep_hosts.size() != static_cast<size_t>(P) || plan.send_counts.size() != ep_hosts.size()) {
    throw std::invalid_argument(
        "dispatch_plan_cross_host_rows: " + std::to_string(ep_hosts.size()) +
        " hosts for an EP group of " + std::to_string(P));
  }
  const int own = ep_hosts[plan.ep_rank];
  int64_t rows = 0;
  for (int d = 0; d < P; ++d) {
    if (ep_hosts[d] != own) rows += plan.send_counts[d];
  }
  return rows;
}

namespace {

// Per token of `ids` ([T, K], −1 not sent), the hosts other than `own` that its sent assignments
// reach, `host_of(a)` being assignment a's destination host.
template <class HostOf>
int64_t cross_host_tokens(std::span<const int32_t> ids, int top_k, int own, HostOf&& host_of) {
  int64_t copies = 0;
  for (size_t t = 0; t < ids.size(); t += top_k) {
    // Count each other host at the first slot that reaches it (K is small: a quadratic scan).
    for (int j = 0; j < top_k; ++j) {
      if (ids[t + j] == -1) continue;  // dropped: not sent
      const int host = host_of(t + j);
      bool first = host != own;
      for (int i = 0; i < j && first; ++i) first = ids[t + i] == -1 || host_of(t + i) != host;
      copies += first;
    }
  }
  return copies;
}

}  // namespace

int64_t dispatch_cross_host_tokens(std::span<const int32_t> expert_idx, int top_k,
                                   const ExpertPlacement& placement, int ep_rank,
                                   std::span<const int> ep_hosts) {
  const int P = placement.ep_size;
  if (top_k <= 0 || expert_idx.size() % top_k != 0 || ep_hosts.size() != static_cast<size_t>(P) ||
      ep_rank < 0 || ep_rank >= P) {
    throw std::invalid_argument("dispatch_cross_host_tokens: " + std::to_string(expert_idx.size()) +
                                " ids for K = " + std::to_string(top_k) + ", " +
                                std::to_string(ep_hosts.size()) + " hosts for an EP group of " +
                                std::to_string(P));
  }
  return cross_host_tokens(expert_idx, top_k, ep_hosts[ep_rank],
                           [&](size_t a) { return ep_hosts[placement.owner(expert_idx[a])]; });
}

int64_t dispatch_plan_cross_host_tokens(const DispatchPlan& plan, std::span<const int> ep_hosts) {
  const ExpertPlacement& pl = plan.placement;
  if (ep_hosts.size() != static_cast<size_t>(pl.ep_size)) {
    throw std::invalid_argument(
        "dispatch_plan_cross_host_tokens: " + std::to_string(ep_hosts.size()) +
        " hosts for an EP group of " + std::to_string(pl.ep_size));
  }
  const std::span<const int32_t> slots(plan.send_slot);
  return cross_host_tokens(slots, plan.top_k, ep_hosts[plan.ep_rank],
                           [&](size_t a) { return ep_hosts[pl.rank_of_slot(slots[a])]; });
}

}  // namespace moe
