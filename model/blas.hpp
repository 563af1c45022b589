// The model's GEMM, checked: row-major float and double GEMMs that validate their arguments and
// run moe_rt's own fixed-order kernels (model/gemm/gemm.hpp: every element one chain of fused
// multiply-adds in k order, so its bits never depend on the call's shape, the threads or the
// CPU), the model's thread count, and a description of the kernels for the start-of-run log.
// OpenBLAS is not used by the model; the tests and benchmarks use it as an independent reference.
// Legend: in this file M, N, K are the GEMM's own dimensions, C[M,N] = op(A)[M,K]·op(B)[K,N];
// callers map them onto the model's (N rows/tokens, D model width, F expert width, E experts,
// K top-k, V vocab).
#pragma once

#include <cstddef>
#include <cstdint>
#include <source_location>
#include <span>
#include <stdexcept>
#include <string>

namespace moe {

// A GEMM call refused before it was made: every argument is validated first; the message names
// the routine (sgemm or dgemm), the shapes, the caller's file:line and the rank.
class BlasError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Row-major, dense leading dimensions: C = alpha·op(A)·op(B) + beta·C, each element computed as
// model/gemm/gemm.hpp's contract says. Called outside the model's parallel regions, a GEMM of at
// least 4 MFLOP is cut into blocks of C that run on the model's threads; no bit depends on that.
// A is [M,K] ([K,M] if trans_a), B is [K,N] ([N,K] if trans_b), C is [M,N].
// M == 0 or N == 0: nothing to do, no pointer is read. K == 0: the empty chain, C = +0·alpha +
// beta·C (C = 0 when beta == 0, so that stale NaNs in C do not survive, as BLAS promises).
// Throws BlasError on a negative dimension, a null pointer to a non-empty matrix, or a matrix of
// more than INT_MAX elements (the int dimensions would overflow). `where` defaults to the caller's
// position for the error message.
template <class T>
void gemm(bool trans_a, bool trans_b, int M, int N, int K, T alpha,
          const T* A,  // [M,K], or [K,M] if trans_a
          const T* B,  // [K,N], or [N,K] if trans_b
          T beta,
          T* C,  // [M,N]
          std::source_location where = std::source_location::current());

// gemm on sub-matrices: the same, with each matrix's leading dimension (its row length as stored,
// row-major), so that e.g. one head's hd columns inside a [S, H·hd] matrix are an operand without a
// copy. lda >= max(1, K) ([M,K]) or max(1, M) ([K,M]ᵀ), ldb >= max(1, N) or max(1, K),
// ldc >= max(1, N), else BlasError; the same refusals as gemm otherwise.
template <class T>
void gemm_ld(bool trans_a, bool trans_b, int M, int N, int K, T alpha, const T* A,
             int lda,                // [M,K], or [K,M] if trans_a, rows lda apart
             const T* B, int ldb,    // [K,N], or [N,K] if trans_b, rows ldb apart
             T beta, T* C, int ldc,  // [M,N], rows ldc apart
             std::source_location where = std::source_location::current());

// Whether gemm_leaf_tree adds its total to C or writes it over C.
enum class LeafTreeInto { kAdd, kOverwrite };

// A weight gradient summed by leaves along model/tree_sum.hpp's tree: C[M,N] += the tree sum over
// q = 0 … n−1 of A_qᵀ·B_q, where leaf q is rows [first[q], first[q] + rows[q]) of A (M values of
// each, rows lda apart) and of B (N values, rows ldb apart), n = first.size() = rows.size().
// Bit for bit a TreeSum of n leaves, leaf q gemm_ld(true, false, M, N, rows[q], 1, A_q, lda, B_q,
// ldb, 0, ·) (an empty leaf +0), finished into C; but in one pass per register tile of C, whose
// leaves' sums stay in registers and the level-1 cache. `scratch` holds the partial sums:
// gemm_leaf_tree_scratch(M, N, n) values at least. Splits into tasks as gemm does, changing no
// bit. Throws BlasError on a negative dimension or row count, spans of different lengths, leading
// dimensions below M, N or N, a first row below 0, too little scratch, or a null pointer to a
// non-empty operand. With LeafTreeInto::kOverwrite, C = the tree sum + 0 instead, C's old values
// unread: the bits C += gives on a C of +0 (no leaves, or none with rows: C = +0).
template <class T>
void gemm_leaf_tree(int M, int N, const T* A, int lda, const T* B, int ldb, T* C, int ldc,
                    std::span<const int64_t> first, std::span<const int> rows, std::span<T> scratch,
                    LeafTreeInto into = LeafTreeInto::kAdd,
                    std::source_location where = std::source_location::current());

// The scratch gemm_leaf_tree needs for M×N over `leaves` leaves, at any GEMM level this CPU has.
template <class T> size_t gemm_leaf_tree_scratch(int M, int N, int leaves);

// The model's threads from now on (OpenMP: the parallel loops and tasks of model/, and the blocks
// a large GEMM is split into); n >= 1, else BlasError.
void blas_set_threads(int n);

// The GEMM kernels in use, e.g. "GEMM: moe_rt fixed-order FMA, avx2 (6x16 float tiles)", for the
// configuration table printed at start.
std::string blas_info();

// This process's sgemm rate in GFLOP/s on one thread, measured for about `seconds` on one GEMM
// shape (M rows, K inner, N outer) with the model's kernels: the "peak" of model FLOP
// utilisation.
double blas_sgemm_gflops(int M, int K, int N, double seconds);

// One GEMM call as a profiler sees it: where it was made (gemm's, gemm_ld's or gemm_leaf_tree's
// `where`), its shape (a leaf tree's K: its leaves' rows), and its time on the steady clock.
struct GemmTiming {
  std::source_location where;
  bool trans_a = false, trans_b = false, leaf_tree = false;
  int M = 0, N = 0, K = 0;
  double seconds = 0;
};
// While set, every gemm, gemm_ld and gemm_leaf_tree call that runs kernels is timed and reported
// to `observer` after it returns, on the calling thread (several at once inside the model's
// parallel regions). Null (the default) times nothing. For profiling (bench_step --gemm-sites);
// set it while no GEMM runs.
using GemmObserver = void (*)(const GemmTiming& call);
void gemm_observe(GemmObserver observer);

}  // namespace moe
