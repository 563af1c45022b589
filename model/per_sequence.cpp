// Token-row operations sequence by sequence (per_sequence.hpp).
#include "model/per_sequence.hpp"

#include <algorithm>

#include "model/blas.hpp"
#include "model/embedding.hpp"
#include "model/parallel.hpp"
#include "model/prefetch.hpp"
#include "model/rmsnorm.hpp"

namespace moe {

template <class T>
void seq_linear_weight_backward(T* d_weight, TreeSum<T>& tree, const T* d_out, const T* in, int B,
                                int S, int I, int O) {
  tree.begin_into(static_cast<size_t>(I) * O, B, d_weight);
  for (int b = 0; b < B; ++b) {
    const int64_t row0 = int64_t{b} * S;
    // out = in·weight  ->  d_weight_b[I,O] = in_bᵀ[I,S]·d_out_b[S,O]
    gemm<T>(true, false, I, O, S, T(1), in + row0 * I, d_out + row0 * O, tree.leaf_beta(),
            tree.leaf());
    tree.push();
  }
  tree.finish(d_weight);
}

template <class T>
void seq_linear_weight_backward(T* d_weight, std::span<T> scratch, const T* d_out, const T* in,
                                int B, int S, int I, int O) {
  thread_local std::vector<int64_t> first;
  thread_local std::vector<int> rows;
  first.resize(static_cast<size_t>(std::max(B, 0)));
  rows.assign(first.size(), S);
  for (size_t b = 0; b < first.size(); ++b) first[b] = static_cast<int64_t>(b) * S;
  // Written long before (the forward's input, the backward's first pass), the rows come from far
  // caches: asked for at once, they arrive together rather than a row at a time, as the routed
  // experts' leaves do (expert_grads.cpp).
  const size_t values = first.size() * static_cast<size_t>(std::max(S, 0));
  prefetch_values(in, values * static_cast<size_t>(std::max(I, 0)));
  prefetch_values(d_out, values * static_cast<size_t>(std::max(O, 0)));
  gemm_leaf_tree<T>(I, O, in, I, d_out, O, d_weight, O, first, rows, scratch);
}

template <class T>
void seq_rmsnorm_backward(T* d_in, T* d_weight, std::vector<T>& leaves, const T* d_out, const T* in,
                          const T* weight, const T* rstd, int B, int S, int D) {
  if (B < 1) return;
  leaves.resize(static_cast<size_t>(B) * D);
  rmsnorm_backward_sequences(d_in, leaves.data(), d_out, in, weight, rstd, B, S, D);
  tree_sum_leaves(d_weight, leaves.data(), B, static_cast<size_t>(D), static_cast<size_t>(D));
}

template <class T>
void seq_embedding_backward(T* d_table, TreeSum<T>& tree, const T* d_out, const int32_t* ids, int B,
                            int S, int D, int V) {
  const size_t VD = static_cast<size_t>(V) * D;
  tree.begin(VD);
  for (int b = 0; b < B; ++b) {
    const int64_t row0 = int64_t{b} * S;
    T* leaf = tree.leaf();
    parallel_zero(leaf, VD);
    embedding_backward(leaf, d_out + row0 * D, ids + row0, S, D);
    tree.push();
  }
  tree.finish(d_table);
}

#define MOE_PER_SEQUENCE_INSTANTIATE(T)                                                            \
  template void seq_linear_weight_backward<T>(T*, std::span<T>, const T*, const T*, int, int, int, \
                                              int);                                                \
  template void seq_linear_weight_backward<T>(T*, TreeSum<T>&, const T*, const T*, int, int, int,  \
                                              int);                                                \
  template void seq_rmsnorm_backward<T>(T*, T*, std::vector<T>&, const T*, const T*, const T*,     \
                                        const T*, int, int, int);                                  \
  template void seq_embedding_backward<T>(T*, TreeSum<T>&, const T*, const int32_t*, int, int,     \
                                          int, int);
MOE_PER_SEQUENCE_INSTANTIATE(float)
MOE_PER_SEQUENCE_INSTANTIATE(double)
#undef MOE_PER_SEQUENCE_INSTANTIATE

}  // namespace moe
