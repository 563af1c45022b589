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

// R rows of cross_entropy_forward_backward, V apart: for row r, loss[r] = logsumexp(z) − z[y[r]]
// and dz = (softmax(z) − onehot(y[r]))·scale. In float it runs at the CPU's instruction-set level
// (model/simd.hpp), with the same bits at every level: the max is exact, exp is elementwise, and
// the sum of exp adds kLanes double partial sums in a fixed order. Only the sign of a zero max
// can depend on the lanes, and it changes nothing: exp(±0) = 1, and a row whose max is a zero of
// both signs has two terms of 1 in its sum, so log(sum) > 0 absorbs the ±0. (A NaN logit, which
// row_max skips where std::max_element may not, makes the loss and the whole row NaN either way:
// a non-finite step, which updates nothing.) The R rows' serial chains (the max's lanes, the
// partial sums) run side by side, each row's operations the ones it has alone (RowVec's lanes
// are the plain loop's partial sums, model/softmax_rows.hpp).
template <class T, int R>
[[gnu::always_inline]] inline void cross_entropy_rows_impl(double* loss, T* dz, const T* z, int V,
                                                           const int32_t* y, double scale) {
  constexpr int kLanes = 8;
  using Lanes [[gnu::vector_size(kLanes * sizeof(double))]] = double;
  using Values [[gnu::vector_size(kLanes * sizeof(T))]] = T;
  T zmax[R];
  row_max<T, R>(zmax, z, V, V);
  for (int r = 0; r < R; ++r) {
    const T* zr = z + int64_t{r} * V;
    T* dr = dz + int64_t{r} * V;
    for (int v = 0; v < V; ++v) dr[v] = kernel_exp(zr[v] - zmax[r]);
  }
  Lanes part[R];
  for (int r = 0; r < R; ++r) part[r] = Lanes{};
  int v0 = 0;
  for (; v0 + kLanes <= V; v0 += kLanes) {
    for (int r = 0; r < R; ++r) {
      Values e;
      row_load(e, dz + int64_t{r} * V + v0);
      part[r] += __builtin_convertvector(e, Lanes);
    }
  }
  for (int v = v0; v < V; ++v) {
    for (int r = 0; r < R; ++r) part[r][0] += static_cast<double>(dz[int64_t{r} * V + v]);
  }
  double sum[R];
  for (int r = 0; r < R; ++r) sum[r] = 0.0;
  for (int i = 0; i < kLanes; ++i) {
    for (int r = 0; r < R; ++r) sum[r] += part[r][i];
  }
  for (int r = 0; r < R; ++r) {
    const T* zr = z + int64_t{r} * V;
    T* dr = dz + int64_t{r} * V;
    loss[r] = det::log(sum[r]) + static_cast<double>(zmax[r]) - static_cast<double>(zr[y[r]]);
    // loss = log Σ exp(z) − z[y]  =>  ∂loss/∂z[v] = softmax(z)[v] − [v == y]
    const T factor = static_cast<T>(scale / sum[r]);
    for (int v = 0; v < V; ++v) dr[v] *= factor;
    dr[y[r]] -= static_cast<T>(scale);
  }
}

// `rows` rows, V apart, kRowsAtOnce at a time.
template <class T>
[[gnu::always_inline]] inline void cross_entropy_rows_groups(double* loss, T* dz, const T* z,
                                                             int rows, int V, const int32_t* y,
                                                             double scale) {
  for_row_groups(
      rows, [&](auto R, int r) __attribute__((always_inline)) {
        const int64_t at = int64_t{r} * V;
        cross_entropy_rows_impl<T, R.value>(loss + r, dz + at, z + at, V, y + r, scale);
      });
}

}  // namespace moe
