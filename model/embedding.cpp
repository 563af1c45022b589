// Embedding and cross-entropy loops: the embedding is memory-bound and kept plain; the
// cross-entropy's rows run as parallel tasks, each at the CPU's instruction-set level.
#include "model/embedding.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "model/parallel.hpp"
#include "model/simd.hpp"

namespace moe {

namespace {

MOE_SIMD_KERNEL(cross_entropy_rows, cross_entropy_rows_groups,
                (double* loss, float* dz, const float* z, int rows, int V, const int32_t* y,
                 double scale),
                (loss, dz, z, rows, V, y, scale))

// The gradient checks' double rows: the same code, inline.
void cross_entropy_rows(double* loss, double* dz, const double* z, int rows, int V,
                        const int32_t* y, double scale) {
  cross_entropy_rows_groups(loss, dz, z, rows, V, y, scale);
}

}  // namespace

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
  // Rows are independent tasks of kRowsAtOnce rows; their losses are added in row order
  // afterwards, so the total does not depend on the threads.
  parallel_tasks((N + kRowsAtOnce - 1) / kRowsAtOnce, [&](int64_t task) {
    const int t = static_cast<int>(task) * kRowsAtOnce;
    const size_t at = static_cast<size_t>(t) * V;
    cross_entropy_rows(&row_loss[t], d_logits + at, logits + at, std::min(kRowsAtOnce, N - t), V,
                       targets + t, scale);
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
