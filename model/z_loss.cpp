// The router z-loss (z_loss.hpp): log-sum-exp per row with the row's maximum subtracted, so that
// no exp overflows at any logit.
#include "model/z_loss.hpp"

#include <algorithm>
#include <cstdint>

#include "model/parallel.hpp"
#include "model/tree_sum.hpp"
#include "numeric/det_math.hpp"

namespace moe {
namespace {

// z = log Σ_e exp(row[e]) = m + log Σ_e exp(row[e] − m), m the row's maximum (a NaN logit makes
// z NaN, and the step's non-finite check stops the run). `sum` gets Σ_e exp(row[e] − m).
template <class T> double log_sum_exp(const T* row, int E, double& max, double& sum) {
  max = static_cast<double>(*std::max_element(row, row + E));
  sum = 0.0;
  for (int e = 0; e < E; ++e) sum += det::exp(static_cast<double>(row[e]) - max);
  return max + det::log(sum);
}

}  // namespace

template <class T>
double router_z_loss_forward(const T* logits, int B, int S, int E, double weight) {
  TreeSumScalar total;
  for (int b = 0; b < B; ++b) {
    double sequence = 0.0;  // Σ_t z_t² over the sequence's rows, in order
    for (int t = b * S; t < (b + 1) * S; ++t) {
      double max = 0.0, sum = 0.0;
      const double z = log_sum_exp(logits + int64_t{t} * E, E, max, sum);
      sequence += z * z;
    }
    total.push(weight * sequence);
  }
  return total.finish();
}

template <class T>
void router_z_loss_backward(T* d_logits, const T* logits, int N, int E, double weight) {
#pragma omp parallel for schedule(static) if (N >= kParallelRows)
  for (int n = 0; n < N; ++n) {
    const T* row = logits + int64_t{n} * E;
    double max = 0.0, sum = 0.0;
    const double z = log_sum_exp(row, E, max, sum);
    const double scale = weight * 2.0 * z / sum;  // · exp(row[e] − max) is 2·z·softmax[e]
    T* d = d_logits + int64_t{n} * E;
    for (int e = 0; e < E; ++e) {
      d[e] += static_cast<T>(scale * det::exp(static_cast<double>(row[e]) - max));
    }
  }
}

#define MOE_Z_LOSS_INSTANTIATE(T)                                            \
  template double router_z_loss_forward<T>(const T*, int, int, int, double); \
  template void router_z_loss_backward<T>(T*, const T*, int, int, double);
MOE_Z_LOSS_INSTANTIATE(float)
MOE_Z_LOSS_INSTANTIATE(double)
#undef MOE_Z_LOSS_INSTANTIATE

}  // namespace moe
