// moe_rt's GEMM (model/gemm/gemm.hpp) at every level this CPU has, float and double, against its
// contract written as a plain loop of std::fma, bit for bit: every transposition, alpha and beta,
// edge tiles, leading dimensions, large calls split over threads. Then the property the contract
// exists for: a row's bits do not depend on how many rows the call has (nor a column's on the
// columns), which OpenBLAS's Haswell and Zen kernels do not give. OpenBLAS serves as an
// independent check of the arithmetic itself, within a rounding tolerance. A level this CPU
// lacks is reported as skipped, never passed.
#include <cblas.h>
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "model/blas.hpp"
#include "model/gemm/gemm.hpp"
#include "model/linear.hpp"

namespace moe {
namespace {

// op(A)[i,k] and op(B)[k,j] of row-major storage with leading dimensions.
template <class T> T op_a(const T* A, int lda, bool trans, int i, int k) {
  return trans ? A[int64_t{k} * lda + i] : A[int64_t{i} * lda + k];
}
template <class T> T op_b(const T* B, int ldb, bool trans, int k, int j) {
  return trans ? B[int64_t{j} * ldb + k] : B[int64_t{k} * ldb + j];
}

// The contract, element by element.
template <class T>
void gemm_contract(bool ta, bool tb, int M, int N, int K, T alpha, const T* A, int lda, const T* B,
                   int ldb, T beta, T* C, int ldc) {
  for (int i = 0; i < M; ++i) {
    for (int j = 0; j < N; ++j) {
      T s = T(0);
      for (int k = 0; k < K; ++k) s = std::fma(op_a(A, lda, ta, i, k), op_b(B, ldb, tb, k, j), s);
      if (alpha != T(1)) s = s * alpha;
      T& c = C[int64_t{i} * ldc + j];
      c = beta == T(0) ? s : s + beta * c;
    }
  }
}

template <class T> std::vector<T> random_values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<T> v(n);
  // Mixed magnitudes, so that the order of additions shows in the last bits.
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<T>(u(rng) * std::ldexp(1.0, int(i % 7) - 3));
  return v;
}

template <class T> auto bits(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return std::bit_cast<uint32_t>(x);
  } else {
    return std::bit_cast<uint64_t>(x);
  }
}

// Runs gemm_ld and the contract on the same random operands (C's padding columns included) and
// compares every element of C's storage bit for bit.
template <class T>
void expect_contract(bool ta, bool tb, int M, int N, int K, T alpha, T beta, int pad,
                     uint32_t seed) {
  const int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
  const std::vector<T> A = random_values<T>(size_t(ta ? K : M) * lda, seed);
  const std::vector<T> B = random_values<T>(size_t(tb ? N : K) * ldb, seed + 1);
  std::vector<T> C = random_values<T>(size_t(M) * ldc, seed + 2), want = C;
  gemm_ld<T>(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
  gemm_contract<T>(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, want.data(), ldc);
  for (size_t e = 0; e < C.size(); ++e) {
    ASSERT_EQ(bits(C[e]), bits(want[e]))
        << "element " << e << " (row " << e / ldc << ", column " << e % ldc << ") of M=" << M
        << " N=" << N << " K=" << K << " ta=" << ta << " tb=" << tb << " alpha=" << alpha
        << " beta=" << beta << " pad=" << pad << ": " << C[e] << " against " << want[e];
  }
}

// expect_contract over every M × N × K of the lists, every transposition, float and double, alpha
// 1 and beta 0, some leading dimensions padded; stops at the first failure.
void expect_contract_grid(std::initializer_list<int> Ms, std::initializer_list<int> Ns,
                          std::initializer_list<int> Ks, uint32_t& seed) {
  for (int M : Ms) {
    for (int N : Ns) {
      for (int K : Ks) {
        for (bool ta : {false, true}) {
          for (bool tb : {false, true}) {
            const int pad = (M + N + K) % 3 == 0 ? 3 : 0;
            expect_contract<float>(ta, tb, M, N, K, 1.0f, 0.0f, pad, seed++);
            expect_contract<double>(ta, tb, M, N, K, 1.0, 0.0, pad, seed++);
            if (::testing::Test::HasFatalFailure()) return;
          }
        }
      }
    }
  }
}

class GemmLevels : public ::testing::TestWithParam<GemmLevel> {
 protected:
  void SetUp() override {
    if (!gemm_level_supported(GetParam())) {
      GTEST_SKIP() << "this CPU has no " << gemm_level_name(GetParam());
    }
    gemm_level_force(GetParam());
  }
  void TearDown() override {
    gemm_level_reset();
    gemm_detail::gemm_wide_tiles_force(gemm_detail::WideTiles::kWhereTheyPay);
    blas_set_threads(1);
  }
};

TEST_P(GemmLevels, EveryElementIsTheContractsFmaChain) {
  ASSERT_EQ(gemm_level(), GetParam());
  uint32_t seed = 1;
  // Shapes around every level's tiles (4, 6, 8, 12, 16, 32) and single rows, columns, k; operands
  // read in place (few panels of the other) and packed (many), with padded leading dimensions,
  // so that a read past a panel's edge or a row's end would show.
  expect_contract_grid({1, 5, 6, 7, 13, 25, 70}, {1, 3, 8, 17, 33, 56, 100}, {1, 2, 9, 64}, seed);
  if (HasFatalFailure()) return;
  // beta = 0 never reads C: NaNs there do not survive (as BLAS promises).
  std::vector<float> A(6 * 5, 1.0f), B(5 * 17, 0.5f), C(6 * 17, std::nanf(""));
  gemm<float>(false, false, 6, 17, 5, 1.0f, A.data(), B.data(), 0.0f, C.data());
  for (float c : C) ASSERT_EQ(c, 2.5f);
}

TEST_P(GemmLevels, AlphaBetaAndLeadingDimensions) {
  uint32_t seed = 100;
  for (auto [alpha, beta] : std::vector<std::pair<double, double>>{
           {1, 1}, {0.35355339, 0}, {0.35355339, 1}, {-2, 0.5}, {1, -1}}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        expect_contract<float>(ta, tb, 19, 37, 23, float(alpha), float(beta), 3, seed++);
        expect_contract<double>(ta, tb, 19, 37, 23, alpha, beta, 5, seed++);
        if (HasFatalFailure()) return;
      }
    }
  }
}

// The model's own shapes (deepseek4-tiny: S = 256, D = F = 128, V = 2048, head 32), large
// enough to be split over threads and to fill several packed blocks (K = 2048).
TEST_P(GemmLevels, ModelShapesOnOneAndThreeThreads) {
  for (int threads : {1, 3}) {
    blas_set_threads(threads);
    expect_contract<float>(false, false, 256, 2048, 128, 1.0f, 0.0f, 0, 7);  // LM head
    expect_contract<float>(false, true, 256, 128, 2048, 1.0f, 1.0f, 0, 8);   // its d_in
    expect_contract<float>(true, false, 128, 2048, 256, 1.0f, 0.0f, 0, 9);   // its d_weight
    expect_contract<float>(false, false, 97, 128, 128, 1.0f, 0.0f, 0, 10);   // one expert
    expect_contract<float>(true, false, 128, 128, 97, 1.0f, 1.0f, 0, 11);    // its d_weight
    expect_contract<double>(false, true, 130, 70, 300, 1.0, 1.0, 0, 12);
    if (HasFatalFailure()) return;
  }
}

// Where an operand is read in place rather than packed (gemm_kernel.hpp: A, transposed or not,
// over at most 8 panels of B, an untransposed B under at most 144 rows of A), at the edges of
// those limits for every level's panel width (NR = 4, 8, 16, 32: N = 8·NR and 8·NR + 1; M = 144
// and 145, whose last tiles are the narrower edge tiles), with K large enough that A's rows come
// in several packed blocks, padded leading dimensions, and a call split over threads.
TEST_P(GemmLevels, OperandsReadInPlaceAtTheLimits) {
  for (int threads : {1, 3}) {
    blas_set_threads(threads);
    for (int N : {32, 33, 64, 65, 128, 129, 256, 257}) {
      expect_contract<float>(false, false, 144, N, 300, 1.0f, 0.0f, 0, 30 + N);
      expect_contract<float>(false, false, 145, N, 300, 0.5f, 1.0f, 3, 40 + N);
      expect_contract<float>(true, false, 128, N, 300, 1.0f, 0.0f, 0, 60 + N);  // A^T, ld 128
      expect_contract<float>(true, false, 145, N, 97, 0.5f, 1.0f, 3, 70 + N);
    }
    expect_contract<float>(false, false, 145, 100, 700, 1.0f, 0.0f, 3, 50);  // A rows, blocks
    expect_contract<float>(false, true, 144, 100, 700, 1.0f, 1.0f, 3, 51);   // the same, B^T
    expect_contract<double>(false, false, 97, 60, 700, 1.0, 0.0, 2, 52);
    if (HasFatalFailure()) return;
  }
}

// A level's wide tiles (avx512's 6×64 floats, 6×32 doubles), which run where a call's columns
// fill them, forced onto every shape of a grid like the first test's, and the narrow ones forced
// onto the shapes the wide ones take (of floats: 56, 64, 120, 128 and 2048 columns): each the
// contract's chains, at every transposition and edge, float and double; then the model's shapes
// split over three threads and in several packed blocks of A, and the limits of reading in place
// counted in wide panels (A's rows up to 8 of them, 512 columns; a transposed A up to 4, 256;
// B under 12 rows). gemm_wide_blocks shows that the switch took effect: at avx512 every call
// forced wide runs wide blocks, and no call forced narrow does; a level without wide tiles runs
// its narrow ones either way.
TEST_P(GemmLevels, WideAndNarrowTilesAreTheSameChains) {
  using gemm_detail::WideTiles;
  const bool has_wide = GetParam() == GemmLevel::kAvx512;
  uint32_t seed = 500;
  for (WideTiles use : {WideTiles::kAlways, WideTiles::kNever}) {
    gemm_detail::gemm_wide_tiles_force(use);
    const int64_t before = gemm_detail::gemm_wide_blocks();
    int64_t calls = 0;
    auto expect = [&](bool ta, bool tb, int M, int N, int K, float alpha, float beta, int pad) {
      expect_contract<float>(ta, tb, M, N, K, alpha, beta, pad, seed++);
      ++calls;
    };
    expect_contract_grid({1, 5, 6, 7, 13, 70}, {1, 3, 17, 33, 56, 64, 65, 120}, {1, 2, 9, 64},
                         seed);
    if (HasFatalFailure()) return;
    calls += 6 * 8 * 4 * 4 * 2;
    for (int threads : {1, 3}) {
      blas_set_threads(threads);
      expect(false, false, 300, 56, 128, 1.0f, 0.0f, 0);    // x·W1, split over the threads
      expect(false, true, 300, 56, 128, 1.0f, 0.0f, 0);     // d_h
      expect(false, true, 300, 128, 56, 0.5f, 1.0f, 3);     // d_x
      expect(false, false, 300, 120, 700, 1.0f, 0.0f, 3);   // several packed blocks of A
      expect(true, false, 128, 64, 300, 1.0f, 1.0f, 0);     // router d_W
      expect(false, false, 300, 2048, 128, 1.0f, 0.0f, 0);  // LM head
      expect_contract<double>(false, false, 97, 120, 300, -2.0, 0.5, 2, seed++);
      ++calls;
      if (HasFatalFailure()) return;
    }
    blas_set_threads(1);
    for (int N : {256, 257, 512, 513}) {
      expect(false, false, 145, N, 300, 0.5f, 1.0f, 3);  // A's rows in place up to 512
      expect(true, false, 145, N, 97, 1.0f, 0.0f, 0);    // A transposed in place up to 256
      expect(false, false, 12, N, 97, 1.0f, 0.0f, 0);    // B in place under 12 rows
      expect(false, false, 13, N, 97, 1.0f, 1.0f, 3);
      if (HasFatalFailure()) return;
    }
    const int64_t wide = gemm_detail::gemm_wide_blocks() - before;
    if (use == WideTiles::kAlways && has_wide) {
      EXPECT_GE(wide, calls) << "forced wide, some calls ran no wide block";
    } else {
      EXPECT_EQ(wide, 0) << "wide blocks where none should run";
    }
  }
}

// Where the wide tiles run by themselves (kWhereTheyPay): over columns that fill them, but not for
// a call with a transposed A over at most eight narrow panels whose K makes a wide panel of B
// outgrow the level-1 cache (model/gemm/gemm.cpp, wide_panel_spills). Counted through
// gemm_wide_blocks at avx512, the level with wide tiles: the attention's q/o weight gradient
// (K = 256) and deepseek4-fine's router weight gradient run narrow; the same over K = 128, the LM
// head's weight gradient (2048 columns) and an untransposed A over K = 256 run wide; and so on 1
// thread as on 8, which split the LM head's call into blocks of 256 columns.
TEST_P(GemmLevels, WideTilesWhereTheirPanelsStayNear) {
  if (GetParam() != GemmLevel::kAvx512) GTEST_SKIP() << "only avx512 has wide tiles";
  gemm_detail::gemm_wide_tiles_force(gemm_detail::WideTiles::kWhereTheyPay);
  auto runs_wide = [](bool ta, int M, int N, int K) {
    std::vector<float> A(static_cast<size_t>(M) * K, 0.5f), B(static_cast<size_t>(K) * N, 0.25f),
        C(static_cast<size_t>(M) * N);
    const int64_t before = gemm_detail::gemm_wide_blocks();
    gemm<float>(ta, false, M, N, K, 1.0f, A.data(), B.data(), 0.0f, C.data());
    EXPECT_EQ(C[0], 0.125f * static_cast<float>(K));
    EXPECT_EQ(C.back(), 0.125f * static_cast<float>(K));
    return gemm_detail::gemm_wide_blocks() > before;
  };
  for (int threads : {1, 8}) {
    SCOPED_TRACE(threads);
    blas_set_threads(threads);
    EXPECT_FALSE(runs_wide(true, 128, 128, 256)) << "attention q/o weight gradient";
    EXPECT_FALSE(runs_wide(true, 128, 64, 256)) << "deepseek4-fine router weight gradient";
    EXPECT_TRUE(runs_wide(true, 128, 128, 128)) << "a wide panel of K = 128 fits";
    EXPECT_TRUE(runs_wide(true, 128, 2048, 256)) << "LM head weight gradient";
    EXPECT_TRUE(runs_wide(false, 256, 128, 256)) << "untransposed A";
  }
}

// The property the contract is for: the first rows of a call of 2M rows (columns of 2N) are the
// bits of a call of M rows (N columns), at M, N around the register tiles and OpenBLAS's blocks.
TEST_P(GemmLevels, ARowsBitsDoNotDependOnTheCallsShape) {
  for (int M : {32, 64, 1024}) {
    const int N = 128, K = 128;
    const std::vector<float> A = random_values<float>(size_t(2) * M * K, 3);
    const std::vector<float> B = random_values<float>(size_t(K) * 2 * N, 4);
    std::vector<float> whole(size_t(2) * M * N), half(size_t(M) * N), cols(size_t(2) * M * N);
    gemm<float>(false, false, 2 * M, N, K, 1.0f, A.data(), B.data(), 0.0f, whole.data());
    gemm<float>(false, false, M, N, K, 1.0f, A.data(), B.data(), 0.0f, half.data());
    for (size_t e = 0; e < half.size(); ++e) {
      ASSERT_EQ(bits(whole[e]), bits(half[e])) << "M=" << M << ", element " << e;
    }
    // N columns of a [K, 2N] B: the left half of a call with all 2N columns.
    gemm_ld<float>(false, false, M, 2 * N, K, 1.0f, A.data(), K, B.data(), 2 * N, 0.0f, cols.data(),
                   2 * N);
    gemm_ld<float>(false, false, M, N, K, 1.0f, A.data(), K, B.data(), 2 * N, 0.0f, half.data(), N);
    for (int i = 0; i < M; ++i) {
      for (int j = 0; j < N; ++j) {
        ASSERT_EQ(bits(cols[size_t(i) * 2 * N + j]), bits(half[size_t(i) * N + j]))
            << "M=" << M << ", row " << i << ", column " << j;
      }
    }
  }
}

// An independent implementation of the arithmetic: OpenBLAS, whose order of additions differs,
// so within a tolerance of K roundings of the magnitudes involved.
TEST_P(GemmLevels, AgreesWithOpenBlasWithinRounding) {
  const int M = 45, N = 77, K = 301;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const std::vector<double> A = random_values<double>(size_t(M) * K, 20);
      const std::vector<double> B = random_values<double>(size_t(K) * N, 21);
      std::vector<double> C(size_t(M) * N, 0.0), ref(C), mag(C);
      gemm<double>(ta, tb, M, N, K, 1.0, A.data(), B.data(), 0.0, C.data());
      cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M,
                  N, K, 1.0, A.data(), ta ? M : K, B.data(), tb ? K : N, 0.0, ref.data(), N);
      for (int i = 0; i < M; ++i) {
        for (int j = 0; j < N; ++j) {
          double m = 0;
          for (int k = 0; k < K; ++k) {
            m += std::abs(op_a(A.data(), ta ? M : K, ta, i, k) *
                          op_b(B.data(), tb ? K : N, tb, k, j));
          }
          const size_t e = size_t(i) * N + j;
          EXPECT_LE(std::abs(C[e] - ref[e]), 2.0 * K * 1.2e-16 * m) << "row " << i << " col " << j;
        }
      }
    }
  }
}

// The tree of model/tree_sum.hpp written recursively: a range of n leaves splits after the
// largest power of two below n.
template <class T>
std::vector<T> tree_of(const std::vector<std::vector<T>>& leaves, size_t lo, size_t hi) {
  if (hi - lo == 1) return leaves[lo];
  size_t p = 1;
  while (2 * p < hi - lo) p *= 2;
  std::vector<T> left = tree_of(leaves, lo, lo + p);
  const std::vector<T> right = tree_of(leaves, lo + p, hi);
  for (size_t e = 0; e < left.size(); ++e) left[e] = left[e] + right[e];
  return left;
}

// gemm_leaf_tree against its contract: each leaf the plain fma chain over its rows (an empty
// leaf +0), the leaves added along the tree above, the total added to C (and, overwriting a C of
// NaNs, +0 + the total); every element of C's storage bit for bit. Leaves of any row count (0
// included) lie apart with gaps between them in operands with padded rows. With `scale`, A's values
// are multiplied by it and B's by −scale, and C holds zeros of both signs: products that round to
// −0 (scale 1e-30 in float), so that leaf sums are −0.
template <class T>
void expect_leaf_tree(int M, int N, const std::vector<int>& rows, int pad, uint32_t seed,
                      T scale = T(1), size_t* negative_zero_totals = nullptr) {
  const int lda = M + pad, ldb = N + pad, ldc = N + pad;
  std::vector<int64_t> first(rows.size());
  int64_t next = 1;
  for (size_t q = 0; q < rows.size(); ++q) {
    first[q] = next;
    next += rows[q] + static_cast<int64_t>(q % 3);  // a gap of 0, 1 or 2 rows
  }
  std::vector<T> A = random_values<T>(size_t(next) * lda, seed);
  std::vector<T> B = random_values<T>(size_t(next) * ldb, seed + 1);
  std::vector<T> C = random_values<T>(size_t(M) * ldc, seed + 2);
  if (scale != T(1)) {
    for (T& a : A) a = std::abs(a) * scale;
    for (T& b : B) b = -std::abs(b) * scale;
    for (size_t e = 0; e < C.size(); ++e) C[e] = e % 2 ? T(0) : -T(0);
  }
  std::vector<T> want = C;
  std::vector<std::vector<T>> leaves;
  for (size_t q = 0; q < rows.size(); ++q) {
    leaves.emplace_back(size_t(M) * N);
    gemm_contract<T>(true, false, M, N, rows[q], T(1), A.data() + first[q] * lda, lda,
                     B.data() + first[q] * ldb, ldb, T(0), leaves.back().data(), N);
  }
  const std::vector<T> total = tree_of(leaves, 0, leaves.size());
  if (negative_zero_totals != nullptr) {
    *negative_zero_totals = static_cast<size_t>(std::count_if(
        total.begin(), total.end(), [](T x) { return x == T(0) && std::signbit(x); }));
  }
  for (int i = 0; i < M; ++i) {
    for (int j = 0; j < N; ++j) want[size_t(i) * ldc + j] += total[size_t(i) * N + j];
  }
  std::vector<T> scratch(gemm_leaf_tree_scratch<T>(M, N, static_cast<int>(rows.size())));
  // Overwriting, over a C of NaNs (its padding kept): what adding gives on a C of +0.
  std::vector<T> written = C, want_written = C;
  for (int i = 0; i < M; ++i) {
    for (int j = 0; j < N; ++j) {
      written[size_t(i) * ldc + j] = std::numeric_limits<T>::quiet_NaN();
      want_written[size_t(i) * ldc + j] = T(0) + total[size_t(i) * N + j];
    }
  }
  gemm_leaf_tree<T>(M, N, A.data(), lda, B.data(), ldb, C.data(), ldc, first, rows, scratch);
  gemm_leaf_tree<T>(M, N, A.data(), lda, B.data(), ldb, written.data(), ldc, first, rows, scratch,
                    LeafTreeInto::kOverwrite);
  for (size_t e = 0; e < C.size(); ++e) {
    ASSERT_EQ(bits(C[e]), bits(want[e]))
        << "element " << e << " (row " << e / ldc << ", column " << e % ldc << ") of M=" << M
        << " N=" << N << " over " << rows.size() << " leaves, pad=" << pad << ": " << C[e]
        << " against " << want[e];
    ASSERT_EQ(bits(written[e]), bits(want_written[e]))
        << "overwriting: element " << e << " (row " << e / ldc << ", column " << e % ldc
        << ") of M=" << M << " N=" << N << " over " << rows.size() << " leaves, pad=" << pad << ": "
        << written[e] << " against " << want_written[e];
  }
}

// Around every level's tiles: trees of every size from 1 to 13 leaves (every shape of the tree's
// finish), leaves short and long, empty ones among others, and large calls split over three
// threads; then calls whose leaves span several groups at every level (a group holds at most 2048
// rows, at the portable level), and leaf sums of −0.
TEST_P(GemmLevels, LeafTreeIsTheTreeOfPerLeafGemms) {
  uint32_t seed = 200;
  std::vector<std::vector<int>> trees = {
      {0}, {3, 0}, {32, 32, 31, 32, 30, 32, 32, 33}, {100, 0, 97, 120, 101}};
  for (int n = 1; n <= 13; ++n) {
    trees.emplace_back();
    for (int q = 0; q < n; ++q) trees.back().push_back((q * 7 + n) % 11);  // some of them 0
  }
  for (int threads : {1, 3}) {
    blas_set_threads(threads);
    for (int M : {1, 5, 13, 56, 128}) {
      for (int N : {1, 3, 17, 56, 100}) {
        for (const std::vector<int>& rows : trees) {
          const int pad = (M + N + int(rows.size())) % 3 == 0 ? 3 : 0;
          expect_leaf_tree<float>(M, N, rows, pad, seed++);
          expect_leaf_tree<double>(M, N, rows, pad, seed++);
          if (HasFatalFailure()) return;
        }
      }
    }
    // deepseek4-tiny's shared expert (8 sequences of 256 rows) and a leaf tree split into tasks.
    expect_leaf_tree<float>(128, 128, std::vector<int>(8, 256), 0, seed++);
    expect_leaf_tree<float>(300, 40, std::vector<int>(6, 150), 1, seed++);
    if (HasFatalFailure()) return;
  }
  blas_set_threads(1);
  for (const std::vector<int>& rows : std::vector<std::vector<int>>{
           {1500, 700, 0, 1900, 2100, 30}, {4100}, {900, 1300, 1100, 2500, 600, 800, 1000}}) {
    expect_leaf_tree<float>(5, 3, rows, 1, seed++);
    expect_leaf_tree<double>(7, 6, rows, 0, seed++);
    if (HasFatalFailure()) return;
  }
  expect_leaf_tree<float>(13, 33, {5, 9, 1, 0, 4}, 2, seed++, 1e-30f);
  expect_leaf_tree<double>(13, 33, {5, 9, 1, 0, 4}, 2, seed++, 1e-200);
  // Without an empty leaf (+0) among them, the totals are −0 too: overwriting stores +0.
  size_t negative_zeros = 0;
  expect_leaf_tree<float>(13, 33, {5, 9, 1, 4}, 2, seed++, 1e-30f, &negative_zeros);
  EXPECT_EQ(negative_zeros, size_t{13 * 33}) << "totals of −0, float";
  expect_leaf_tree<double>(13, 33, {5, 9, 1, 4}, 2, seed++, 1e-200, &negative_zeros);
  EXPECT_EQ(negative_zeros, size_t{13 * 33}) << "totals of −0, double";
  // No leaves at all: adding leaves C as it was; overwriting makes it +0 (its padding kept).
  for (const bool overwrite : {false, true}) {
    std::vector<float> C(5 * 7, std::nanf("")), scratch(gemm_leaf_tree_scratch<float>(5, 6, 0));
    gemm_leaf_tree<float>(5, 6, nullptr, 5, nullptr, 6, C.data(), 7, {}, {}, scratch,
                          overwrite ? LeafTreeInto::kOverwrite : LeafTreeInto::kAdd);
    for (size_t e = 0; e < C.size(); ++e) {
      if (overwrite && e % 7 < 6) {
        ASSERT_EQ(bits(C[e]), 0u) << "element " << e;
      } else {
        ASSERT_TRUE(std::isnan(C[e])) << "element " << e;
      }
    }
  }
}

// Arguments that cannot hold are refused before anything is read or written.
TEST_P(GemmLevels, LeafTreeRefusesBadArguments) {
  const std::vector<float> A(64 * 8, 1.0f), B(64 * 8, 1.0f);
  std::vector<float> C(8 * 8, 0.0f), scratch(gemm_leaf_tree_scratch<float>(8, 8, 2));
  const std::vector<int64_t> first{0, 4};
  const std::vector<int> rows{4, 4};
  auto call = [&](int M, int lda, std::span<const int64_t> f, std::span<const int> r,
                  std::span<float> s) {
    gemm_leaf_tree<float>(M, 8, A.data(), lda, B.data(), 8, C.data(), 8, f, r, s);
  };
  EXPECT_NO_THROW(call(8, 8, first, rows, scratch));
  EXPECT_THROW(call(8, 7, first, rows, scratch), BlasError);   // lda < M
  EXPECT_THROW(call(-1, 8, first, rows, scratch), BlasError);  // M < 0
  EXPECT_THROW(call(8, 8, first, std::span(rows).first(1), scratch), BlasError);
  const std::vector<int> negative{4, -1};
  EXPECT_THROW(call(8, 8, first, negative, scratch), BlasError);
  EXPECT_THROW(call(8, 8, first, rows, std::span(scratch).first(scratch.size() - 1)), BlasError);
  const std::vector<int64_t> before_start{-1, 4};
  EXPECT_THROW(call(8, 8, before_start, rows, scratch), BlasError);
  const std::vector<float> before = C;
  auto with = [&](const float* a, int ldb, float* c, int ldc) {
    gemm_leaf_tree<float>(8, 8, a, 8, B.data(), ldb, c, ldc, first, rows, scratch);
  };
  EXPECT_THROW(with(nullptr, 8, C.data(), 8), BlasError);
  EXPECT_THROW(with(A.data(), 7, C.data(), 8), BlasError);  // ldb < N
  EXPECT_THROW(with(A.data(), 8, C.data(), 7), BlasError);  // ldc < N
  EXPECT_THROW(with(A.data(), 8, nullptr, 8), BlasError);
  EXPECT_EQ(C, before);
}

INSTANTIATE_TEST_SUITE_P(All, GemmLevels,
                         ::testing::Values(GemmLevel::kPortable, GemmLevel::kFma128,
                                           GemmLevel::kAvx2, GemmLevel::kAvx512),
                         [](const auto& info) { return std::string(gemm_level_name(info.param)); });

TEST(GemmLevel, NamesParseAndForcingAnAbsentLevelIsRefused) {
  for (GemmLevel level :
       {GemmLevel::kPortable, GemmLevel::kFma128, GemmLevel::kAvx2, GemmLevel::kAvx512}) {
    EXPECT_EQ(gemm_level_parse(gemm_level_name(level)), level);
    if (!gemm_level_supported(level)) {
      EXPECT_THROW(gemm_level_force(level), std::invalid_argument);
    }
  }
  EXPECT_FALSE(gemm_level_parse("avx3").has_value());
  EXPECT_TRUE(gemm_level_supported(GemmLevel::kPortable));
  gemm_level_reset();
}

std::vector<GemmTiming> g_observed;
void observe(const GemmTiming& call) {
  g_observed.push_back(call);
}

// gemm_observe: each gemm, gemm_ld and gemm_leaf_tree call that runs kernels reaches the observer
// with its caller's line, its shape and a time; a call that runs none (M = 0) does not, nor any
// call once the observer is cleared. The results are the same bits either way.
TEST(GemmObserver, SeesEachCallWithItsSiteAndShape) {
  const int M = 13, N = 20, K = 9;
  std::vector<float> A(size_t{M} * K), B(size_t{K} * N);
  for (size_t i = 0; i < A.size(); ++i) A[i] = std::sin(0.3f * static_cast<float>(i));
  for (size_t i = 0; i < B.size(); ++i) B[i] = std::cos(0.7f * static_cast<float>(i));
  const std::vector<int64_t> first = {0, 6};
  const std::vector<int> rows = {6, 3};
  std::vector<float> scratch(gemm_leaf_tree_scratch<float>(K, N, 2));
  // The three calls into C, D and W; `line` is the first's.
  struct Out {
    std::vector<float> C = std::vector<float>(size_t{M} * N), D = C,
                       W = std::vector<float>(size_t{K} * N);
  };
  int line = 0;
  auto calls = [&](Out& o) {
    line = __LINE__ + 1;
    gemm<float>(false, false, M, N, K, 1.0f, A.data(), B.data(), 0.0f, o.C.data());
    gemm_ld<float>(true, true, 4, 5, 3, 1.0f, A.data(), 9, B.data(), 20, 0.0f, o.D.data(), 20);
    gemm_leaf_tree<float>(K, N, A.data(), K, B.data(), N, o.W.data(), N, first, rows, scratch,
                          LeafTreeInto::kOverwrite);
    gemm<float>(false, false, 0, N, K, 1.0f, A.data(), B.data(), 0.0f, o.C.data());  // no kernels
  };
  Out plain, seen;
  calls(plain);
  g_observed.clear();
  struct Clear {  // the observer off again, whatever happens
    ~Clear() { gemm_observe(nullptr); }
  } clear;
  gemm_observe(observe);
  calls(seen);
  gemm_observe(nullptr);
  Out after;
  calls(after);
  ASSERT_EQ(g_observed.size(), 3u);
  for (size_t c = 0; c < 3; ++c) {
    EXPECT_EQ(static_cast<int>(g_observed[c].where.line()), line + static_cast<int>(c)) << c;
    EXPECT_NE(std::string(g_observed[c].where.file_name()).find("test_gemm.cpp"),
              std::string::npos);
    EXPECT_GE(g_observed[c].seconds, 0.0);
  }
  const GemmTiming& g = g_observed[0];
  EXPECT_TRUE(!g.trans_a && !g.trans_b && !g.leaf_tree);
  EXPECT_EQ(g.M, M);
  EXPECT_EQ(g.N, N);
  EXPECT_EQ(g.K, K);
  EXPECT_TRUE(g_observed[1].trans_a && g_observed[1].trans_b && !g_observed[1].leaf_tree);
  EXPECT_EQ(g_observed[1].M, 4);
  EXPECT_TRUE(g_observed[2].leaf_tree);
  EXPECT_EQ(g_observed[2].M, K);
  EXPECT_EQ(g_observed[2].K, 9);  // the leaves' rows
  EXPECT_EQ(g_observed[2].N, N);
  for (const Out* o : {&seen, &after}) {
    for (size_t i = 0; i < plain.C.size(); ++i) ASSERT_EQ(bits(o->C[i]), bits(plain.C[i]));
    for (size_t i = 0; i < plain.D.size(); ++i) ASSERT_EQ(bits(o->D[i]), bits(plain.D[i]));
    for (size_t i = 0; i < plain.W.size(); ++i) ASSERT_EQ(bits(o->W[i]), bits(plain.W[i]));
  }
}

// The linear layer's GEMMs (model/linear.hpp) are named by the layer's callers, not by
// model/linear.cpp: each of the four calls below, one line apart, and linear_backward's two GEMMs
// by its own caller's line.
TEST(GemmObserver, NamesTheLinearLayersCaller) {
  const int N = 5, I = 7, O = 6;
  std::vector<float> in(size_t{N} * I, 0.5f), w(size_t{I} * O, 0.25f), out(size_t{N} * O),
      d_in(in.size()), d_w(w.size());
  g_observed.clear();
  struct Clear {
    ~Clear() { gemm_observe(nullptr); }
  } clear;
  gemm_observe(observe);
  const int line = __LINE__ + 1;
  linear_forward(out.data(), in.data(), w.data(), N, I, O);
  linear_backward_input(d_in.data(), out.data(), w.data(), N, I, O);
  linear_backward_input_overwrite(d_in.data(), out.data(), w.data(), N, I, O);
  linear_backward(d_in.data(), d_w.data(), out.data(), in.data(), w.data(), N, I, O);
  gemm_observe(nullptr);
  ASSERT_EQ(g_observed.size(), 5u);
  for (size_t c = 0; c < g_observed.size(); ++c) {
    EXPECT_EQ(static_cast<int>(g_observed[c].where.line()), line + std::min(static_cast<int>(c), 3))
        << c;
    EXPECT_NE(std::string(g_observed[c].where.file_name()).find("test_gemm.cpp"), std::string::npos)
        << c;
  }
  EXPECT_TRUE(!g_observed[0].trans_a && !g_observed[0].trans_b);
  EXPECT_TRUE(g_observed[1].trans_b && g_observed[2].trans_b && g_observed[3].trans_b);
  EXPECT_TRUE(g_observed[4].trans_a);  // linear_backward's weight gradient
}

}  // namespace
}  // namespace moe
