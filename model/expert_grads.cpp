// Expert weight gradients by sequence along the global tree (model/expert_grads.hpp).
// Legend: P EP group size, max_local local experts (at most), Bs sequences per rank, K top-k.
#include "model/expert_grads.hpp"

#include <algorithm>
#include <span>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>

#include "model/blas.hpp"
#include "model/prefetch.hpp"

namespace moe {

std::vector<TreeNode> expert_grad_nodes(const ExpertGradLayout& layout, int ep_size,
                                        int per_source) {
  const int span = ep_size * per_source;
  const int total = layout.total > 0 ? layout.total : span;
  if (layout.group_first < 0 || layout.group_first + span > total) {
    throw std::invalid_argument("expert_grad_nodes: the EP group's sequences [" +
                                std::to_string(layout.group_first) + ", " +
                                std::to_string(layout.group_first + span) + ") lie outside [0, " +
                                std::to_string(total) + ")");
  }
  return tree_nodes_within(layout.group_first, layout.group_first + span, total);
}

std::vector<std::vector<TreeNode>> expert_grad_group_nodes(int world_size, int ep_size,
                                                           int per_source) {
  std::vector<std::vector<TreeNode>> groups;
  for (int g = 0; g < world_size / ep_size; ++g) {
    groups.push_back(expert_grad_nodes({g * ep_size * per_source, world_size * per_source, 0},
                                       ep_size, per_source));
  }
  return groups;
}

std::pair<int, int> expert_instance_range(const ExpertPlacement& placement, int slot,
                                          int group_first, int per_source) {
  const int n = placement.ep_size * per_source;
  const int k = placement.num_replicas(placement.expert_at_slot(slot));
  const auto [lo, hi] = ExpertPlacement::replica_chunk(placement.replica_of_slot(slot), k, n);
  return {group_first + lo, group_first + hi};
}

void expert_seq_rows_exchange(ExpertSeqRows& rows, const DispatchPlan& plan, int N, int S,
                              const ExpertGradLayout& layout, const Comm& ep) {
  const int P = plan.placement.ep_size, max_local = plan.placement.max_local();
  const int Bs = S > 0 ? N / S : 1;
  const size_t blocks = static_cast<size_t>(P) * max_local;
  rows.per_source = Bs;
  rows.send.assign(blocks * Bs, 0);
  rows.recv.resize(blocks * Bs);
  if (Bs == 1) {
    // One sequence a rank: a block is a sequence.
    std::copy(plan.recv_counts_by_source.begin(), plan.recv_counts_by_source.end(),
              rows.recv.begin());
  } else {
    // Each block's send positions hold its tokens in order: count them by sequence.
    for (size_t b = 0; b < blocks; ++b) {
      const int first = plan.send_block_offsets[b], count = plan.count_message[b];
      for (int p = first; p < first + count; ++p) {
        const int token = plan.send_assignment[p] / plan.top_k;
        ++rows.send[b * Bs + token / S];
      }
    }
    ep.alltoall(std::span<const int>(rows.send), std::span<int>(rows.recv));
  }
  if (rows.nodes_first != layout.group_first || rows.nodes_total != layout.total ||
      rows.nodes_per_source != Bs || rows.nodes_rank != plan.ep_rank ||
      !(rows.nodes_placement == plan.placement)) {
    const ExpertPlacement& pl = plan.placement;
    const int span = P * Bs, total = layout.total > 0 ? layout.total : span;
    if (layout.group_first < 0 || layout.group_first + span > total) {
      throw std::invalid_argument("expert_seq_rows_exchange: the EP group's sequences lie " +
                                  std::string("outside the tree"));
    }
    rows.nodes.resize(plan.num_local_experts());
    for (int i = 0; i < plan.num_local_experts(); ++i) {
      const auto [lo, hi] =
          expert_instance_range(pl, pl.slot_of(plan.ep_rank, i), layout.group_first, Bs);
      rows.nodes[i] = tree_nodes_within(lo, hi, total);
    }
    rows.nodes_first = layout.group_first;
    rows.nodes_total = layout.total;
    rows.nodes_per_source = Bs;
    rows.nodes_rank = plan.ep_rank;
    rows.nodes_placement = pl;
  }
}

template <class T>
void expert_weight_grad(T* d_weight, std::span<T> scratch, const T* in, const T* d_out, int I,
                        int O, int i, const DispatchPlan& plan, const ExpertSeqRows& rows,
                        const ExpertGradLayout& layout, LeafTreeInto into) {
  const int max_local = plan.placement.max_local(), Bs = rows.per_source;
  // The group's sequence q: source s's sequence b, after the source's earlier sequences; its
  // first row and its number of rows.
  auto leaf_rows = [&](int q) {
    const int local = q - layout.group_first, s = local / Bs, b = local % Bs;
    const size_t block = static_cast<size_t>(s) * max_local + i;
    const int* counts = &rows.recv[block * Bs];
    int row = plan.recv_block_offsets[block];
    for (int e = 0; e < b; ++e) row += counts[e];
    return std::pair<int64_t, int>{row, counts[b]};
  };
  // Each node's leaves, as rows of `in` and `d_out`.
  thread_local std::vector<int64_t> first;
  thread_local std::vector<int> counts;
  const std::vector<TreeNode>& nodes = rows.nodes[i];
  for (size_t n = 0; n < nodes.size(); ++n) {
    const TreeNode node = nodes[n];
    first.resize(static_cast<size_t>(node.count));
    counts.resize(first.size());
    for (size_t q = 0; q < first.size(); ++q) {
      std::tie(first[q], counts[q]) = leaf_rows(node.first + static_cast<int>(q));
      // Written long before, by the exchange and the rows' backward, the leaves' rows come from
      // far caches: asked for at once, they arrive together rather than a row at a time.
      prefetch_values(in + first[q] * I, static_cast<size_t>(counts[q]) * I);
      prefetch_values(d_out + first[q] * O, static_cast<size_t>(counts[q]) * O);
    }
    // out = in·W  ->  d_W[I,O] += the tree sum over the node's leaves of in_qᵀ·d_out_q
    gemm_leaf_tree<T>(I, O, in, I, d_out, O,
                      d_weight + static_cast<int64_t>(n) * layout.plane_stride, O, first, counts,
                      scratch, into);
  }
}

template void expert_weight_grad<float>(float*, std::span<float>, const float*, const float*, int,
                                        int, int, const DispatchPlan&, const ExpertSeqRows&,
                                        const ExpertGradLayout&, LeafTreeInto);
template void expert_weight_grad<double>(double*, std::span<double>, const double*, const double*,
                                         int, int, int, const DispatchPlan&, const ExpertSeqRows&,
                                         const ExpertGradLayout&, LeafTreeInto);

}  // namespace moe
