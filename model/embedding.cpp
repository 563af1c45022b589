// Embedding and cross-entropy loops: the embedding is memory-bound and kept plain; the
// cross-entropy's rows run as parallel tasks.
#include "model/embedding.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "model/fast_exp.hpp"
#include "model/parallel.hpp"
#include "numeric/det_math.hpp"

namespace moe {

template <class T>
void embedding_forward(T* out, const int32_t* ids, const T* table, int N, int D, int V) {
  for (int t = 0; t < N; ++t) {
    const int32_t id = ids[t];
    if (id < 0 || id >= V) {
      throw std::out_of_range("embedding: token id " + std::to_string(id) + " at position " +
                              std::to_string(t) + " is outside the vocabulary [0, " +
                              std::to_string(V) + ")");
    }
    std::copy_n(table + static_cast<size_t>(id) * D, D, out + static_cast<size_t>(t) * D);
  }
}

template <class T>
void embedding_backward(T* d_table, const T* d_out, const int32_t* ids, int N, int D) {
  // out[t] = table[ids[t]]  =>  d_table[ids[t]] += d_out[t]
  for (int t = 0; t < N; ++t) {
    T* row = d_table + static_cast<size_t>(ids[t]) * D;
    const T* g = d_out + static_cast<size_t>(t) * D;
    for (int c = 0; c < D; ++c) row[c] += g[c];
  }
}

template <class T>
double cross_entropy_forward_backward(T* d_logits, double* row_loss, const T* logits,
                                      const int32_t* targets, int N, int V, double scale) {
  for (int t = 0; t < N; ++t) {
    if (targets[t] < 0 || targets[t] >= V) {
      throw std::out_of_range("cross-entropy: target id " + std::to_string(targets[t]) +
                              " is outside the vocabulary [0, " + std::to_string(V) + ")");
    }
  }
  // Rows are independent tasks; their losses are added in row order afterwards, so the total
  // does not depend on the threads.
  parallel_tasks(N, [&](int64_t t) {
    const T* z = logits + static_cast<size_t>(t) * V;
    T* dz = d_logits + static_cast<size_t>(t) * V;
    const int32_t y = targets[t];
    const T zmax = *std::max_element(z, z + V);
    // exp(z − max) once, kept in dz (vectorised: kernel_exp); the sum in double, in kLanes
    // partial sums added in a fixed order.
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
    row_loss[t] = det::log(sum) + static_cast<double>(zmax) - static_cast<double>(z[y]);
    // loss_t = log Σ exp(z) − z[y]  =>  ∂loss_t/∂z[v] = softmax(z)[v] − [v == y]
    const T factor = static_cast<T>(scale / sum);
    for (int v = 0; v < V; ++v) dz[v] *= factor;
    dz[y] -= static_cast<T>(scale);
  });
  double total = 0.0;
  for (int t = 0; t < N; ++t) total += row_loss[t];
  return total;
}

#define MOE_EMBEDDING_INSTANTIATE(T)                                                            \
  template void embedding_forward<T>(T*, const int32_t*, const T*, int, int, int);              \
  template void embedding_backward<T>(T*, const T*, const int32_t*, int, int);                  \
  template double cross_entropy_forward_backward<T>(T*, double*, const T*, const int32_t*, int, \
                                                    int, double);
MOE_EMBEDDING_INSTANTIATE(float)
MOE_EMBEDDING_INSTANTIATE(double)
#undef MOE_EMBEDDING_INSTANTIATE

}  // namespace moe
