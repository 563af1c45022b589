// Expert weight gradients by sequence along the global tree (model/expert_grads.hpp).
// Legend: P EP group size, max_local local experts (at most), Bs sequences per rank, K top-k.
#include "model/expert_grads.hpp"

#include <algorithm>
#include <span>
#include <stdexcept>
#include <string>
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
void expert_weight_grad(T* d_weight, TreeSum<T>& tree, const T* in, const T* d_out, int I, int O,
                        int i, const DispatchPlan& plan, const ExpertSeqRows& rows,
                        const ExpertGradLayout& layout) {
  const int max_local = plan.placement.max_local(), Bs = rows.per_source;
  const size_t IO = static_cast<size_t>(I) * O;
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
  const std::vector<TreeNode>& nodes = rows.nodes[i];
  for (size_t n = 0; n < nodes.size(); ++n) {
    const TreeNode node = nodes[n];
    T* out = d_weight + static_cast<int64_t>(n) * layout.plane_stride;
    tree.begin_into(IO, node.count, out);  // one sequence: straight into the gradient
    for (int q = node.first; q < node.first + node.count; ++q) {
      const auto [row, count] = leaf_rows(q);
      // The next leaf's rows (of this node or the next one), fetched during this leaf's GEMM:
      // written long before, by the exchange and the rows' backward, they come from far caches.
      const bool last = q + 1 == node.first + node.count;
      if (!last || n + 1 < nodes.size()) {
        const auto [next, next_count] = leaf_rows(last ? nodes[n + 1].first : q + 1);
        prefetch_values(in + next * I, static_cast<size_t>(next_count) * I);
        prefetch_values(d_out + next * O, static_cast<size_t>(next_count) * O);
      }
      // out = in·W  ->  d_W_leaf[I,O] = in_qᵀ[I,rows]·d_out_q[rows,O] (zero without rows)
      gemm<T>(true, false, I, O, count, T(1), in + row * I, d_out + row * O, tree.leaf_beta(),
              tree.leaf());
      tree.push();
    }
    tree.finish(out);
  }
}

template void expert_weight_grad<float>(float*, TreeSum<float>&, const float*, const float*, int,
                                        int, int, const DispatchPlan&, const ExpertSeqRows&,
                                        const ExpertGradLayout&);
template void expert_weight_grad<double>(double*, TreeSum<double>&, const double*, const double*,
                                         int, int, int, const DispatchPlan&, const ExpertSeqRows&,
                                         const ExpertGradLayout&);

}  // namespace moe
