// Token embedding lookup and the softmax cross-entropy of the LM head, forward and backward.
// Legend: N tokens, D model width, V vocab.
#pragma once

#include <cstdint>

#include "model/fast_exp.hpp"
#include "model/softmax_rows.hpp"
#include "numeric/det_math.hpp"

namespace moe {

// out[t] = table[ids[t]]. Throws std::out_of_range naming the token id and V for an id outside
// [0, V) (data readers check this earlier; this is the last line of defence).
template <class T>
void embedding_forward(T* out,              // [N, D]
                       const int32_t* ids,  // [N]
                       const T* table,      // [V, D]
                       int N, int D, int V);

// d_table[ids[t]] += d_out[t].
template <class T>
void embedding_backward(T* d_table,          // [V, D]
                        const T* d_out,      // [N, D]
                        const int32_t* ids,  // [N]
                        int N, int D);

// Softmax cross-entropy of logits against next-token targets, fused with its backward.
// Returns Σ_t (logsumexp(logits[t]) − logits[t][targets[t]]) accumulated in double; writes
// d_logits = (softmax(logits) − onehot(targets)) · scale, where scale is 1 / (tokens in the
// global mean), so that the gradient is that of the global mean loss. Rows run as parallel tasks;
// their losses, kept in row_loss, are added in row order.
template <class T>
double cross_entropy_forward_backward(T* d_logits,             // [N, V]
                                      double* row_loss,        // [N] scratch
                                      const T* logits,         // [N, V]
                                      const int32_t* targets,  // [N]
                                      int N, int V, double scale);

// One row of cross_entropy_forward_backward: *loss = logsumexp(z) − z[y] and dz = (softmax(z) −
// onehot(y))·scale. In float it runs at the CPU's instruction-set level (model/simd.hpp), with
// the same bits at every level: the max is exact, exp is elementwise, and the sum of exp adds
// kLanes double partial sums in a fixed order. Only the sign of a zero max can depend on the
// lanes, and it changes nothing: exp(±0) = 1, and a row whose max is a zero of both signs has
// two terms of 1 in its sum, so log(sum) > 0 absorbs the ±0. (A NaN logit, which row_max skips
// where std::max_element may not, makes the loss and the whole row NaN either way: a
// non-finite step, which updates nothing.)
template <class T>
[[gnu::always_inline]] inline void cross_entropy_row_impl(double* loss, T* dz, const T* z, int V,
                                                          int32_t y, double scale) {
  const T zmax = row_max(z, V);
  for (int v = 0; v < V; ++v) dz[v] = kernel_exp(z[v] - zmax);
  constexpr int kLanes = 8;
  double part[kLanes] = {};
  int v0 = 0;
  for (; v0 + kLanes <= V; v0 += kLanes) {
    for (int i = 0; i < kLanes; ++i) part[i] += static_cast<double>(dz[v0 + i]);
  }
  for (int v = v0; v < V; ++v) part[0] += static_cast<double>(dz[v]);
  double sum = 0.0;
  for (double p : part) sum += p;
  *loss = det::log(sum) + static_cast<double>(zmax) - static_cast<double>(z[y]);
  // loss = log Σ exp(z) − z[y]  =>  ∂loss/∂z[v] = softmax(z)[v] − [v == y]
  const T factor = static_cast<T>(scale / sum);
  for (int v = 0; v < V; ++v) dz[v] *= factor;
  dz[y] -= static_cast<T>(scale);
}

}  // namespace moe
