// The checked GEMM (argument checks, then model/gemm/'s kernels), thread control and the kernels'
// description.
// Legend: M, N, K are the GEMM's dimensions, C[M,N] = op(A)[M,K]·op(B)[K,N].
#include "model/blas.hpp"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "comm/mpi_check.hpp"
#include "model/gemm/gemm.hpp"

namespace moe {
namespace {

struct GemmShape {
  bool trans_a;
  bool trans_b;
  int M, N, K;
};

std::string gemm_shape_text(const GemmShape& s) {
  const std::string m = std::to_string(s.M), n = std::to_string(s.N), k = std::to_string(s.K);
  return "M=" + m + " N=" + n + " K=" + k + ", A " + (s.trans_a ? "[K,M]ᵀ" : "[M,K]") + ", B " +
         (s.trans_b ? "[N,K]ᵀ" : "[K,N]") + ", C [M,N]";
}

std::string where_text(const std::source_location& where) {
  return std::string(where.file_name()) + ":" + std::to_string(where.line()) + ", rank " +
         std::to_string(mpi_world_rank_or_minus_one());
}

[[noreturn]] void blas_fail(const char* call, const char* failed, const GemmShape& shape,
                            const std::source_location& where) {
  throw BlasError(std::string(call) + " refused: " + failed + " does not hold for " +
                  gemm_shape_text(shape) + " (called from " + where_text(where) + ")");
}

bool fits_int(int64_t elements) {
  return elements <= INT_MAX;
}

}  // namespace
}  // namespace moe

// The check is of the arguments, before the call: names the routine, the failed condition, the
// shapes, the caller's file:line and the rank.
#define MOE_BLAS_CHECK(cond, call, shape, where)                    \
  do {                                                              \
    if (!(cond)) ::moe::blas_fail((call), #cond, (shape), (where)); \
  } while (0)

namespace moe {
namespace {

std::atomic<GemmObserver> g_observer{nullptr};  // gemm_observe

// run() on the clock when an observer is set, then the call's timing to it.
template <class Run>
void observed(const std::source_location& where, const GemmShape& shape, bool leaf_tree,
              Run&& run) {
  const GemmObserver observer = g_observer.load(std::memory_order_relaxed);
  if (observer == nullptr) {
    run();
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  run();
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  observer({.where = where,
            .trans_a = shape.trans_a,
            .trans_b = shape.trans_b,
            .leaf_tree = leaf_tree,
            .M = shape.M,
            .N = shape.N,
            .K = shape.K,
            .seconds = took.count()});
}

template <class T>
void gemm_call(bool trans_a, bool trans_b, int M, int N, int K, T alpha, const T* A, int lda,
               const T* B, int ldb, T beta, T* C, int ldc) {
  gemm_detail::gemm_run<T>({trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc});
}

}  // namespace

template <class T>
void gemm(bool trans_a, bool trans_b, int M, int N, int K, T alpha, const T* A, const T* B, T beta,
          T* C, std::source_location where) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>);
  const char* call = std::is_same_v<T, float> ? "sgemm" : "dgemm";
  const GemmShape shape{trans_a, trans_b, M, N, K};
  MOE_BLAS_CHECK(M >= 0 && N >= 0 && K >= 0, call, shape, where);
  // The dimensions and CBLAS's leading dimensions are int: a matrix of more elements than an int
  // holds is beyond what this runtime sizes, and most likely an overflowed product upstream.
  MOE_BLAS_CHECK(fits_int(int64_t{M} * K) && fits_int(int64_t{K} * N) && fits_int(int64_t{M} * N),
                 call, shape, where);
  if (M == 0 || N == 0) return;
  MOE_BLAS_CHECK(C != nullptr, call, shape, where);
  const int64_t size_c = int64_t{M} * N;
  if (K == 0) {
    // No products: the contract's empty chain s = +0 (model/gemm/gemm.hpp), C = s·alpha + beta·C,
    // which is reference BLAS's beta·C but for the sign of a zero.
    const T s = alpha != T(1) ? T(0) * alpha : T(0);
    for (int64_t i = 0; i < size_c; ++i) C[i] = beta == T(0) ? s : s + beta * C[i];
    return;
  }
  MOE_BLAS_CHECK(A != nullptr && B != nullptr, call, shape, where);
  const int lda = trans_a ? M : K;  // row length of A as stored
  const int ldb = trans_b ? K : N;  // row length of B as stored
  observed(where, shape, false,
           [&] { gemm_call(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, N); });
}

template void gemm<float>(bool, bool, int, int, int, float, const float*, const float*, float,
                          float*, std::source_location);
template void gemm<double>(bool, bool, int, int, int, double, const double*, const double*, double,
                           double*, std::source_location);

template <class T>
void gemm_ld(bool trans_a, bool trans_b, int M, int N, int K, T alpha, const T* A, int lda,
             const T* B, int ldb, T beta, T* C, int ldc, std::source_location where) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>);
  const char* call = std::is_same_v<T, float> ? "sgemm" : "dgemm";
  const GemmShape shape{trans_a, trans_b, M, N, K};
  MOE_BLAS_CHECK(M >= 0 && N >= 0 && K >= 0, call, shape, where);
  // As stored, A has rows_a rows of lda, B rows_b rows of ldb, C M rows of ldc.
  const int rows_a = trans_a ? K : M, cols_a = trans_a ? M : K;
  const int rows_b = trans_b ? N : K, cols_b = trans_b ? K : N;
  MOE_BLAS_CHECK(lda >= std::max(1, cols_a) && ldb >= std::max(1, cols_b) && ldc >= std::max(1, N),
                 call, shape, where);
  // CBLAS's dimensions are int: the spans the leading dimensions reach must fit one too.
  MOE_BLAS_CHECK(fits_int(int64_t{rows_a} * lda) && fits_int(int64_t{rows_b} * ldb) &&
                     fits_int(int64_t{M} * ldc),
                 call, shape, where);
  if (M == 0 || N == 0) return;
  MOE_BLAS_CHECK(C != nullptr, call, shape, where);
  if (K == 0) {
    const T s = alpha != T(1) ? T(0) * alpha : T(0);  // as gemm's
    for (int i = 0; i < M; ++i) {
      T* c = C + int64_t{i} * ldc;
      for (int j = 0; j < N; ++j) c[j] = beta == T(0) ? s : s + beta * c[j];
    }
    return;
  }
  MOE_BLAS_CHECK(A != nullptr && B != nullptr, call, shape, where);
  observed(where, shape, false,
           [&] { gemm_call(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc); });
}

template void gemm_ld<float>(bool, bool, int, int, int, float, const float*, int, const float*, int,
                             float, float*, int, std::source_location);
template void gemm_ld<double>(bool, bool, int, int, int, double, const double*, int, const double*,
                              int, double, double*, int, std::source_location);

template <class T>
void gemm_leaf_tree(int M, int N, const T* A, int lda, const T* B, int ldb, T* C, int ldc,
                    std::span<const int64_t> first, std::span<const int> rows, std::span<T> scratch,
                    LeafTreeInto into, std::source_location where) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>);
  const char* call = std::is_same_v<T, float> ? "sgemm leaf tree" : "dgemm leaf tree";
  int64_t K = 0;  // the leaves' rows, for the message (a negative count is refused below)
  for (int r : rows) K += std::max(r, 0);
  const GemmShape shape{true, false, M, N, static_cast<int>(std::min<int64_t>(K, INT_MAX))};
  MOE_BLAS_CHECK(M >= 0 && N >= 0 && first.size() == rows.size() && fits_int(int64_t(rows.size())),
                 call, shape, where);
  MOE_BLAS_CHECK(lda >= std::max(1, M) && ldb >= std::max(1, N) && ldc >= std::max(1, N), call,
                 shape, where);
  MOE_BLAS_CHECK(fits_int(int64_t{M} * ldc), call, shape, where);
  for (size_t q = 0; q < rows.size(); ++q) {
    MOE_BLAS_CHECK(rows[q] >= 0 && first[q] >= 0, call, shape, where);
  }
  const bool overwrite = into == LeafTreeInto::kOverwrite;
  if (M == 0 || N == 0 || (rows.empty() && !overwrite)) return;
  MOE_BLAS_CHECK(C != nullptr, call, shape, where);
  const int leaves = static_cast<int>(rows.size());
  MOE_BLAS_CHECK(scratch.size() >= gemm_leaf_tree_scratch<T>(M, N, leaves), call, shape, where);
  if (K == 0) {
    // Every leaf the empty chain +0, and so their sum: C = C + 0, as the tree's finish adds it
    // (overwrite: C = +0).
    for (int i = 0; i < M; ++i) {
      T* c = C + int64_t{i} * ldc;
      for (int j = 0; j < N; ++j) c[j] = (overwrite ? T(0) : c[j]) + T(0);
    }
    return;
  }
  MOE_BLAS_CHECK(A != nullptr && B != nullptr, call, shape, where);
  observed(where, shape, true, [&] {
    gemm_detail::gemm_leaf_tree_run<T>(
        {M, N, A, lda, B, ldb, C, ldc, first.data(), rows.data(), leaves, overwrite},
        scratch.data());
  });
}

template void gemm_leaf_tree<float>(int, int, const float*, int, const float*, int, float*, int,
                                    std::span<const int64_t>, std::span<const int>,
                                    std::span<float>, LeafTreeInto, std::source_location);
template void gemm_leaf_tree<double>(int, int, const double*, int, const double*, int, double*, int,
                                     std::span<const int64_t>, std::span<const int>,
                                     std::span<double>, LeafTreeInto, std::source_location);

template <class T> size_t gemm_leaf_tree_scratch(int M, int N, int leaves) {
  if (M <= 0 || N <= 0 || leaves <= 0) return 0;
  return static_cast<size_t>(gemm_detail::gemm_leaf_tree_scratch<T>(M, N, leaves));
}

template size_t gemm_leaf_tree_scratch<float>(int, int, int);
template size_t gemm_leaf_tree_scratch<double>(int, int, int);

void blas_set_threads(int n) {
  if (n < 1) {
    throw BlasError("blas_set_threads refused: thread count must be >= 1, got " +
                    std::to_string(n));
  }
  omp_set_num_threads(n);
}

std::string blas_info() {
  return "GEMM: moe_rt fixed-order FMA, " + std::string(gemm_level_description());
}

double blas_sgemm_gflops(int M, int K, int N, double seconds) {
  std::vector<float> a(static_cast<size_t>(M) * K, 0.5f), b(static_cast<size_t>(K) * N, 0.25f),
      c(static_cast<size_t>(M) * N, 0.0f);
  // One call on one thread, as inside the model's tasks: in a parallel region of one thread,
  // gemm does not split it.
  auto call = [&] {
#pragma omp parallel num_threads(1)
    gemm_call(false, false, M, N, K, 1.0f, a.data(), K, b.data(), N, 0.0f, c.data(), N);
  };
  call();  // warm-up
  const auto start = std::chrono::steady_clock::now();
  double elapsed = 0;
  int64_t calls = 0;
  while (elapsed < seconds) {
    call();
    ++calls;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  return 2.0 * M * K * N * static_cast<double>(calls) / elapsed * 1e-9;
}

void gemm_observe(GemmObserver observer) {
  g_observer.store(observer, std::memory_order_relaxed);
}

}  // namespace moe
