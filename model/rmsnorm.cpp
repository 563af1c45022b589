// RMSNorm forward and backward as plain row loops.
// Legend: N rows/tokens, D model width.
//
// With x̂ = x·r, r = (mean(x²) + eps)^(-1/2) and out = x̂·w:
//   ∂r/∂x_i = -r³·x_i/D, so ∂L/∂x_i = r·(g_i − x̂_i·mean_j(g_j·x̂_j)) with g = d_out·w.
#include "model/rmsnorm.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "model/parallel.hpp"

namespace moe {

// Columns a rmsnorm_backward weight-gradient pass keeps in registers.
constexpr int kColBlock = 64;

template <class T>
void rmsnorm_forward(T* out, T* rstd, const T* in, const T* weight, int N, int D, float eps) {
#pragma omp parallel for schedule(static) if (N >= kParallelRows)
  for (int n = 0; n < N; ++n) {
    const T* x = in + int64_t{n} * D;
    T* y = out + int64_t{n} * D;
    double sum_sq = 0.0;
    for (int d = 0; d < D; ++d) sum_sq += double(x[d]) * double(x[d]);
    const double r = 1.0 / std::sqrt(sum_sq / D + double(eps));
    rstd[n] = T(r);
    for (int d = 0; d < D; ++d) y[d] = x[d] * rstd[n] * weight[d];
  }
}

namespace {

// d_in rows [n0, n1): rows are independent.
template <class T>
void backward_rows(T* d_in, const T* d_out, const T* in, const T* weight, const T* rstd, int n,
                   int D) {
  const T* x = in + int64_t{n} * D;
  const T* dy = d_out + int64_t{n} * D;
  T* dx = d_in + int64_t{n} * D;
  const T r = rstd[n];
  // mean_j(g_j·x̂_j), g = d_out·w, x̂ = x·r: the part of the gradient that flows through r.
  double dot = 0.0;
  for (int d = 0; d < D; ++d) dot += double(dy[d] * weight[d]) * double(x[d] * r);
  const T mean_gx = T(dot / D);
  for (int d = 0; d < D; ++d) {
    const T x_hat = x[d] * r;
    // out = x·r·w, r = (mean(x²)+eps)^(-1/2)  ->  d_x += r·(d_out·w − x̂·mean(d_out·w·x̂))
    dx[d] += r * (dy[d] * weight[d] - x_hat * mean_gx);
  }
}

// out = x̂·w  ->  d_w[d0, d0 + kColBlock) += d_out·x̂ over rows [n0, n1), each column adding its
// rows in order, walking the rows once.
template <class T>
void weight_columns(T* d_weight, const T* d_out, const T* in, const T* rstd, int n0, int n1, int d0,
                    int D) {
  const int cols = std::min(kColBlock, D - d0);
  T acc[kColBlock];
  for (int c = 0; c < cols; ++c) acc[c] = d_weight[d0 + c];
  for (int n = n0; n < n1; ++n) {
    const T* dy = d_out + int64_t{n} * D + d0;
    const T* x = in + int64_t{n} * D + d0;
    const T r = rstd[n];
    for (int c = 0; c < cols; ++c) acc[c] += dy[c] * (x[c] * r);
  }
  for (int c = 0; c < cols; ++c) d_weight[d0 + c] = acc[c];
}

}  // namespace

template <class T>
void rmsnorm_backward(T* d_in, T* d_weight, const T* d_out, const T* in, const T* weight,
                      const T* rstd, int N, int D) {
  // Rows are independent for d_in; d_weight sums over rows, each column adding its rows in order
  // n = 0, 1, …: the same sums whatever the threads. The columns go in blocks that walk the rows
  // once, row by row, rather than column by column down the rows.
  const int col_blocks = (D + kColBlock - 1) / kColBlock;
#pragma omp parallel if (N >= kParallelRows)
  {
#pragma omp for schedule(static) nowait
    for (int n = 0; n < N; ++n) backward_rows(d_in, d_out, in, weight, rstd, n, D);
#pragma omp for schedule(static)
    for (int cb = 0; cb < col_blocks; ++cb) {
      weight_columns(d_weight, d_out, in, rstd, 0, N, cb * kColBlock, D);
    }
  }
}

template <class T>
void rmsnorm_backward_sequences(T* d_in, T* leaves, const T* d_out, const T* in, const T* weight,
                                const T* rstd, int B, int S, int D) {
  const int N = B * S, col_blocks = (D + kColBlock - 1) / kColBlock;
  std::fill(leaves, leaves + int64_t{B} * D, T(0));
  // One region for all the sequences: the rows, then a task per (sequence, column block).
#pragma omp parallel if (N >= kParallelRows)
  {
#pragma omp for schedule(static) nowait
    for (int n = 0; n < N; ++n) backward_rows(d_in, d_out, in, weight, rstd, n, D);
#pragma omp for schedule(static)
    for (int task = 0; task < B * col_blocks; ++task) {
      const int b = task / col_blocks, d0 = (task % col_blocks) * kColBlock;
      weight_columns(leaves + int64_t{b} * D, d_out, in, rstd, b * S, (b + 1) * S, d0, D);
    }
  }
}

template void rmsnorm_forward<float>(float*, float*, const float*, const float*, int, int, float);
template void rmsnorm_forward<double>(double*, double*, const double*, const double*, int, int,
                                      float);
template void rmsnorm_backward<float>(float*, float*, const float*, const float*, const float*,
                                      const float*, int, int);
template void rmsnorm_backward<double>(double*, double*, const double*, const double*,
                                       const double*, const double*, int, int);
template void rmsnorm_backward_sequences<float>(float*, float*, const float*, const float*,
                                                const float*, const float*, int, int, int);
template void rmsnorm_backward_sequences<double>(double*, double*, const double*, const double*,
                                                 const double*, const double*, int, int, int);

}  // namespace moe
