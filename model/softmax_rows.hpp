// The row kernels of the attention core's masked softmax, forward and backward, and the lane
// reductions they use (the LM head's cross-entropy rows use them too, model/embedding.hpp). Rows
// go R at a time, their serial chains side by side. In float each call runs at the CPU's
// instruction-set level (model/simd.hpp); in double (the gradient checks) it is the same code,
// inline.
// Legend: n columns of a row (the keys a query tile sees), [first, last] the columns one query
// row sees, R rows at a time, ld between rows.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "model/fast_exp.hpp"

namespace moe {

// Lanes of the row reductions: 16 independent accumulators, so that the loops vectorise (one
// serial chain of maxss/addss costs a latency per element), added in a fixed order at the end:
// the result depends on n and the values only, not on the vector width.
inline constexpr int kRowLanes = 16;

// The reductions below run over R rows at once, row r at x + r·ld: each row's operations are the
// ones it has alone, in the same order, and the R rows' serial chains (the vector loop, then the
// 16 lanes) run side by side instead of one row's after another's. RowVec holds a row's 16 lane
// accumulators as one GCC vector: lane i is acc[i] of the plain loop, element for element the
// same operations (no contraction: the build turns it off), in as many registers as the level's
// width needs.
template <class T> using RowVec [[gnu::vector_size(kRowLanes * sizeof(T))]] = T;
// v = the kRowLanes values at p (by reference: a vector returned by value would change the ABI
// between levels).
template <class V, class T> [[gnu::always_inline]] inline void row_load(V& v, const T* p) {
  std::memcpy(&v, p, sizeof v);
}

// max_c x[c] over n >= 1 elements of each row; exact, so the same whatever the order of
// comparisons. Each lane as std::max(acc, x), then the lanes as std::max_element takes them.
template <class T, int R>
[[gnu::always_inline]] inline void row_max(T (&out)[R], const T* x, int64_t ld, int n) {
  RowVec<T> acc[R];
  for (int r = 0; r < R; ++r) acc[r] = RowVec<T>{} - std::numeric_limits<T>::infinity();
  int c0 = 0;
  for (; c0 + kRowLanes <= n; c0 += kRowLanes) {
    for (int r = 0; r < R; ++r) {
      RowVec<T> v;
      row_load(v, x + r * ld + c0);
      acc[r] = acc[r] < v ? v : acc[r];
    }
  }
  for (int c = c0; c < n; ++c) {
    for (int r = 0; r < R; ++r) acc[r][0] = std::max(acc[r][0], x[r * ld + c]);
  }
  for (int r = 0; r < R; ++r) out[r] = acc[r][0];
  for (int i = 1; i < kRowLanes; ++i) {
    for (int r = 0; r < R; ++r) {
      if (out[r] < acc[r][i]) out[r] = acc[r][i];
    }
  }
}

// Σ_c x[c] of each row in kRowLanes partial sums, then the partial sums in lane order.
template <class T, int R>
[[gnu::always_inline]] inline void row_sum(T (&out)[R], const T* x, int64_t ld, int n) {
  RowVec<T> acc[R];
  for (int r = 0; r < R; ++r) acc[r] = RowVec<T>{};
  int c0 = 0;
  for (; c0 + kRowLanes <= n; c0 += kRowLanes) {
    for (int r = 0; r < R; ++r) {
      RowVec<T> v;
      row_load(v, x + r * ld + c0);
      acc[r] += v;
    }
  }
  for (int c = c0; c < n; ++c) {
    for (int r = 0; r < R; ++r) acc[r][0] += x[r * ld + c];
  }
  for (int r = 0; r < R; ++r) out[r] = T(0);
  for (int i = 0; i < kRowLanes; ++i) {
    for (int r = 0; r < R; ++r) out[r] += acc[r][i];
  }
}

// Σ_c x[c]·y[c] of each row (x's and y's rows ld apart) in kRowLanes partial sums.
template <class T, int R>
[[gnu::always_inline]] inline void row_dot(T (&out)[R], const T* x, const T* y, int64_t ld, int n) {
  RowVec<T> acc[R];
  for (int r = 0; r < R; ++r) acc[r] = RowVec<T>{};
  int c0 = 0;
  for (; c0 + kRowLanes <= n; c0 += kRowLanes) {
    for (int r = 0; r < R; ++r) {
      RowVec<T> a, b;
      row_load(a, x + r * ld + c0);
      row_load(b, y + r * ld + c0);
      acc[r] += a * b;
    }
  }
  for (int c = c0; c < n; ++c) {
    for (int r = 0; r < R; ++r) acc[r][0] += x[r * ld + c] * y[r * ld + c];
  }
  for (int r = 0; r < R; ++r) out[r] = T(0);
  for (int i = 0; i < kRowLanes; ++i) {
    for (int r = 0; r < R; ++r) out[r] += acc[r][i];
  }
}

// In place over R rows of n scores, ld apart, that see the same columns: the visible columns
// [first, last] become P = softmax over them (the row max subtracted, so that exp cannot
// overflow), every other column exactly 0, so that P·v adds nothing from them.
template <class T, int R>
[[gnu::always_inline]] inline void softmax_rows_masked_impl(T* p, int64_t ld, int first, int last,
                                                            int n) {
  const int count = last - first + 1;
  T z_max[R], sum[R];
  row_max<T, R>(z_max, p + first, ld, count);
  for (int r = 0; r < R; ++r) {
    T* pr = p + r * ld;
    for (int c = first; c <= last; ++c) pr[c] = kernel_exp(pr[c] - z_max[r]);
  }
  row_sum<T, R>(sum, p + first, ld, count);
  for (int r = 0; r < R; ++r) {
    T* pr = p + r * ld;
    const T inv_sum = T(1) / sum[r];
    for (int c = first; c <= last; ++c) pr[c] *= inv_sum;
    std::fill(pr, pr + first, T(0));
    std::fill(pr + last + 1, pr + n, T(0));
  }
}

// P = softmax_row(z)  ->  d_z = P ⊙ (d_P − rowsum(d_P ⊙ P)), in place of d_P over n columns, for
// R rows ld apart. Masked entries have P = 0 exactly: they add nothing to the row sum and get
// d_z = 0.
template <class T, int R>
[[gnu::always_inline]] inline void softmax_rows_backward_impl(T* d, const T* p, int64_t ld, int n) {
  T p_dot_dp[R];
  row_dot<T, R>(p_dot_dp, p, static_cast<const T*>(d), ld, n);
  for (int r = 0; r < R; ++r) {
    T* dr = d + r * ld;
    const T* pr = p + r * ld;
    for (int c = 0; c < n; ++c) dr[c] = pr[c] * (dr[c] - p_dot_dp[r]);
  }
}

// Rows taken together by the kernels below: four rows' chains hide each other's latencies.
inline constexpr int kRowsAtOnce = 4;

// rows_of(R, r) for the rows [r, r + R), R a std::integral_constant: kRowsAtOnce rows at a time,
// then one at a time. Each row's arithmetic is that of a row alone. Inside a per-level kernel
// (model/simd.hpp) rows_of must be __attribute__((always_inline)), or it may stay one shared
// function compiled for the baseline.
template <class F> [[gnu::always_inline]] inline void for_row_groups(int rows, F&& rows_of) {
  int r = 0;
  for (; r + kRowsAtOnce <= rows; r += kRowsAtOnce) {
    rows_of(std::integral_constant<int, kRowsAtOnce>{}, r);
  }
  for (; r < rows; ++r) rows_of(std::integral_constant<int, 1>{}, r);
}

template <class T>
[[gnu::always_inline]] inline void softmax_rows_masked_groups(T* p, int64_t ld, int rows, int first,
                                                              int last, int n) {
  for_row_groups(
      rows, [&](auto R, int r) __attribute__((always_inline)) {
        softmax_rows_masked_impl<T, R.value>(p + r * ld, ld, first, last, n);
      });
}
template <class T>
[[gnu::always_inline]] inline void softmax_rows_backward_groups(T* d, const T* p, int64_t ld,
                                                                int rows, int n) {
  for_row_groups(
      rows, [&](auto R, int r) __attribute__((always_inline)) {
        softmax_rows_backward_impl<T, R.value>(d + r * ld, p + r * ld, ld, n);
      });
}

// `rows` rows ld apart (p, and d's rows where p's are).
void softmax_rows_masked(float* p, int64_t ld, int rows, int first, int last, int n);
void softmax_rows_backward(float* d, const float* p, int64_t ld, int rows, int n);
inline void softmax_rows_masked(double* p, int64_t ld, int rows, int first, int last, int n) {
  softmax_rows_masked_groups(p, ld, rows, first, last, n);
}
inline void softmax_rows_backward(double* d, const double* p, int64_t ld, int rows, int n) {
  softmax_rows_backward_groups(d, p, ld, rows, n);
}

}  // namespace moe
