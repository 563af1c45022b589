// The checked OpenBLAS GEMM (large ones split over the model's threads), thread control and library
// description. This is the only file of the libraries that includes <cblas.h>.
// Legend: M, N, K are the GEMM's dimensions, C[M,N] = op(A)[M,K]·op(B)[K,N].
#include "model/blas.hpp"

#include <omp.h>

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "comm/mpi_check.hpp"
#include "model/parallel.hpp"

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

// CBLAS has no status to check, so the check is of the arguments, before the call: names the
// routine, the failed condition, the shapes, the caller's file:line and the rank.
#define MOE_BLAS_CHECK(cond, call, shape, where)                    \
  do {                                                              \
    if (!(cond)) ::moe::blas_fail((call), #cond, (shape), (where)); \
  } while (0)

namespace moe {
namespace {

// OpenBLAS runs single-threaded, always: the model's threads are OpenMP threads (blas_set_threads)
// and a large GEMM is split over them by gemm_blocks. Set before any GEMM can run.
const bool kOpenBlasSingleThreaded = [] {
  openblas_set_num_threads(1);
  return true;
}();

// OpenBLAS's OpenMP build ignores openblas_set_num_threads for its GEMMs: it follows OpenMP's
// thread count, and called from a parallel region libgomp gave fewer threads than that count (a
// one-thread team, dynamic adjustment, a thread limit) it waits forever for threads that do not
// exist (reproduced: a test stuck in sgemm_thread_nn). moe_rt calls OpenBLAS from such regions, so
// that build is refused with a message saying how to switch, rather than left to hang.
void require_openblas_without_openmp() {
  if (openblas_get_parallel() == 2) {
    throw BlasError(
        "OpenBLAS's OpenMP build is loaded (" + std::string(openblas_get_config()) +
        "); moe_rt runs OpenBLAS single-threaded inside its own OpenMP threads, which that build "
        "can deadlock on. Use its pthread or serial build: on Debian, 'update-alternatives "
        "--config libopenblas.so.0-x86_64-linux-gnu' (or install libopenblas0-pthread)");
  }
}

template <class T>
void gemm_call(bool trans_a, bool trans_b, int M, int N, int K, T alpha, const T* A, int lda,
               const T* B, int ldb, T beta, T* C, int ldc) {
  const CBLAS_TRANSPOSE op_a = trans_a ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE op_b = trans_b ? CblasTrans : CblasNoTrans;
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, op_a, op_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  } else {
    cblas_dgemm(CblasRowMajor, op_a, op_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
}

// A GEMM of at least kSplitFlops called outside the model's parallel regions is cut into blocks
// of C fixed by its shape alone (kColBlock columns when N >= M, else kRowBlock rows), each one
// single-threaded OpenBLAS call, run as parallel tasks. Inside a parallel region (an expert's or a
// head's task) it is one call. Either way its bits do not depend on the thread count. OpenBLAS's
// own threading is not used: on some of its kernels (Haswell, Zen) 2 threads round differently
// from 1. omp_get_level counts inactive regions too, so "inside" does not depend on the count.
constexpr double kSplitFlops = 4e6;
constexpr int kRowBlock = 64, kColBlock = 128;

template <class T>
void gemm_blocks(bool trans_a, bool trans_b, int M, int N, int K, T alpha, const T* A, int lda,
                 const T* B, int ldb, T beta, T* C, int ldc) {
  if (omp_get_level() > 0 || 2.0 * M * N * K < kSplitFlops) {
    gemm_call(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  } else if (N >= M) {
    parallel_tasks((N + kColBlock - 1) / kColBlock, [&](int64_t b) {
      const int n0 = static_cast<int>(b) * kColBlock, nb = std::min(kColBlock, N - n0);
      const T* B0 = trans_b ? B + int64_t{n0} * ldb : B + n0;  // columns n0.. of op(B)
      gemm_call(trans_a, trans_b, M, nb, K, alpha, A, lda, B0, ldb, beta, C + n0, ldc);
    });
  } else {
    parallel_tasks((M + kRowBlock - 1) / kRowBlock, [&](int64_t b) {
      const int m0 = static_cast<int>(b) * kRowBlock, mb = std::min(kRowBlock, M - m0);
      const T* A0 = trans_a ? A + m0 : A + int64_t{m0} * lda;  // rows m0.. of op(A)
      gemm_call(trans_a, trans_b, mb, N, K, alpha, A0, lda, B, ldb, beta, C + int64_t{m0} * ldc,
                ldc);
    });
  }
}

}  // namespace

template <class T>
void gemm(bool trans_a, bool trans_b, int M, int N, int K, T alpha, const T* A, const T* B, T beta,
          T* C, std::source_location where) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>);
  const char* call = std::is_same_v<T, float> ? "cblas_sgemm" : "cblas_dgemm";
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
    // Reference BLAS does the same, but CBLAS would reject lda = K = 0 for an untransposed A.
    for (int64_t i = 0; i < size_c; ++i) C[i] = beta == T(0) ? T(0) : beta * C[i];
    return;
  }
  MOE_BLAS_CHECK(A != nullptr && B != nullptr, call, shape, where);
  const int lda = trans_a ? M : K;  // row length of A as stored
  const int ldb = trans_b ? K : N;  // row length of B as stored
  gemm_blocks(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, N);
}

template void gemm<float>(bool, bool, int, int, int, float, const float*, const float*, float,
                          float*, std::source_location);
template void gemm<double>(bool, bool, int, int, int, double, const double*, const double*, double,
                           double*, std::source_location);

template <class T>
void gemm_ld(bool trans_a, bool trans_b, int M, int N, int K, T alpha, const T* A, int lda,
             const T* B, int ldb, T beta, T* C, int ldc, std::source_location where) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>);
  const char* call = std::is_same_v<T, float> ? "cblas_sgemm" : "cblas_dgemm";
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
    for (int i = 0; i < M; ++i) {
      T* c = C + int64_t{i} * ldc;
      for (int j = 0; j < N; ++j) c[j] = beta == T(0) ? T(0) : beta * c[j];
    }
    return;
  }
  MOE_BLAS_CHECK(A != nullptr && B != nullptr, call, shape, where);
  gemm_blocks(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

template void gemm_ld<float>(bool, bool, int, int, int, float, const float*, int, const float*, int,
                             float, float*, int, std::source_location);
template void gemm_ld<double>(bool, bool, int, int, int, double, const double*, int, const double*,
                              int, double, double*, int, std::source_location);

void blas_set_threads(int n) {
  if (n < 1) {
    throw BlasError("blas_set_threads refused: thread count must be >= 1, got " +
                    std::to_string(n));
  }
  require_openblas_without_openmp();
  openblas_set_num_threads(1);
  omp_set_num_threads(n);
}

void blas_set_library_threads(int n) {
  if (n < 1) {
    throw BlasError("openblas_set_num_threads refused: thread count must be >= 1, got " +
                    std::to_string(n));
  }
  require_openblas_without_openmp();
  openblas_set_num_threads(n);
}

std::string blas_info() {
  const char* config = openblas_get_config();
  const char* core = openblas_get_corename();
  // The configuration string already starts with "OpenBLAS <version>".
  return std::string(config ? config : "OpenBLAS (unknown configuration)") + " core " +
         (core ? core : "(unknown)");
}

double blas_sgemm_gflops(int M, int K, int N, double seconds) {
  std::vector<float> a(static_cast<size_t>(M) * K, 0.5f), b(static_cast<size_t>(K) * N, 0.25f),
      c(static_cast<size_t>(M) * N, 0.0f);
  const int threads = openblas_get_num_threads();
  openblas_set_num_threads(1);
  // One plain call at a time, not gemm: gemm would split it over the model's threads.
  auto call = [&] {
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
  openblas_set_num_threads(threads);
  return 2.0 * M * K * N * static_cast<double>(calls) / elapsed * 1e-9;
}

}  // namespace moe
