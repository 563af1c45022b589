// Replicated experts' gradients: every instance's tree nodes to the expert's other instances,
// then the tree's top on each (expert_instances.hpp).
#include "runtime/run/expert_instances.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

#include "model/expert_grads.hpp"

namespace moe {
namespace {

// The local index of `expert` on EP rank q of `pl`, or −1 when q does not hold it.
int local_on_rank(const ExpertPlacement& pl, int expert, int q) {
  for (int j = 0; j < pl.num_replicas(expert); ++j) {
    const int slot = pl.replica_slot(expert, j);
    if (pl.rank_of_slot(slot) == q) return pl.local_of_slot(slot);
  }
  return -1;
}

// The tree nodes the instance in `slot` of `pl` sums in EP group g.
std::vector<TreeNode> instance_nodes(const ExpertPlacement& pl, int slot, int g, int per_rank,
                                     int total) {
  const auto [lo, hi] = expert_instance_range(pl, slot, g * pl.ep_size * per_rank, per_rank);
  return tree_nodes_within(lo, hi, total);
}

}  // namespace

size_t ExpertInstanceReduce::planes_needed(const ModelPlacement& placement, int world_size,
                                           int per_rank) {
  size_t planes = 1;
  for (const ExpertPlacement& pl : placement) {
    for (int g = 0; g < world_size / pl.ep_size; ++g) {
      for (int slot = 0; slot < pl.num_instances(); ++slot) {
        planes =
            std::max(planes, instance_nodes(pl, slot, g, per_rank, world_size * per_rank).size());
      }
    }
  }
  return planes;
}

double ExpertInstanceReduce::buffer_bytes(const ModelPlacement& placement, int world_size,
                                          int per_rank, double matrix_elements) {
  // Rank (g, q) sends each of its instances' nodes to every other holder of the expert in every
  // group, and receives theirs: per layer and instance, (holders − 1)·own + Σ others' nodes.
  const int total = world_size * per_rank;
  double most = 0.0;
  for (int position = 0; position < world_size; ++position) {
    double nodes = 0.0;
    for (const ExpertPlacement& pl : placement) {
      const int P = pl.ep_size, g = position / P, q = position % P, G = world_size / P;
      for (int i = 0; i < pl.num_local(q); ++i) {
        const int e = pl.expert(q, i);
        const double own =
            static_cast<double>(instance_nodes(pl, pl.slot_of(q, i), g, per_rank, total).size());
        for (int gb = 0; gb < G; ++gb) {
          for (int j = 0; j < pl.num_replicas(e); ++j) {
            const int slot = pl.replica_slot(e, j);
            if (gb == g && pl.rank_of_slot(slot) == q) continue;
            nodes +=
                own + static_cast<double>(instance_nodes(pl, slot, gb, per_rank, total).size());
          }
        }
      }
    }
    most = std::max(most, nodes);
  }
  return most * 3.0 * matrix_elements * sizeof(float);
}

ExpertInstanceReduce::ExpertInstanceReduce(const Comm& world, const HostLayout& hosts,
                                           const ParallelGroups& groups,
                                           const ModelPlacement& placement,
                                           const ModelLayout& layout, int per_rank,
                                           size_t matrix_elements, float* d_experts,
                                           size_t arena_elements)
    : world_(world), total_sequences_(world.size() * per_rank), DF_(matrix_elements) {
  const int W = world.size(), me = world.rank(), q = groups.ep.rank(), g = groups.ep_group;
  const int L = static_cast<int>(placement.size());
  // Every rank's EP group and EP rank, whom it holds experts with: positions [g·P, g·P + P) of
  // the hosts' order are EP group g (parallel_groups_make).
  std::vector<int> where(2 * static_cast<size_t>(W));
  for (int b = 0; b < W; ++b) {
    where[2 * static_cast<size_t>(b)] = hosts.position[b] / groups.ep_size;
    where[2 * static_cast<size_t>(b) + 1] = hosts.position[b] % groups.ep_size;
  }
  if (where[2 * static_cast<size_t>(me)] != g || where[2 * static_cast<size_t>(me) + 1] != q) {
    throw std::logic_error(
        "ExpertInstanceReduce: the host layout does not give this rank's EP "
        "group and rank");
  }
  // The three matrices of local expert i of layer l in plane n of the arena.
  auto matrices = [&](int l, int i, size_t n) {
    const MoeOffsets& o = layout.layers[l].moe;
    float* base = d_experts + n * arena_elements + static_cast<size_t>(i) * DF_;
    return std::array<float*, 3>{base + o.w1, base + o.w3, base + o.w2};
  };
  // This rank's instances, with their own nodes. first_instance[l]: the index of layer l's first.
  std::vector<int> first_instance(L + 1, 0);
  std::vector<std::vector<TreeNode>> own_nodes;  // by instance
  for (int l = 0; l < L; ++l) {
    const ExpertPlacement& pl = placement[l];
    for (int i = 0; i < pl.num_local(q); ++i) {
      own_nodes.push_back(instance_nodes(pl, pl.slot_of(q, i), g, per_rank, total_sequences_));
      Instance inst;
      const std::array<float*, 3> out = matrices(l, i, 0);
      std::copy(out.begin(), out.end(), inst.out);
      for (size_t n = 0; n < own_nodes.back().size(); ++n) {
        const std::array<float*, 3> m = matrices(l, i, n);
        inst.known.push_back({own_nodes.back()[n], {m[0], m[1], m[2]}});
      }
      instances_.push_back(std::move(inst));
    }
    first_instance[l + 1] = static_cast<int>(instances_.size());
  }
  // What each peer is sent: this rank's nodes of every instance whose expert the peer holds; and
  // received: the peer's nodes of every instance whose expert this rank holds. Both in (layer,
  // the sender's local expert) order.
  std::vector<int64_t> send_counts(W, 0), recv_counts(W, 0);
  struct Received {
    int instance, peer;
    std::vector<TreeNode> nodes;
  };
  std::vector<Received> received;
  const size_t per_node = 3 * DF_;
  for (int b = 0; b < W; ++b) {
    if (b == me) continue;
    const int gb = where[2 * static_cast<size_t>(b)], qb = where[2 * static_cast<size_t>(b) + 1];
    for (int l = 0; l < L; ++l) {
      const ExpertPlacement& pl = placement[l];
      for (int i = 0; i < pl.num_local(q); ++i) {
        if (local_on_rank(pl, pl.expert(q, i), qb) < 0) continue;
        const std::vector<TreeNode>& nodes = own_nodes[first_instance[l] + i];
        for (size_t n = 0; n < nodes.size(); ++n) {
          const std::array<float*, 3> m = matrices(l, i, n);
          sent_.push_back({{m[0], m[1], m[2]}});
        }
        send_counts[b] += static_cast<int64_t>(nodes.size() * per_node);
      }
      for (int ib = 0; ib < pl.num_local(qb); ++ib) {
        const int i = local_on_rank(pl, pl.expert(qb, ib), q);
        if (i < 0) continue;
        received.push_back(
            {first_instance[l] + i, b,
             instance_nodes(pl, pl.slot_of(qb, ib), gb, per_rank, total_sequences_)});
        recv_counts[b] += static_cast<int64_t>(received.back().nodes.size() * per_node);
      }
    }
  }
  // MPI counts and displacements are ints: a larger exchange is refused, not wrapped.
  int64_t sent = 0, got = 0;
  for (int b = 0; b < W; ++b) {
    sent += send_counts[b];
    got += recv_counts[b];
  }
  if (std::max(sent, got) > std::numeric_limits<int>::max()) {
    throw std::length_error("the replicated experts' gradients would send " +
                            std::to_string(std::max(sent, got)) + " floats a step from one rank, " +
                            "more than MPI's int count: fewer replicas, or a smaller --d-model or "
                            "--ffn-dim");
  }
  send_counts_.assign(send_counts.begin(), send_counts.end());
  recv_counts_.assign(recv_counts.begin(), recv_counts.end());
  send_displs_.assign(W, 0);
  recv_displs_.assign(W, 0);
  for (int b = 1; b < W; ++b) {
    send_displs_[b] = send_displs_[b - 1] + send_counts_[b - 1];
    recv_displs_[b] = recv_displs_[b - 1] + recv_counts_[b - 1];
  }
  send_.resize(static_cast<size_t>(send_displs_[W - 1]) + send_counts_[W - 1]);
  recv_.resize(static_cast<size_t>(recv_displs_[W - 1]) + recv_counts_[W - 1]);
  // The received nodes' places, peer by peer in the order above.
  size_t at = 0;
  for (const Received& r : received) {
    for (const TreeNode& node : r.nodes) {
      const float* base = recv_.data() + at;
      instances_[r.instance].known.push_back({node, {base, base + DF_, base + 2 * DF_}});
      at += per_node;
    }
  }
  // An instance whose own node is the whole tree (its expert on one rank, one EP group) already
  // holds its gradient: nothing to add.
  std::erase_if(instances_, [&](const Instance& inst) {
    return inst.known.size() == 1 && inst.known[0].node == TreeNode{0, total_sequences_};
  });
  sum_.resize(DF_);
  scratch_.assign(tree_sum_depth(total_sequences_), std::vector<float>(DF_));
}

void ExpertInstanceReduce::reduce() {
  size_t at = 0;
  for (const Sent& s : sent_) {
    for (const float* m : s.matrix) {
      std::copy(m, m + DF_, send_.begin() + static_cast<std::ptrdiff_t>(at));
      at += DF_;
    }
  }
  world_.alltoallv(std::span<const float>(send_), std::span<const int>(send_counts_),
                   std::span<const int>(send_displs_), std::span<float>(recv_),
                   std::span<const int>(recv_counts_), std::span<const int>(recv_displs_));
  for (const Instance& inst : instances_) {
    for (int m = 0; m < 3; ++m) {
      auto known = [&](TreeNode node) -> const float* {
        for (const KnownNode& k : inst.known) {
          if (k.node == node) return k.matrix[m];
        }
        return nullptr;
      };
      // Into sum_ first: the instance's own node 0 is its plane 0, read while the tree is added.
      tree_sum_from_nodes(sum_.data(), DF_, total_sequences_, known, scratch_);
      std::copy(sum_.begin(), sum_.end(), inst.out[m]);
    }
  }
}

}  // namespace moe
