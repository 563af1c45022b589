// What the GEMM's levels share: one call's arguments, and the table of functions each
// instruction-set level's file exports (as data, so that nothing compiled for a wider
// instruction set runs before the level is chosen). Internal to model/gemm/.
// Legend: C[M,N] = alpha·op(A)[M,K]·op(B)[K,N] + beta·C; MR×NR the level's register tile.
#pragma once

#include <cstdint>

namespace moe::gemm_detail {

// One validated call: M, N, K >= 1, every pointer non-null, row-major with leading dimensions.
template <class T> struct GemmCall {
  bool trans_a, trans_b;
  int M, N, K;
  T alpha;
  const T* A;  // [M,K] rows lda apart, or [K,M] if trans_a
  int64_t lda;
  const T* B;  // [K,N] rows ldb apart, or [N,K] if trans_b
  int64_t ldb;
  T beta;
  T* C;  // [M,N] rows ldc apart
  int64_t ldc;
};

// A sum of weight-gradient leaves along model/tree_sum.hpp's tree, validated: C[M,N] += the
// tree sum over leaves q = 0 … leaves−1 of A_qᵀ·B_q, leaf q being the rows [first[q],
// first[q] + rows[q]) of A (rows lda apart, M values used of each) and of B (rows ldb apart, N
// used). M, N, leaves >= 1; rows[q] >= 0 (an empty leaf is +0).
template <class T> struct LeafTreeCall {
  int M, N;
  const T* A;
  int64_t lda;
  const T* B;
  int64_t ldb;
  T* C;
  int64_t ldc;
  const int64_t* first;
  const int* rows;
  int leaves;
  bool overwrite;  // C = the total (+0 added, as to a zeroed C), C's old values unread; else C +=
};

// One level's kernels for one element type: `block` computes C[i0:i0+m, j0:j0+n] on the calling
// thread with `pack_elements(m, n, K)` elements of scratch, in mr×nr register tiles.
template <class T> struct GemmKernelsOf {
  int mr, nr;
  int64_t (*pack_elements)(int m, int n, int K);
  void (*block)(const GemmCall<T>& g, int i0, int m, int j0, int n, T* pack);
  // The same in wide tiles of mr/2 rows × 2·nr columns (null where the level has none: they
  // need twice the registers for B's values of a k).
  int64_t (*wide_pack_elements)(int m, int n, int K);
  void (*wide_block)(const GemmCall<T>& g, int i0, int m, int j0, int n, T* pack);
  // The same for a leaf tree: C[i0:i0+m, j0:j0+n] with `leaf_tree_elements(m, n, leaves)`
  // elements of scratch (its partial sums).
  int64_t (*leaf_tree_elements)(int m, int n, int leaves);
  void (*leaf_tree_block)(const LeafTreeCall<T>& g, int i0, int m, int j0, int n, T* stack);
};

struct GemmKernels {
  GemmKernelsOf<float> f32;
  GemmKernelsOf<double> f64;
};

// Each defined in its level's file (constinit: no code of a wider level runs before the CPU is
// checked); the wider ones exist on x86-64 with GCC only.
extern const GemmKernels kGemmPortable;  // scalar std::fma: any CPU
extern const GemmKernels kGemmFma128;    // SSE registers with FMA3 (AVX + FMA CPUs)
extern const GemmKernels kGemmAvx2;      // x86-64-v3: AVX2 + FMA
extern const GemmKernels kGemmAvx512;    // x86-64-v4: AVX-512

}  // namespace moe::gemm_detail
