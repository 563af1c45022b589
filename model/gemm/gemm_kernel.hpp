// The GEMM's one algorithm, included by each instruction-set level's file (gemm_portable.cpp,
// gemm_fma128.cpp, gemm_avx2.cpp, gemm_avx512.cpp), which compiles it with its own target flags
// and a vector type of its own (Vec below). Everything here has internal linkage, so that no
// function compiled for AVX2 or AVX-512 can be picked by the linker for another file.
//
// The contract, the same at every level (model/gemm/gemm.hpp): each C[i,j] is one chain of
// fused multiply-adds over k = 0, 1, …, K−1 in that order, starting from +0, each FMA rounded
// once; then s·alpha (skipped when alpha is 1), then + beta·C (skipped when beta is 0). A lane of
// a vector register holds one C[i,j] for the whole chain, so the vector width, the tiling, the
// packing and the thread that computes a tile change nothing in any element's arithmetic.
//
// How: BLIS's loop nest without splitting K (the chain would then be stored and reloaded, which
// is exact too, but every model shape has K <= 2048): B's columns [j0, j0+nc) are packed into
// panels of NR columns, A's rows [i0, i0+mc) into panels of MR rows, zero-padded; a micro-tile
// keeps MR×NR accumulators in registers over all of K. Padded rows and columns never reach C.
// Where a packed copy would serve few panels of the other operand, full panels are read where
// they lie instead (gemm_block); which addresses are loaded changes, never a value.
// Legend: M, N, K as in C[M,N] = op(A)[M,K]·op(B)[K,N]; MR×NR the register tile; mc, nc the
// packed blocks of A's rows and B's columns.
#pragma once

#include <cstddef>
#include <cstdint>

#include "model/gemm/gemm_call.hpp"

namespace moe::gemm_detail {
namespace {

// min and max of internal linkage: std::min and std::max are templates of vague linkage, and an
// out-of-line copy emitted by a file compiled for AVX-512 could be the one the linker keeps for
// every file.
template <class I> constexpr I lesser(I a, I b) {
  return b < a ? b : a;
}
template <class I> constexpr I greater(I a, I b) {
  return a < b ? b : a;
}

// Values of k a transposing pack (pack_panel below) takes at a time.
constexpr int kPackKStep = 64;

// dst[j·dst_row + i] = src[i·src_row + j] for i, j < 8: 8 rows of 8 values turned into 8 columns
// through vector shuffles (interleave pairs, then pairs of pairs, then halves), which the compiler
// lowers to the level's own instructions (__builtin_shufflevector: GCC 12 or later, or clang). Only
// panels of at least 8 values reach it. Data movement only: no value changes.
template <class T>
[[gnu::always_inline]] inline void transpose_8x8(T* dst, int64_t dst_row, const T* src,
                                                 int64_t src_row) {
  typedef T V8 __attribute__((vector_size(8 * sizeof(T))));
  V8 r[8], t[8];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) __builtin_memcpy(&r[i], src + i * src_row, sizeof(V8));
#pragma GCC unroll 4
  for (int i = 0; i < 8; i += 2) {  // t[i] holds rows i, i+1 interleaved by value
    t[i] = __builtin_shufflevector(r[i], r[i + 1], 0, 8, 1, 9, 4, 12, 5, 13);
    t[i + 1] = __builtin_shufflevector(r[i], r[i + 1], 2, 10, 3, 11, 6, 14, 7, 15);
  }
#pragma GCC unroll 2
  for (int i = 0; i < 8; i += 4) {  // then by pairs of values
    r[i] = __builtin_shufflevector(t[i], t[i + 2], 0, 1, 8, 9, 4, 5, 12, 13);
    r[i + 1] = __builtin_shufflevector(t[i], t[i + 2], 2, 3, 10, 11, 6, 7, 14, 15);
    r[i + 2] = __builtin_shufflevector(t[i + 1], t[i + 3], 0, 1, 8, 9, 4, 5, 12, 13);
    r[i + 3] = __builtin_shufflevector(t[i + 1], t[i + 3], 2, 3, 10, 11, 6, 7, 14, 15);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {  // then by halves: column j of the source in t[j]
    t[i] = __builtin_shufflevector(r[i], r[i + 4], 0, 1, 2, 3, 8, 9, 10, 11);
    t[i + 4] = __builtin_shufflevector(r[i], r[i + 4], 4, 5, 6, 7, 12, 13, 14, 15);
  }
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) __builtin_memcpy(dst + j * dst_row, &t[j], sizeof(V8));
}

// Copies a panel of `width` <= W values per k from `lanes` sources into dst (W values per k,
// zero past `width`): value (k, w) is src[w·src_lane + k·src_k]. Where a source runs along k
// (src_k == 1: a transposed B, an untransposed A) its values are written W apart, 8 sources × 8
// values of k at a time through a transpose in registers (transpose_8x8): value by value, the LM
// head's input gradient at one sequence (K = 2048) ran at 0.8× OpenBLAS's rate, now 1.16× (the
// attention's and the router's input gradients 5-15% faster; bench_gemm_shapes); otherwise each k's
// W values lie together and are copied as a row. Full panels take loops with a fixed trip count,
// which GCC unrolls and vectorises.
template <class T, int W>
[[gnu::always_inline]] inline void pack_panel(T* dst, const T* src, int64_t src_lane, int64_t src_k,
                                              int K, int width) {
  if (src_k == 1) {
    // In blocks of kPackKStep values of k, so that the block's destination rows (kPackKStep × W
    // values) stay in the level-1 cache while the sources pass; in each, 8 sources × 8 k at a
    // time through transpose_8x8, the rest value by value.
    for (int k0 = 0; k0 < K; k0 += kPackKStep) {
      const int k1 = lesser(K, k0 + kPackKStep), k8 = k0 + (k1 - k0) / 8 * 8;
      const int w8 = width / 8 * 8;
      for (int w = 0; w < w8; w += 8) {
        for (int k = k0; k < k8; k += 8) {
          transpose_8x8(dst + static_cast<int64_t>(k) * W + w, W, src + w * src_lane + k, src_lane);
        }
      }
      for (int w = 0; w < width; ++w) {  // what the transposes left: k past k8, sources past w8
        const T* s = src + w * src_lane;
        for (int k = w < w8 ? k8 : k0; k < k1; ++k) dst[static_cast<int64_t>(k) * W + w] = s[k];
      }
      for (int w = width; w < W; ++w) {
        for (int k = k0; k < k1; ++k) dst[static_cast<int64_t>(k) * W + w] = T(0);
      }
    }
    return;
  }
  if (width == W) {
    for (int k = 0; k < K; ++k) {
      const T* s = src + k * src_k;
      T* d = dst + static_cast<int64_t>(k) * W;
#pragma GCC unroll 32
      for (int w = 0; w < W; ++w) d[w] = s[w * src_lane];
    }
    return;
  }
  for (int k = 0; k < K; ++k) {
    const T* s = src + k * src_k;
    T* d = dst + static_cast<int64_t>(k) * W;
    for (int w = 0; w < width; ++w) d[w] = s[w * src_lane];
    for (int w = width; w < W; ++w) d[w] = T(0);
  }
}

// Packs rows [i0, i0+m) of op(A) into panels of MR rows: panel p holds, for each k, the MR values
// op(A)[i0+p·MR+r, k] (zero past row m), so the micro-tile reads MR consecutive values per k.
template <class T, int MR>
[[gnu::always_inline]] inline void pack_a(T* dst, const GemmCall<T>& g, int i0, int m) {
  // op(A)[i,k] = A[k·lda + i] when transposed, else A[i·lda + k].
  const int64_t lane = g.trans_a ? 1 : g.lda, step = g.trans_a ? g.lda : 1;
  for (int p = 0; p < m; p += MR) {
    const int64_t first = g.trans_a ? i0 + p : static_cast<int64_t>(i0 + p) * g.lda;
    pack_panel<T, MR>(dst + static_cast<int64_t>(p) * g.K, g.A + first, lane, step, g.K,
                      lesser(MR, m - p));
  }
}

// Packs columns [j0, j0+n) of op(B) into panels of NR columns: panel q holds, for each k, the NR
// values op(B)[k, j0+q·NR+c] (zero past column n).
template <class T, int NR>
[[gnu::always_inline]] inline void pack_b(T* dst, const GemmCall<T>& g, int j0, int n) {
  // op(B)[k,j] = B[j·ldb + k] when transposed, else B[k·ldb + j].
  const int64_t lane = g.trans_b ? g.ldb : 1, step = g.trans_b ? 1 : g.ldb;
  if (!g.trans_b) {
    // Row k of B once, front to back, into every full panel: rows ldb apart read panel by panel
    // would fight over cache sets when ldb is a large power of two (the LM head's 2048).
    const int full = n / NR * NR;
    for (int k = 0; k < g.K; ++k) {
      const T* src = g.B + static_cast<int64_t>(k) * g.ldb + j0;
      for (int q = 0; q < full; q += NR) {
        T* d = dst + static_cast<int64_t>(q) * g.K + static_cast<int64_t>(k) * NR;
#pragma GCC unroll 32
        for (int c = 0; c < NR; ++c) d[c] = src[q + c];
      }
    }
    if (full < n) {
      pack_panel<T, NR>(dst + static_cast<int64_t>(full) * g.K, g.B + j0 + full, lane, step, g.K,
                        n - full);
    }
    return;
  }
  for (int q = 0; q < n; q += NR) {
    const int64_t first = g.trans_b ? static_cast<int64_t>(j0 + q) * g.ldb : j0 + q;
    pack_panel<T, NR>(dst + static_cast<int64_t>(q) * g.K, g.B + first, lane, step, g.K,
                      lesser(NR, n - q));
  }
}

// One MR×NR tile of C (m×n of it inside C) from an A panel and a B panel over all of K: for each
// k, MR values of A's column k at ap (then ap += a_step) and NR values of B's row k at bp (then
// bp += b_step), packed (steps MR and NR) or read where they lie (steps lda and ldb).
// V is the level's vector type: V::kLanes values, load/store (unaligned), load_first/store_first
// (the first `count` lanes, 0 < count < kLanes: the others neither read nor written), set1,
// fma(a, b, c) = a·b + c rounded once, mul, add, zero.
// With kRowsOfA, A's rows are read where they lie in an untransposed A: value r of column k at
// ap[r·a_row] (then ap += 1), the MR rows walked front to back side by side.
template <class V, int MR, int NV, bool kRowsOfA = false>
[[gnu::always_inline]] inline void micro_tile(int K, const typename V::T* ap, int64_t a_step,
                                              const typename V::T* bp, int64_t b_step,
                                              typename V::T* c, int64_t ldc, int m, int n,
                                              typename V::T alpha, typename V::T beta,
                                              int64_t a_row = 0) {
  using T = typename V::T;
  constexpr int NR = NV * V::kLanes;
  typename V::R acc[MR][NV];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = V::zero();
  }
  for (int k = 0; k < K; ++k) {
    typename V::R b[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) b[v] = V::load(bp + v * V::kLanes);
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const typename V::R a = V::set1(kRowsOfA ? ap[r * a_row] : ap[r]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = V::fma(a, b[v], acc[r][v]);
    }
    ap += a_step;
    bp += b_step;
  }
  if (alpha != T(1)) {
    const typename V::R va = V::set1(alpha);
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = V::mul(acc[r][v], va);
    }
  }
  if (m == MR && n == NR) {
    const typename V::R vb = V::set1(beta);
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      T* row = c + r * ldc;
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) {
        T* p = row + v * V::kLanes;
        V::store(p, beta == T(0) ? acc[r][v] : V::add(acc[r][v], V::mul(vb, V::load(p))));
      }
    }
    return;
  }
  // An edge tile: its first m rows, and of each row the lanes before column n, through masked
  // loads and stores (V::load_first, V::store_first): lane by lane the arithmetic above.
  const typename V::R vb = V::set1(beta);
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
    if (r >= m) break;
    T* row = c + r * ldc;
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      const int lanes = n - v * V::kLanes;
      if (lanes <= 0) break;
      T* p = row + v * V::kLanes;
      if (lanes >= V::kLanes) {
        V::store(p, beta == T(0) ? acc[r][v] : V::add(acc[r][v], V::mul(vb, V::load(p))));
      } else {
        V::store_first(
            p, beta == T(0) ? acc[r][v] : V::add(acc[r][v], V::mul(vb, V::load_first(p, lanes))),
            lanes);
      }
    }
  }
}

// A micro-tile for an edge of m < MR rows (or n <= NR/2 columns) computes only the rows (vectors)
// it needs: MR/3 or 2·MR/3 rows where MR is a multiple of 3 (the 8 rows left of 128 by 12-row
// tiles, the 2 left by 6-row ones), one vector of NV for a half-wide edge. Each C element it
// writes is the same chain; only the work on padding is skipped.
template <class V, int MR, int NV, bool kRowsOfA, int R, int W>
[[gnu::always_inline]] inline bool edge_tile_as(int K, const typename V::T* ap, int64_t a_step,
                                                const typename V::T* bp, int64_t b_step,
                                                typename V::T* c, int64_t ldc, int m, int n,
                                                typename V::T alpha, typename V::T beta,
                                                int64_t a_row) {
  if constexpr (R <= 0 || W <= 0) {
    return false;
  } else {
    if (m > R || n > W * V::kLanes) return false;
    micro_tile<V, R, W, kRowsOfA>(K, ap, a_step, bp, b_step, c, ldc, m, n, alpha, beta, a_row);
    return true;
  }
}

// micro_tile for a tile of m×n of C, through the narrowest tile that covers it (above).
template <class V, int MR, int NV, bool kRowsOfA = false>
[[gnu::always_inline]] inline void tile(int K, const typename V::T* ap, int64_t a_step,
                                        const typename V::T* bp, int64_t b_step, typename V::T* c,
                                        int64_t ldc, int m, int n, typename V::T alpha,
                                        typename V::T beta, int64_t a_row = 0) {
  constexpr int NR = NV * V::kLanes;
  if (m < MR || n <= NR / 2) {
    constexpr int third = MR % 3 == 0 ? MR / 3 : 0, half = NV % 2 == 0 ? NV / 2 : 0;
    if (edge_tile_as<V, MR, NV, kRowsOfA, third, half>(K, ap, a_step, bp, b_step, c, ldc, m, n,
                                                       alpha, beta, a_row) ||
        edge_tile_as<V, MR, NV, kRowsOfA, third, NV>(K, ap, a_step, bp, b_step, c, ldc, m, n, alpha,
                                                     beta, a_row) ||
        edge_tile_as<V, MR, NV, kRowsOfA, 2 * third, NV>(K, ap, a_step, bp, b_step, c, ldc, m, n,
                                                         alpha, beta, a_row) ||
        edge_tile_as<V, MR, NV, kRowsOfA, MR, half>(K, ap, a_step, bp, b_step, c, ldc, m, n, alpha,
                                                    beta, a_row)) {
      return;
    }
  }
  micro_tile<V, MR, NV, kRowsOfA>(K, ap, a_step, bp, b_step, c, ldc, m, n, alpha, beta, a_row);
}

// Bytes of packed A (mc rows × K) and of packed B (K × nc columns) aimed at: A's block stays in
// the level-2 cache while B's panels stream through it. Sizes, not bits: nothing here changes an
// element's chain. (B blocks of 256 and 512 KiB, to fit Zen 3's 512 KiB level-2 cache, measured
// no better on the model's shapes with bench_gemm_shapes: K = 2048 then repacks A per block.)
constexpr int64_t kPackedABytes = 160 * 1024;
constexpr int64_t kPackedBBytes = 1024 * 1024;

// The limits below count the panels of the tile in use: the passes over the other operand
// (wide tiles, 2·NR columns a panel, read A once for twice the columns of a narrow panel).
// An untransposed A is read in place (kRowsOfA) when at most this many panels of B use it.
constexpr int kRowsOfAPanels = 8;
// A transposed A is read in place when at most this many panels of B use it: its MR values of a
// k lie lda apart from the next k's, and beyond four passes a packed copy pays (avx512's four
// 32-wide panels of the 128-column weight gradients gained 15-20% read in place; avx2's eight
// 16-wide ones lost 5-10% at K = 768).
constexpr int kTransAPanels = 4;
// An untransposed B is read in place when A has at most this many rows and B at most
// kRowsOfAPanels panels (measured on bench_gemm_shapes: the 128-row weight gradients gain 5-15%,
// the 768-row expert forward and the LM head's 2048 columns lose when read in place).
constexpr int kBInPlaceRows = 144;

// The packed blocks of a call with K: mc rows of A and nc columns of B (whole panels), and for a
// block of m×n the elements each takes (A's first in the packing space, then B's).
template <class T, int MR, int NR> struct PackBlocks {
  int mc, nc;
  int64_t a_elements, b_elements;
  PackBlocks(int m, int n, int K) {
    const int64_t k = greater(K, 1);
    mc = static_cast<int>(greater<int64_t>(MR, kPackedABytes / (k * int64_t(sizeof(T))) / MR * MR));
    nc = static_cast<int>(greater<int64_t>(NR, kPackedBBytes / (k * int64_t(sizeof(T))) / NR * NR));
    a_elements = lesser<int64_t>(mc, (m + MR - 1) / MR * MR) * k;
    b_elements = lesser<int64_t>(nc, (n + NR - 1) / NR * NR) * k;
  }
};

// Elements of packing space gemm_block needs for a block of m×n at this level.
template <class T, int MR, int NR> int64_t pack_elements(int m, int n, int K) {
  const PackBlocks<T, MR, NR> blocks(m, n, K);
  return blocks.a_elements + blocks.b_elements;
}

// C[i0:i0+m, j0:j0+n] of the call, on the calling thread; `pack` has pack_elements(m, n, K)
// elements (any alignment of T; loads are unaligned).
template <class V, int MR, int NV>
[[gnu::always_inline]] inline void gemm_block(const GemmCall<typename V::T>& g, int i0, int m,
                                              int j0, int n, typename V::T* pack) {
  using T = typename V::T;
  constexpr int NR = NV * V::kLanes;
  const PackBlocks<T, MR, NR> blocks(m, n, g.K);
  const int mc = blocks.mc, nc = blocks.nc;
  T* const packed_a = pack;
  T* const packed_b = pack + blocks.a_elements;
  // op(A) transposed holds each k's MR values of a panel together already (A[k·lda + i]), and so
  // does an untransposed op(B) for its NR values (B[k·ldb + j]). Where a packed copy would be
  // used by at most two panels of the other operand, its cost is not repaid: full panels are
  // then read where they lie (only a partial one at the edge is packed, zero-padded). Measured
  // (bench_gemm_shapes): packing wins for reuse beyond that, where the strided rows of a
  // power-of-two leading dimension fight over cache sets. Reading in place or packed changes
  // which addresses are loaded, never a value.
  // An untransposed A holds each of its rows along k: the micro-tile can read MR rows side by
  // side where they lie (kRowsOfA), which pays where few panels of B reuse a packed copy.
  const bool a_rows = !g.trans_a && n <= kRowsOfAPanels * NR;
  // A transposed A is read in place for up to kTransAPanels panels of B. An untransposed B is
  // read in place also for a few panels of A over a narrow B (kBInPlaceRows, kRowsOfAPanels):
  // the weight gradients' and the small tiles' shapes.
  const bool a_in_place = (g.trans_a && n <= kTransAPanels * NR) || a_rows,
             b_in_place =
                 !g.trans_b && (m <= 2 * MR || (m <= kBInPlaceRows && n <= kRowsOfAPanels * NR));
  // With all of A's rows in one block, A is packed once for every block of B's columns.
  const bool a_once = m <= mc;
  auto pack_a_block = [&](int ic, int mcur, int a_full) {
    if (a_full < mcur) {
      pack_a<T, MR>(packed_a + static_cast<int64_t>(a_full) * g.K, g, i0 + ic + a_full,
                    mcur - a_full);
    }
  };
  if (a_once) pack_a_block(0, m, a_in_place ? m / MR * MR : 0);
  for (int jc = 0; jc < n; jc += nc) {
    const int ncur = lesser(nc, n - jc);
    const int b_full = b_in_place ? ncur / NR * NR : 0;  // columns read in place
    if (b_full < ncur) {
      pack_b<T, NR>(packed_b + static_cast<int64_t>(b_full) * g.K, g, j0 + jc + b_full,
                    ncur - b_full);
    }
    for (int ic = 0; ic < m; ic += mc) {
      const int mcur = lesser(mc, m - ic);
      const int a_full = a_in_place ? mcur / MR * MR : 0;  // rows read in place
      if (!a_once) pack_a_block(ic, mcur, a_full);
      for (int jr = 0; jr < ncur; jr += NR) {
        const bool b_here = jr < b_full;
        const T* bp = b_here ? g.B + (j0 + jc + jr) : packed_b + static_cast<int64_t>(jr) * g.K;
        const int64_t b_step = b_here ? g.ldb : NR;
        for (int ir = 0; ir < mcur; ir += MR) {
          const bool a_here = ir < a_full;
          T* c = g.C + static_cast<int64_t>(i0 + ic + ir) * g.ldc + (j0 + jc + jr);
          const int mt = lesser(MR, mcur - ir), nt = lesser(NR, ncur - jr);
          if (a_here && a_rows) {
            tile<V, MR, NV, true>(g.K, g.A + static_cast<int64_t>(i0 + ic + ir) * g.lda, 1, bp,
                                  b_step, c, g.ldc, mt, nt, g.alpha, g.beta, g.lda);
            continue;
          }
          const T* ap = a_here ? g.A + (i0 + ic + ir) : packed_a + static_cast<int64_t>(ir) * g.K;
          tile<V, MR, NV>(g.K, ap, a_here ? g.lda : MR, bp, b_step, c, g.ldc, mt, nt, g.alpha,
                          g.beta);
        }
      }
    }
  }
}

// A leaf tree (LeafTreeCall), tile by tile of C: each leaf's chain runs in registers over the
// leaf's rows, read where they lie (A's MR values of a row side by side, B's NR); its sum then
// merges, still in registers, with the partial sums of equal size below it (TreeSum's binary
// counter, model/tree_sum.hpp), which wait in `stack`, a tile-sized slot per level; what is left
// at the end merges from the right, and the total is added to C. Each addition is one a TreeSum
// of per-leaf GEMMs makes, between the same two values (IEEE addition commutes), so the bits are
// theirs, without the passes over M×N buffers that pair and add the leaves. The leaves go in
// groups of up to kLeafGroupBytes of B's panel columns, every tile through one group before the
// next, so that a panel's rows stay in the level-1 cache while A's row tiles pass.
constexpr int64_t kLeafGroupBytes = 32 * 1024;

// The partial sums a leaf tree keeps at once: floor(log2(leaves)) + 1 (tree_sum_depth's count,
// here with internal linkage).
inline int leaf_tree_depth(int leaves) {
  int depth = 1;
  while (depth < 31 && (int64_t{1} << depth) <= leaves) ++depth;
  return depth;
}

// Leaves [q0, q1) of a call, after the leaves before q0 left partial sums of `sizes[0, depth)`
// leaves; a tile's level d at its slot + d·level_stride.
struct LeafGroup {
  int q0, q1;
  const int* sizes;
  int depth;
  int64_t level_stride;
};

// TreeSum::push's counter: a leaf merges with every partial sum of its own size on top.
inline void leaf_tree_push(int* sizes, int& depth) {
  int size = 1;
  while (depth > 0 && sizes[depth - 1] == size) {
    --depth;
    size *= 2;
  }
  sizes[depth++] = size;
}

// One group on one tile of m <= R rows and n columns (W vectors' worth) at (i0, j0), with R×W
// registers; the tile's level-0 slot at `slot`. kRowsFull: m is R (else a row past m reads row
// m−1 again, never stored, so that no load passes A's M values); kMasked: the last vector holds
// fewer than its lanes and is loaded through a mask.
template <class V, int R, int W, bool kRowsFull, bool kMasked>
[[gnu::always_inline]] inline void leaf_tree_tile(const LeafTreeCall<typename V::T>& g,
                                                  const LeafGroup& group, int i0, int m, int j0,
                                                  int n, typename V::T* slot) {
  using T = typename V::T;
  using Reg = typename V::R;
  constexpr int L = V::kLanes;
  const int last = n - (W - 1) * L;  // lanes of the last vector
  int row_of[R];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) row_of[r] = kRowsFull ? r : lesser(r, m - 1);
  int sizes[32];
  int depth = group.depth;
  for (int d = 0; d < depth; ++d) sizes[d] = group.sizes[d];
  auto add_level = [&](Reg(&acc)[R][W], int d) {
    const T* p = slot + d * group.level_stride;
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
      for (int v = 0; v < W; ++v) acc[r][v] = V::add(acc[r][v], V::load(p + (r * W + v) * L));
    }
  };
  Reg acc[R][W];
  auto zero = [&] {
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
      for (int v = 0; v < W; ++v) acc[r][v] = V::zero();
    }
  };
  zero();
  for (int q = group.q0; q < group.q1; ++q) {
    if (q > group.q0) zero();
    const T* ap = g.A + g.first[q] * g.lda + i0;
    const T* bp = g.B + g.first[q] * g.ldb + j0;
    for (int k = 0; k < g.rows[q]; ++k) {
      Reg b[W];
#pragma GCC unroll 4
      for (int v = 0; v < W; ++v) {
        b[v] = kMasked && v == W - 1 ? V::load_first(bp + v * L, last) : V::load(bp + v * L);
      }
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const Reg a = V::set1(ap[kRowsFull ? r : row_of[r]]);
#pragma GCC unroll 4
        for (int v = 0; v < W; ++v) acc[r][v] = V::fma(a, b[v], acc[r][v]);
      }
      ap += g.lda;
      bp += g.ldb;
    }
    int size = 1;
    while (depth > 0 && sizes[depth - 1] == size) {
      add_level(acc, --depth);
      size *= 2;
    }
    T* top = slot + depth * group.level_stride;
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
      for (int v = 0; v < W; ++v) V::store(top + (r * W + v) * L, acc[r][v]);
    }
    sizes[depth++] = size;
  }
  if (group.q1 < g.leaves || group.q0 == group.q1) return;
  // TreeSum::finish: what is left merges from the right (acc holds the top), then C += the total
  // (overwrite: C = the total + 0, the same bits as on a zeroed C).
  for (int d = depth - 2; d >= 0; --d) add_level(acc, d);
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    if (r >= m) break;
    T* c = g.C + static_cast<int64_t>(i0 + r) * g.ldc + j0;
#pragma GCC unroll 4
    for (int v = 0; v < W; ++v) {
      if (kMasked && v == W - 1) {
        const Reg old = g.overwrite ? V::zero() : V::load_first(c + v * L, last);
        V::store_first(c + v * L, V::add(acc[r][v], old), last);
      } else {
        V::store(c + v * L, V::add(acc[r][v], g.overwrite ? V::zero() : V::load(c + v * L)));
      }
    }
  }
}

// leaf_tree_tile for m <= R rows with W vectors, the last of them holding n − (W−1)·lanes.
template <class V, int R, int W>
[[gnu::always_inline]] inline void leaf_tree_tile_as(const LeafTreeCall<typename V::T>& g,
                                                     const LeafGroup& group, int i0, int m, int j0,
                                                     int n, typename V::T* slot) {
  const bool masked = n % V::kLanes != 0;
  if (m == R) {
    if (masked) return leaf_tree_tile<V, R, W, true, true>(g, group, i0, m, j0, n, slot);
    return leaf_tree_tile<V, R, W, true, false>(g, group, i0, m, j0, n, slot);
  }
  if (masked) return leaf_tree_tile<V, R, W, false, true>(g, group, i0, m, j0, n, slot);
  leaf_tree_tile<V, R, W, false, false>(g, group, i0, m, j0, n, slot);
}

// The same with the fewest vectors that hold n columns (W of them at most).
template <class V, int R, int W>
[[gnu::always_inline]] inline void leaf_tree_tile_rows(const LeafTreeCall<typename V::T>& g,
                                                       const LeafGroup& group, int i0, int m,
                                                       int j0, int n, typename V::T* slot) {
  if constexpr (W > 1) {
    if (n <= (W - 1) * V::kLanes) {
      return leaf_tree_tile_rows<V, R, W - 1>(g, group, i0, m, j0, n, slot);
    }
  }
  leaf_tree_tile_as<V, R, W>(g, group, i0, m, j0, n, slot);
}

// Elements of scratch a leaf tree's block of m×n needs: a tile-sized slot per tile and level.
template <class V, int MR, int NV> int64_t level_leaf_tree_elements(int m, int n, int leaves) {
  constexpr int NR = NV * V::kLanes;
  const int64_t tiles = int64_t{(m + MR - 1) / MR} * ((n + NR - 1) / NR);
  return leaf_tree_depth(leaves) * tiles * MR * NR;
}

// C[i0:i0+m, j0:j0+n] of a leaf tree: group by group, a column panel at a time, each through the
// narrowest register tile that covers it (as `tile` picks one).
template <class V, int MR, int NV>
void level_leaf_tree_block(const LeafTreeCall<typename V::T>& g, int i0, int m, int j0, int n,
                           typename V::T* stack) {
  using T = typename V::T;
  constexpr int NR = NV * V::kLanes, third = MR % 3 == 0 ? MR / 3 : MR;
  constexpr int64_t kGroupRows = greater<int64_t>(1, kLeafGroupBytes / (NR * int64_t(sizeof(T))));
  const int tiles_m = (m + MR - 1) / MR;
  const int64_t level_stride = int64_t{tiles_m} * ((n + NR - 1) / NR) * MR * NR;
  int sizes[32];
  int depth = 0;
  for (int q0 = 0, q1 = 0; q0 < g.leaves; q0 = q1) {
    int64_t rows = g.rows[q0];
    for (q1 = q0 + 1; q1 < g.leaves && rows + g.rows[q1] <= kGroupRows; ++q1) rows += g.rows[q1];
    const LeafGroup group{q0, q1, sizes, depth, level_stride};
    for (int jr = 0; jr < n; jr += NR) {
      const int nt = lesser(NR, n - jr);
      for (int ir = 0; ir < m; ir += MR) {
        const int mt = lesser(MR, m - ir);
        T* slot = stack + (int64_t{jr / NR} * tiles_m + ir / MR) * MR * NR;
        if (mt <= third) {
          leaf_tree_tile_rows<V, third, NV>(g, group, i0 + ir, mt, j0 + jr, nt, slot);
        } else if (mt <= 2 * third && 2 * third < MR) {
          leaf_tree_tile_rows<V, 2 * third, NV>(g, group, i0 + ir, mt, j0 + jr, nt, slot);
        } else {
          leaf_tree_tile_rows<V, MR, NV>(g, group, i0 + ir, mt, j0 + jr, nt, slot);
        }
      }
    }
    for (int q = q0; q < q1; ++q) leaf_tree_push(sizes, depth);
  }
}

// A level's table (gemm_call.hpp): MR×(NV·lanes) tiles of V32 (float) and V64 (double), and
// with kWide the wide tiles, (MR/2)×(2·NV·lanes), for as many accumulators. A level has them
// where its registers also hold the 2·NV vectors of B a wide tile loads per k (avx512: 24
// accumulators, 4 of B and a broadcast in 32; avx2's 16 do not hold 12 + 4 + 1, and its wide
// tiles measured no faster).
template <class V, int MR, int NV> int64_t level_pack_elements(int m, int n, int K) {
  return pack_elements<typename V::T, MR, NV * V::kLanes>(m, n, K);
}
template <class V, int MR, int NV>
void level_block(const GemmCall<typename V::T>& g, int i0, int m, int j0, int n,
                 typename V::T* pack) {
  gemm_block<V, MR, NV>(g, i0, m, j0, n, pack);
}
template <class V, int MR, int NV, bool kWide>
constexpr GemmKernelsOf<typename V::T> level_table() {
  GemmKernelsOf<typename V::T> k{MR,
                                 NV * V::kLanes,
                                 level_pack_elements<V, MR, NV>,
                                 level_block<V, MR, NV>,
                                 nullptr,
                                 nullptr,
                                 level_leaf_tree_elements<V, MR, NV>,
                                 level_leaf_tree_block<V, MR, NV>};
  if constexpr (kWide) {
    static_assert(MR % 2 == 0, "a wide tile has half the rows");
    k.wide_pack_elements = level_pack_elements<V, MR / 2, 2 * NV>;
    k.wide_block = level_block<V, MR / 2, 2 * NV>;
  }
  return k;
}
template <class V32, class V64, int MR, int NV, bool kWide = false>
constexpr GemmKernels level_kernels() {
  return {level_table<V32, MR, NV, kWide>(), level_table<V64, MR, NV, kWide>()};
}

}  // namespace
}  // namespace moe::gemm_detail
