// The expert gradients of a placement with replicated experts (comm/dispatch_plan.hpp,
// ExpertPlacement): every instance of an expert, on every rank of every EP group holding it, summed
// the tree nodes of the sequences its rows came from (model/expert_grads.hpp: node n into plane n
// of the gradient arena). Each instance sends its nodes to the expert's other instances, once per
// step in one all-to-all over the world, and each adds every instance's nodes along the rest of
// the one tree over all sequences (tree_sum_from_nodes) into plane 0: the bits of one rank holding
// the expert and every sequence, so a run is bitwise the same under any placement.
//
// Legend: W ranks, P EP group size, B sequences per rank, L layers, A elements of the expert arena,
// DF elements of one expert matrix (D × F), I instances of a layer.
#pragma once

#include <cstddef>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/host_layout.hpp"
#include "model/model.hpp"
#include "model/tree_sum.hpp"

namespace moe {

class ExpertInstanceReduce {
 public:
  // The planes of the gradient arena that the instances of `placement` need on `world_size`
  // ranks in EP groups of P, B sequences each: the most tree nodes any instance sums.
  static size_t planes_needed(const ModelPlacement& placement, int world_size, int per_rank);

  // Not collective: every rank's EP group and rank follow from `hosts` (EP group g is positions
  // [g·P, g·P + P) of its order). `d_experts`: the gradient arena, [planes, A], laid out by
  // `layout`; it must not move while this object lives. Throws std::length_error when a
  // message to one peer would exceed MPI's int count.
  ExpertInstanceReduce(const Comm& world, const HostLayout& hosts, const ParallelGroups& groups,
                       const ModelPlacement& placement, const ModelLayout& layout, int per_rank,
                       size_t matrix_elements, float* d_experts, size_t arena_elements);

  // The most bytes any rank's exchange buffers take (send and receive), for the memory estimate.
  static double buffer_bytes(const ModelPlacement& placement, int world_size, int per_rank,
                             double matrix_elements);

  // Collective over the world: plane 0 of every local instance becomes its expert's whole
  // gradient.
  void reduce();

 private:
  // One known node of an instance's tree: its sequences, and where each of its three matrices'
  // sums lie (this rank's planes, or what another rank sent).
  struct KnownNode {
    TreeNode node;
    const float* matrix[3];
  };
  // A local instance: where its three matrices' plane-0 gradients lie, and every instance's
  // nodes of its expert.
  struct Instance {
    float* out[3];
    std::vector<KnownNode> known;
  };
  // One local instance's nodes sent to one peer: the source matrices of each node.
  struct Sent {
    const float* matrix[3];
  };

  const Comm& world_;
  int total_sequences_ = 0;  // W·B: the tree's leaves
  size_t DF_ = 0;
  std::vector<Instance> instances_;
  std::vector<Sent> sent_;  // in send-buffer order, peer by peer
  std::vector<int> send_counts_, send_displs_, recv_counts_, recv_displs_;  // [W] floats
  std::vector<float> send_, recv_, sum_;
  std::vector<std::vector<float>> scratch_;  // tree_sum_from_nodes's, one [DF] per level
};

}  // namespace moe
