// Expert weight gradients by sequence, along the tree over the global sequences
// (model/tree_sum.hpp), so that their bits depend on neither the rank count nor the EP size:
// with several EP groups (replicas) each group sums the nodes of the tree its sequences cover,
// and Trainer adds the groups' nodes along the rest of the same tree (tree_sum_from_nodes),
// instead of MPI_Allreduce, whose order is the library's.
//
// An expert's owner holds its rows expert-major: for each source rank of the EP group, that
// source's rows in token order, so each of the source's sequences is a contiguous run. A leaf is
// one sequence's inᵀ·d_out over its rows of the expert (zero when it sent none: every sequence is
// a leaf, so the tree keeps its shape). The rows of each (source, local expert, sequence) come
// from the plan's blocks when each rank holds one sequence, else from one all-to-all of
// per-sequence counts over the EP group.
//
// Legend: P EP group size, E_loc/max_local local experts, Bs sequences per rank, S sequence
// length, I × O a weight's shape (D × F or F × D).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/dispatch_plan.hpp"
#include "model/blas.hpp"
#include "model/tree_sum.hpp"

namespace moe {

// Where an EP group's sequences lie in the global tree: the run's layout (Trainer sets it; a
// layer tested alone keeps the default: its EP group's sequences are all there are).
struct ExpertGradLayout {
  int group_first = 0;       // global index of the EP group's first sequence
  int total = 0;             // global sequences of a step; 0: the EP group's alone
  int64_t plane_stride = 0;  // elements between planes of the expert gradient arena
};

// The rows behind the leaves, per backward: recv[(s·max_local + i)·Bs + b] rows of source s's
// sequence b for local expert i; and the tree nodes each local expert sums (node n into plane
// n): those of the EP group's range, or for a replica those of its chunk of it
// (expert_instance_range), worked out again only when the layout, Bs or the placement changes,
// not every step.
struct ExpertSeqRows {
  int per_source = 1;                        // Bs
  std::vector<int> send, recv;               // [P, max_local, Bs]
  std::vector<std::vector<TreeNode>> nodes;  // [E_loc] tree_nodes_within(each one's range)
  int nodes_first = -1, nodes_total = -1, nodes_per_source = -1;  // what `nodes` were made for
  int nodes_rank = -1;
  ExpertPlacement nodes_placement;
};

// The global sequences [first, end) whose rows the instance in `slot` of `placement` takes, in an
// EP group whose sequences start at `group_first`, `per_source` on each of its ranks: the group's
// whole range, or for a replica its chunk of it (ExpertPlacement::replica_chunk).
std::pair<int, int> expert_instance_range(const ExpertPlacement& placement, int slot,
                                          int group_first, int per_source);

// The nodes an EP group of `ep_size` ranks of `per_source` sequences each sums, under `layout`
// (without replicas: every local expert's).
std::vector<TreeNode> expert_grad_nodes(const ExpertGradLayout& layout, int ep_size,
                                        int per_source);

// Every EP group's nodes, group by group, when `world_size` ranks form EP groups of `ep_size`
// holding `per_source` sequences each (group g's sequences start at g·ep_size·per_source). The
// planes of the expert gradients a run needs are the most nodes of any group.
std::vector<std::vector<TreeNode>> expert_grad_group_nodes(int world_size, int ep_size,
                                                           int per_source);

// Fills `rows` for the plan's routing (send and receive sides complete) of N tokens in
// sequences of S (S = 0: one sequence): collective over `ep` when N / S > 1. Every rank of the EP
// group must hold the same N and S (the runtime's ranks all hold --batch-per-rank sequences):
// the exchange's sizes and whether it runs at all follow from them.
void expert_seq_rows_exchange(ExpertSeqRows& rows, const DispatchPlan& plan, int N, int S,
                              const ExpertGradLayout& layout, const Comm& ep);

// d_weight (plane n for node n) += the tree sum over node n's sequences of inᵀ·d_out on local
// expert i's rows of each (gemm_leaf_tree; `into` kOverwrite: = that sum, as onto zeros). `in`
// [R, I] and `d_out` [R, O] are the owner's expert-major rows; `scratch` holds
// gemm_leaf_tree_scratch(I, O, P·Bs) values.
template <class T>
void expert_weight_grad(T* d_weight,  // [I, O] plane 0
                        std::span<T> scratch, const T* in, const T* d_out, int I, int O, int i,
                        const DispatchPlan& plan, const ExpertSeqRows& rows,
                        const ExpertGradLayout& layout, LeafTreeInto into = LeafTreeInto::kAdd);

}  // namespace moe
