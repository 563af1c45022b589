// The router's row loops that run at the CPU's vector width (model/simd.hpp): its logits and its
// sqrt(softplus) scores with their backward, in float, and top-k by ranks or by passes of a
// maximum, for model/router.cpp.
// Each gives the bits of the plain loop router.cpp documents, at every level
// (tests/model/test_simd.cpp, tests/model/test_router.cpp).
// Legend: D model width, E experts, K top-k; rows [n0, n1) of N.
#pragma once

#include <algorithm>
#include <cstdint>

namespace moe {

// R rows from n by W experts from e0 of logits = in·W_g: each (row, expert) adds d = 0..D-1 in
// order, from +0, each product and each add rounded on its own. The sums lie in a local array the
// compiler keeps in registers (row[] itself could alias the inputs, so each += would go through
// memory), the R rows' side by side so that more adds are in flight than one row's W.
template <class T, int R, int W>
[[gnu::always_inline]] inline void router_logits_tile(T* logits, const T* in, const T* w_gate,
                                                      int n, int D, int E, int e0) {
  T acc[R][W] = {};
  for (int d = 0; d < D; ++d) {
    const T* w = w_gate + int64_t{d} * E + e0;
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const T xd = in[int64_t{n + r} * D + d];
      for (int i = 0; i < W; ++i) acc[r][i] += xd * w[i];
    }
  }
  for (int r = 0; r < R; ++r) std::copy_n(acc[r], W, logits + int64_t{n + r} * E + e0);
}

// 8 rows from n of logits for E = W experts (8 or 16), the sums router_logits_tile describes: a
// row's W sums are one value of GCC's vector extension, the 8 rows' side by side (the compiler's
// own vectorisation of router_logits_tile at these widths ran 2.4x slower than a row at a time).
template <class T, int W>
[[gnu::always_inline]] inline void router_logits_narrow(T* logits, const T* in, const T* w_gate,
                                                        int n, int D) {
  typedef T Row __attribute__((vector_size(W * sizeof(T))));
  Row acc[8];
  for (Row& a : acc) a = Row{};
  for (int d = 0; d < D; ++d) {
    Row w;
    __builtin_memcpy(&w, w_gate + int64_t{d} * W, sizeof(Row));
#pragma GCC unroll 8
    for (int r = 0; r < 8; ++r) acc[r] += in[int64_t{n + r} * D + d] * w;
  }
  for (int r = 0; r < 8; ++r) __builtin_memcpy(logits + int64_t{n + r} * W, &acc[r], sizeof(Row));
}

// Rows [n0, n1) of logits = in·W_g (router_logits_forward says why not a GEMM), every (row,
// expert) the sum router_logits_tile describes: at E = 8 (deepseek4-tiny) or 16, 8 rows at a
// time (router_logits_narrow: the router's forward twice as fast); where E is a multiple of 64
// (deepseek4-fine), 4 rows at a time in blocks of 64 experts (9% faster); otherwise, and for the
// rows left over, a row at a time in blocks of up to 64. How many rows and experts share a tile
// changes no sum.
template <class T>
[[gnu::always_inline]] inline void router_logits_rows(T* logits, const T* in, const T* w_gate,
                                                      int n0, int n1, int D, int E) {
  constexpr int kBlock = 64;
  int n = n0;
  if (E == 8) {
    for (; n + 8 <= n1; n += 8) router_logits_narrow<T, 8>(logits, in, w_gate, n, D);
  } else if (E == 16) {
    for (; n + 8 <= n1; n += 8) router_logits_narrow<T, 16>(logits, in, w_gate, n, D);
  }
  if (E % kBlock == 0) {
    for (; n + 4 <= n1; n += 4) {
      for (int e0 = 0; e0 < E; e0 += kBlock) {
        router_logits_tile<T, 4, kBlock>(logits, in, w_gate, n, D, E, e0);
      }
    }
  }
  for (; n < n1; ++n) {
    const T* x = in + int64_t{n} * D;
    T* row = logits + int64_t{n} * E;
    for (int e0 = 0; e0 < E; e0 += kBlock) {
      const int width = std::min(kBlock, E - e0);
      if (width == kBlock) {
        router_logits_tile<T, 1, kBlock>(logits, in, w_gate, n, D, E, e0);
        continue;
      }
      T acc[kBlock] = {};
      for (int d = 0; d < D; ++d) {
        const T xd = x[d];
        const T* w = w_gate + int64_t{d} * E + e0;
        for (int i = 0; i < width; ++i) acc[i] += xd * w[i];
      }
      std::copy_n(acc, width, row + e0);
    }
  }
}

// router_logits_rows in float, at the level simd_level() names: each lane one (row, expert) sum.
void router_logits_rows_f32(float* logits, const float* in, const float* w_gate, int n0, int n1,
                            int D, int E);

// s = sqrt(softplus(x)) of `count` floats: the bits of sqrt(stable_softplus(x)).
void sqrt_softplus_rows_f32(float* s, const float* x, int64_t count);

// dx += ds·σ(x)/(2s) of `count` floats where s > 0; dx is kept as it was where s is 0 or NaN.
void sqrt_softplus_backward_rows_f32(float* dx, const float* ds, const float* x, const float* s,
                                     int64_t count);

// Rows of at most this many experts take top-k by ranks (topk_row_ranked): measured 2x faster
// than insertion (router.cpp's topk_row_of) at E = 8, K = 3 and 1.5x at E = 64, K = 8
// (bench_row_kernels), where insertion's branches follow the data. Ranks cost E·E comparisons,
// insertion about E: longer rows keep insertion. Float rows with K <= E/8 take K passes of a
// maximum instead (E·K comparisons; at E = 64, K = 8 1.9x faster than ranks at avx512).
inline constexpr int kRankedMaxE = 64;

// The first K of the row's E <= kRankedMaxE values (s[e] + T(bias[e]) with a bias) in the total
// order of router.cpp's top-k, by ranks or passes of a maximum: the same selection in the same
// order as insertion. Float rows compare at the CPU's level; double rows (the gradient checks) in
// the plain build, by ranks.
void topk_row_ranked(int32_t* top, const float* s, const float* bias, int E, int K);
void topk_row_ranked(int32_t* top, const double* s, const float* bias, int E, int K);

}  // namespace moe
