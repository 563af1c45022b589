// Token-row operations done sequence by sequence, so that no bit depends on how many sequences a
// rank holds (and, with Comm::allreduce_sum_tree, not on the rank count):
//  - GEMMs whose rows are tokens run on one sequence's S rows at a time (a row's bits no longer
//    depend on the call's row count with the project's GEMM, model/gemm/, but the calls stay
//    per sequence, where the weight gradients need them anyway);
//  - weight gradients, sums over tokens, are summed per sequence and the partial sums added along
//    the fixed tree of model/tree_sum.hpp. Each adds the tree's sum into the gradient, as the
//    plain backward functions add theirs.
// Legend: B sequences, S rows each (N = B·S), I input and O output widths, D model width, V vocab.
#pragma once

#include <cstdint>
#include <vector>

#include "model/tree_sum.hpp"

namespace moe {

// out[B·S, O] = in·weight, one sequence at a time (overwrites out).
template <class T>
void seq_linear_forward(T* out, const T* in, const T* weight, int B, int S, int I, int O);

// d_in[B·S, I] += d_out·weightᵀ, one sequence at a time.
template <class T>
void seq_linear_backward_input(T* d_in, const T* d_out, const T* weight, int B, int S, int I,
                               int O);

// d_weight[I,O] += Σ_b in_bᵀ·d_out_b (the weight's half of linear_backward).
template <class T>
void seq_linear_weight_backward(T* d_weight,       // [I,O] +=
                                TreeSum<T>& tree,  // room for I·O values, B leaves
                                const T* d_out,    // [B·S, O]
                                const T* in,       // [B·S, I]
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
