// RMSNorm forward and backward as row loops, the backward's rows in groups whose serial sums run
// side by side.
// Legend: N rows/tokens, D model width.
//
// With x̂ = x·r, r = (mean(x²) + eps)^(-1/2) and out = x̂·w:
//   ∂r/∂x_i = -r³·x_i/D, so ∂L/∂x_i = r·(g_i − x̂_i·mean_j(g_j·x̂_j)) with g = d_out·w.
#include "model/rmsnorm.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "model/parallel.hpp"
#include "model/simd.hpp"

namespace moe {

// Columns a rmsnorm_backward weight-gradient pass keeps in registers.
constexpr int kColBlock = 64;

namespace {

// Rows whose serial sums run side by side in the backward. A row's dot product is one chain of D
// dependent double adds in d order, each waiting a few cycles on the last; with the chains of
// kRowGroup rows interleaved, each add waits on its own row's last one only. Every row's sum is
// the same chain as alone: the bits depend neither on the group nor on the rows around it. (The
// forward's sum of squares in the same groups ran 1.6x faster in bench_row_kernels but not inside
// a step, where its share of deepseek4-tiny's samples rose from 1.0% to 1.2%: it stays a row at a
// time.)
constexpr int kRowGroup = 8;

// Columns of a group's terms computed at once, ahead of their chains.
constexpr int kTermBlock = 64;

int row_groups(int N) {
  return (N + kRowGroup - 1) / kRowGroup;
}

// The first element of each of the kRowGroup chains of the group of rows [n0, n0 + rows): a short
// group repeats its last row in the chains it does not fill (read, never written out).
[[gnu::always_inline]] inline void group_rows(int64_t* at, int n0, int rows, int D) {
  for (int i = 0; i < kRowGroup; ++i) at[i] = int64_t{n0 + std::min(i, rows - 1)} * D;
}

// d_in += the gradient of rows [n0, n0 + rows), rows <= kRowGroup (rows are independent).
template <class T>
[[gnu::always_inline]] inline void backward_group(T* d_in, const T* d_out, const T* in,
                                                  const T* weight, const T* rstd, int n0, int rows,
                                                  int D) {
  int64_t at[kRowGroup];
  group_rows(at, n0, rows, D);
  T r[kRowGroup];
  for (int i = 0; i < kRowGroup; ++i) r[i] = rstd[n0 + std::min(i, rows - 1)];
  // Σ_j g_j·x̂_j in double, in d order, g = d_out·w, x̂ = x·r: the part of the gradient that flows
  // through r. The terms first, row by row (along d, in vectors), then the kRowGroup chains.
  double dot[kRowGroup] = {};
  for (int d0 = 0; d0 < D; d0 += kTermBlock) {
    const int len = std::min(kTermBlock, D - d0);
    double term[kRowGroup][kTermBlock];
    for (int i = 0; i < kRowGroup; ++i) {
      const T* dy = d_out + at[i] + d0;
      const T* x = in + at[i] + d0;
      for (int d = 0; d < len; ++d) {
        term[i][d] = double(dy[d] * weight[d0 + d]) * double(x[d] * r[i]);
      }
    }
    for (int d = 0; d < len; ++d) {
      for (int i = 0; i < kRowGroup; ++i) dot[i] += term[i][d];
    }
  }
  for (int i = 0; i < rows; ++i) {
    const T* x = in + at[i];
    const T* dy = d_out + at[i];
    T* dx = d_in + at[i];
    const T ri = r[i], mean_gx = T(dot[i] / D);
    for (int d = 0; d < D; ++d) {
      const T x_hat = x[d] * ri;
      // out = x·r·w, r = (mean(x²)+eps)^(-1/2)  ->  d_x += r·(d_out·w − x̂·mean(d_out·w·x̂))
      dx[d] += ri * (dy[d] * weight[d] - x_hat * mean_gx);
    }
  }
}

// The float groups at the CPU's instruction-set level (model/simd.hpp): IEEE operations only, the
// same bits at every level; double (the gradient checks) runs the same code inline.
MOE_SIMD_KERNEL(backward_group_f32, backward_group,
                (float* d_in, const float* d_out, const float* in, const float* weight,
                 const float* rstd, int n0, int rows, int D),
                (d_in, d_out, in, weight, rstd, n0, rows, D))

template <class T>
void backward_rows(T* d_in, const T* d_out, const T* in, const T* weight, const T* rstd, int n0,
                   int rows, int D) {
  if constexpr (std::is_same_v<T, float>) {
    backward_group_f32(d_in, d_out, in, weight, rstd, n0, rows, D);
  } else {
    backward_group(d_in, d_out, in, weight, rstd, n0, rows, D);
  }
}

}  // namespace

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
    for (int g = 0; g < row_groups(N); ++g) {
      const int n0 = g * kRowGroup;
      backward_rows(d_in, d_out, in, weight, rstd, n0, std::min(kRowGroup, N - n0), D);
    }
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
    for (int g = 0; g < row_groups(N); ++g) {
      const int n0 = g * kRowGroup;
      backward_rows(d_in, d_out, in, weight, rstd, n0, std::min(kRowGroup, N - n0), D);
    }
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
