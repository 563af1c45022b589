// Token-row operations done sequence by sequence, so that no bit depends on how many sequences a
// rank holds (and, with Comm::allreduce_sum_tree, not on the rank count):
//  - a GEMM whose rows are tokens gives each row the same bits whatever the call's row count
//    (model/gemm/), so only the weight gradients need sequences: the LM head's forward and input
//    gradient run on all B·S rows at once (model.cpp), packing the [D, V] weight once;
//  - weight gradients, sums over tokens, are summed per sequence and the partial sums added along
//    the fixed tree of model/tree_sum.hpp. Each adds the tree's sum into the gradient, as the
//    plain backward functions add theirs.
// Legend: B sequences, S rows each (N = B·S), I input and O output widths, D model width, V vocab.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/tree_sum.hpp"

namespace moe {

// d_weight[I,O] += Σ_b in_bᵀ·d_out_b (the weight's half of linear_backward).
template <class T>
void seq_linear_weight_backward(T* d_weight,       // [I,O] +=
                                TreeSum<T>& tree,  // room for I·O values, B leaves
                                const T* d_out,    // [B·S, O]
                                const T* in,       // [B·S, I]
                                int B, int S, int I, int O);
// The same in one gemm_leaf_tree, the same bits: `scratch` holds gemm_leaf_tree_scratch(I, O, B)
// values. Faster on narrow weights and short sequences (docs/performance.md); the LM head's
// [D, V] keeps the tree above, whose leaves are whole GEMMs.
template <class T>
void seq_linear_weight_backward(T* d_weight, std::span<T> scratch, const T* d_out, const T* in,
                                int B, int S, int I, int O);

// rmsnorm_backward, sequence by sequence: d_in as there; d_weight[D] += the tree over sequences
// of each sequence's gradient, held in `leaves` (resized to [B, D]: reserve it to allocate
// nothing).
template <class T>
void seq_rmsnorm_backward(T* d_in, T* d_weight, std::vector<T>& leaves, const T* d_out, const T* in,
                          const T* weight, const T* rstd, int B, int S, int D);

// d_table[V,D] += the tree over sequences of each sequence's embedding_backward.
template <class T>
void seq_embedding_backward(T* d_table, TreeSum<T>& tree, const T* d_out, const int32_t* ids, int B,
                            int S, int D, int V);

}  // namespace moe
