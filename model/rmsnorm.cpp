// RMSNorm forward and backward as plain row loops.
// Legend: N rows/tokens, D model width.
//
// With x̂ = x·r, r = (mean(x²) + eps)^(-1/2) and out = x̂·w:
//   ∂r/∂x_i = -r³·x_i/D, so ∂L/∂x_i = r·(g_i − x̂_i·mean_j(g_j·x̂_j)) with g = d_out·w.
#include "model/rmsnorm.hpp"

#include <cmath>
#include <cstdint>

namespace moe {

template <class T>
void rmsnorm_forward(T* out, T* rstd, const T* in, const T* weight, int N, int D, float eps) {
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

template <class T>
void rmsnorm_backward(T* d_in, T* d_weight, const T* d_out, const T* in, const T* weight,
                      const T* rstd, int N, int D) {
  for (int n = 0; n < N; ++n) {
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
      // out = x̂·w  ->  d_w += d_out·x̂
      d_weight[d] += dy[d] * x_hat;
      // out = x·r·w, r = (mean(x²)+eps)^(-1/2)  ->  d_x += r·(d_out·w − x̂·mean(d_out·w·x̂))
      dx[d] += r * (dy[d] * weight[d] - x_hat * mean_gx);
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

}  // namespace moe
