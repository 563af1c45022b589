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
  owner_.resize(num_experts);
  slot_.resize(num_experts);
  rank_first_.assign(ep_size + 1, 0);
  for (int q = 0; q < ep_size; ++q) {
    rank_first_[q + 1] = rank_first_[q] + base + (q < extra ? 1 : 0);
    for (int e = rank_first_[q]; e < rank_first_[q + 1]; ++e) owner_[e] = q;
  }
  for (int e = 0; e < num_experts; ++e) experts_[e] = slot_[e] = e;
  max_local_ = base + (extra > 0 ? 1 : 0);
}

ExpertPlacement::ExpertPlacement(int num_experts_in, const std::vector<std::vector<int>>& ranks)
    : num_experts(num_experts_in), ep_size(static_cast<int>(ranks.size())) {
  if (ep_size < 1 || num_experts < 1) {
    throw std::invalid_argument("expert placement: no ranks or no experts");
  }
  owner_.assign(num_experts, -1);
  slot_.assign(num_experts, -1);
  rank_first_.assign(ep_size + 1, 0);
  experts_.clear();
  max_local_ = 0;
  for (int q = 0; q < ep_size; ++q) {
    std::vector<int> held = ranks[q];
    if (held.empty()) {
      throw std::invalid_argument("rank " + std::to_string(q) + " holds no expert");
    }
    std::sort(held.begin(), held.end());
    for (const int e : held) {
      if (e < 0 || e >= num_experts) {
        throw std::invalid_argument("rank " + std::to_string(q) + ": expert " + std::to_string(e) +
                                    " outside [0, " + std::to_string(num_experts) + ")");
      }
      if (owner_[e] == q) {
        throw std::invalid_argument("rank " + std::to_string(q) + " lists expert " +
                                    std::to_string(e) + " twice");
      }
      if (owner_[e] >= 0) {
        throw std::invalid_argument("expert " + std::to_string(e) + " is on ranks " +
                                    std::to_string(owner_[e]) + " and " + std::to_string(q) +
                                    ": replicated experts are not supported");
      }
      owner_[e] = q;
      slot_[e] = static_cast<int>(experts_.size());
      experts_.push_back(e);
    }
    rank_first_[q + 1] = static_cast<int>(experts_.size());
    max_local_ = std::max(max_local_, static_cast<int>(held.size()));
  }
  for (int e = 0; e < num_experts; ++e) {
    if (owner_[e] < 0)
      throw std::invalid_argument("expert " + std::to_string(e) + " is on no rank");
  }
}

bool ExpertPlacement::is_contiguous() const {
  return *this == ExpertPlacement(num_experts, ep_size);
}

void dispatch_plan_build(DispatchPlan& plan, std::span<const int32_t> expert_idx, int num_tokens,
                         int top_k, const ExpertPlacement& placement, int ep_rank) {
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

  // Counting sort by the experts' slots (destination rank, then local expert), stable in the
  // assignment index.
  plan.expert_counts.assign(E, 0);
  int sent = 0;
  for (int a = 0; a < num_send; ++a) {
    const int e = expert_idx[a];
    if (e == -1) continue;  // dropped
    if (e < 0 || e >= E) {
      throw std::invalid_argument("dispatch_plan_build: token " + std::to_string(a / top_k) +
                                  " is routed to expert " + std::to_string(e) + ", outside [0, " +
                                  std::to_string(E) + ")");
    }
    ++plan.expert_counts[e];
    ++sent;
  }
  plan.num_sent = sent;
  // cursor[slot]: next free send position of the expert in that slot.
  std::vector<int>& cursor = plan.expert_cursor;
  cursor.assign(E, 0);
  for (int slot = 1; slot < E; ++slot) {
    cursor[slot] =
        cursor[slot - 1] + static_cast<int>(plan.expert_counts[placement.expert_at_slot(slot - 1)]);
  }
  plan.send_assignment.resize(sent);
  plan.send_position.resize(num_send);
  for (int a = 0; a < num_send; ++a) {
    if (expert_idx[a] == -1) {
      plan.send_position[a] = -1;
      continue;
    }
    const int p = cursor[placement.slot(expert_idx[a])]++;
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
      const int c = static_cast<int>(plan.expert_counts[placement.expert(d, i)]);
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
  const int own = ep_hosts[ep_rank];
  int64_t copies = 0;
  for (size_t t = 0; t < expert_idx.size(); t += top_k) {
    // Count each other host at the first slot that reaches it (K is small: a quadratic scan).
    for (int j = 0; j < top_k; ++j) {
      if (expert_idx[t + j] == -1) continue;  // dropped: not sent
      const int host = ep_hosts[placement.owner(expert_idx[t + j])];
      bool first = host != own;
      for (int i = 0; i < j && first; ++i) {
        first = expert_idx[t + i] == -1 || ep_hosts[placement.owner(expert_idx[t + i])] != host;
      }
      copies += first;
    }
  }
  return copies;
}

}  // namespace moe
