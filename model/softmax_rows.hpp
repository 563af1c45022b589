// The row kernels of the attention core's masked softmax, forward and backward, and the lane
// reductions they use. In float each call runs at the CPU's instruction-set level
// (model/simd.hpp); in double (the gradient checks) it is the same code, inline.
// Legend: n columns of a row (the keys a query tile sees), [first, last] the columns one query
// row sees.
#pragma once

#include <algorithm>
#include <limits>

#include "model/fast_exp.hpp"

namespace moe {

// Lanes of the row reductions: 16 independent accumulators, so that the loops vectorise (one
// serial chain of maxss/addss costs a latency per element), added in a fixed order at the end:
// the result depends on n and the values only, not on the vector width.
inline constexpr int kRowLanes = 16;

// max_c x[c] over n >= 1 elements; exact, so the same whatever the order of comparisons.
template <class T> [[gnu::always_inline]] inline T row_max(const T* x, int n) {
  T acc[kRowLanes];
  std::fill(acc, acc + kRowLanes, -std::numeric_limits<T>::infinity());
  int c0 = 0;
  for (; c0 + kRowLanes <= n; c0 += kRowLanes) {
    for (int i = 0; i < kRowLanes; ++i) acc[i] = std::max(acc[i], x[c0 + i]);
  }
  for (int c = c0; c < n; ++c) acc[0] = std::max(acc[0], x[c]);
  return *std::max_element(acc, acc + kRowLanes);
}

// Σ_c x[c] in kRowLanes partial sums.
template <class T> [[gnu::always_inline]] inline T row_sum(const T* x, int n) {
  T acc[kRowLanes] = {};
  int c0 = 0;
  for (; c0 + kRowLanes <= n; c0 += kRowLanes) {
    for (int i = 0; i < kRowLanes; ++i) acc[i] += x[c0 + i];
  }
  for (int c = c0; c < n; ++c) acc[0] += x[c];
  T total = T(0);
  for (int i = 0; i < kRowLanes; ++i) total += acc[i];
  return total;
}

// Σ_c x[c]·y[c] in kRowLanes partial sums.
template <class T> [[gnu::always_inline]] inline T row_dot(const T* x, const T* y, int n) {
  T acc[kRowLanes] = {};
  int c0 = 0;
  for (; c0 + kRowLanes <= n; c0 += kRowLanes) {
    for (int i = 0; i < kRowLanes; ++i) acc[i] += x[c0 + i] * y[c0 + i];
  }
  for (int c = c0; c < n; ++c) acc[0] += x[c] * y[c];
  T sum = T(0);
  for (int i = 0; i < kRowLanes; ++i) sum += acc[i];
  return sum;
}

// In place over a row of n scores: the visible columns [first, last] become P = softmax over them
// (the row max subtracted, so that exp cannot overflow), every other column exactly 0, so that
// P·v adds nothing from them.
template <class T>
[[gnu::always_inline]] inline void softmax_row_masked_impl(T* pr, int first, int last, int n) {
  const int count = last - first + 1;
  const T z_max = row_max(pr + first, count);
  for (int c = first; c <= last; ++c) pr[c] = kernel_exp(pr[c] - z_max);
  const T inv_sum = T(1) / row_sum(pr + first, count);
  for (int c = first; c <= last; ++c) pr[c] *= inv_sum;
  std::fill(pr, pr + first, T(0));
  std::fill(pr + last + 1, pr + n, T(0));
}

// P = softmax_row(z)  ->  d_z = P ⊙ (d_P − rowsum(d_P ⊙ P)), in place of d_P over n columns.
// Masked entries have P = 0 exactly: they add nothing to the row sum and get d_z = 0.
template <class T>
[[gnu::always_inline]] inline void softmax_row_backward_impl(T* dr, const T* pr, int n) {
  const T p_dot_dp = row_dot(pr, static_cast<const T*>(dr), n);
  for (int c = 0; c < n; ++c) dr[c] = pr[c] * (dr[c] - p_dot_dp);
}

void softmax_row_masked(float* pr, int first, int last, int n);
void softmax_row_backward(float* dr, const float* pr, int n);
inline void softmax_row_masked(double* pr, int first, int last, int n) {
  softmax_row_masked_impl(pr, first, last, n);
}
inline void softmax_row_backward(double* dr, const double* pr, int n) {
  softmax_row_backward_impl(dr, pr, n);
}

}  // namespace moe
