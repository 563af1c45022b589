// The masked softmax core of attention by tiles of query rows (model/attention_core.hpp).
// Legend: S sequence length, H heads, KVH kv heads, hd head dim, Wk keys a query row sees at
// most, Tq query rows per tile, Kt keys a tile sees; HD = H·hd, KD = KVH·hd.
//
// The core runs on GEMMs per tile of Tq query rows: the tile's queries see the keys [lo, s1)
// between them (lo = max(0, s0 − Wk + 1)), so with a window only about Tq + Wk − 1 keys are scored
// per tile instead of S; scores outside a row's own window are masked to P = 0 exactly. Tiles are
// fixed by S and Tq alone, so the GEMM shapes do not depend on how many sequences a rank holds.
// Where every head shares one kv head, a tile's heads go through each GEMM together (HeadSet).
#include "model/attention_core.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "model/blas.hpp"
#include "model/parallel.hpp"
#include "model/prefetch.hpp"
#include "model/softmax_rows.hpp"

namespace moe {
namespace {

// The query rows [s0, s1) of tile t and the keys [lo, s1) they see between them; row s sees only
// keys [max(0, s − Wk + 1), s], columns [first, last] of the tile's n = s1 − lo.
struct QueryTile {
  int s0, s1, lo;
};
QueryTile query_tile(int t, int S, int Tq, int Wk) {
  const int s0 = t * Tq, s1 = std::min(S, s0 + Tq);
  return {s0, s1, std::max(0, s0 - Wk + 1)};
}

// The heads one GEMM of the core takes at once: every head when they all share one kv head
// (KVH = 1), else one. A tile's rows (s, h) of q, concat, d_q and d_concat, head h of those taken,
// lie `row_stride` apart in s-major order: hd apart when every head is taken (HD = H·hd, so the
// last head of row s is followed by the first of row s + 1), HD apart for one head. Rows of the
// probabilities (s, h) lie Kt apart in that order, [S, H, Kt]. A GEMM of m·heads rows computes each
// element by the same chain as m rows of one head: only the calls' count and sizes change.
struct HeadSet {
  int heads;       // taken per call: H or 1
  int row_stride;  // between rows (s, h) of q, concat, d_q, d_concat: hd or HD
};
HeadSet head_set(const AttnDims& d) {
  return d.KVH == 1 ? HeadSet{d.H, d.hd} : HeadSet{1, d.H * d.hd};
}

// What both passes over a sequence's tiles use.
struct CoreShape {
  int S, hd, H, HD, KD, Wk, Kt, group, Tq, num_tiles;
  HeadSet set;
  int sets;  // sets of heads a tile's GEMMs take one after another: H / set.heads
  int ld_p;  // between rows (s, h) of one set's probabilities (and of d_p)
};
CoreShape core_shape(const AttnDims& d) {
  const HeadSet set = head_set(d);
  const int Tq = attn_query_tile_rows(), Kt = attn_keys_per_tile(d), sets = d.H / set.heads;
  return {d.S,      d.hd,        d.H, d.H * d.hd,          d.KVH * d.hd, attn_keys_per_row(d),
          Kt,       d.H / d.KVH, Tq,  (d.S + Tq - 1) / Tq, set,          sets,
          sets * Kt};
}

}  // namespace

// Per query tile and set of heads (head_set): scores by one GEMM, the mask and row softmax in
// place (a query's rows of the set together: they see the same columns), then one GEMM P·v.
template <class T>
void attn_core_forward(T* concat, T* probs, const T* q, const T* k_t, const T* v,
                       const AttnDims& d) {
  const CoreShape c = core_shape(d);
  const T scale = T(1) / std::sqrt(T(c.hd));
  // Every (tile, set of heads) writes its own probabilities and its own block of concat:
  // independent tasks.
  parallel_tasks(int64_t{c.num_tiles} * c.sets, [&](int64_t task) {
    const int t = static_cast<int>(task / c.sets),
              h0 = static_cast<int>(task % c.sets) * c.set.heads;
    const int g = h0 / c.group;
    const auto [s0, s1, lo] = query_tile(t, c.S, c.Tq, c.Wk);
    const int m = s1 - s0, n = s1 - lo, rows = m * c.set.heads;
    T* p = probs + (int64_t{s0} * c.H + h0) * c.Kt;  // rows (s, h) of the set, ld_p apart
    // The next tile's block of probabilities, written next by this thread where it runs the tiles
    // in order (a sequence's tasks inside a task per sequence, or one thread): hinted by the
    // tile's last set. With a team sharing the tiles the next block is another thread's: no hint
    // then, which would pull that thread's lines away.
    if (h0 + c.set.heads == c.H && s1 < c.S && omp_get_num_threads() == 1) {
      prefetch_values<1>(probs + int64_t{s1} * c.H * c.Kt,
                         size_t(std::min(c.S - s1, c.Tq)) * c.H * c.Kt);
    }
    // z[s, h, j] = q_{s,h}·k_j/sqrt(hd) for every query row of the tile and every key any sees
    gemm_ld(false, false, rows, n, c.hd, scale, q + int64_t{s0} * c.HD + h0 * c.hd,
            c.set.row_stride, k_t + int64_t{g} * c.hd * c.S + lo, c.S, T(0), p, c.ld_p);
    for (int s = s0; s < s1; ++s) {  // the set's rows of query s see the same columns
      const int first = std::max(0, s - c.Wk + 1) - lo, last = s - lo;
      softmax_rows_masked(p + (s - s0) * c.set.heads * c.ld_p, c.ld_p, c.set.heads, first, last, n);
    }
    // o_{s,h} = Σ_j P[s, h, j]·v_j
    gemm_ld(false, false, rows, c.hd, n, T(1), p, c.ld_p, v + int64_t{lo} * c.KD + g * c.hd, c.KD,
            T(0), concat + int64_t{s0} * c.HD + h0 * c.hd, c.set.row_stride);
  });
}

// Tile by tile, in order: per set of heads (head_set), ∂L/∂P, then ∂L/∂scores in its place in d_p,
// then d_q from it; then each head's share of d_k and d_v, a task per head, added into d_k_heads,
// d_v_heads tile after tile. The heads of a kv group are then added in head order, so the sums
// do not depend on the threads.
template <class T>
void attn_core_backward(T* d_q, T* d_k, T* d_v, T* d_p, T* d_k_heads, T* d_v_heads,
                        const T* d_concat, const T* probs, const T* q, const T* k, const T* v_t,
                        const AttnDims& d) {
  const CoreShape c = core_shape(d);
  const int ld_head = c.H * c.Kt;  // between a head's rows (s, h) of the probabilities and d_p
  // This sequence's work runs on the calling thread alone inside a task per sequence, or with one
  // thread. Else a single set's rows (every head at once) go in one block per thread: each row of
  // d_P, d_z and d_q depends on that row alone.
  const bool alone = omp_in_parallel() || omp_get_max_threads() == 1;
  const int parts = alone || c.sets > 1 ? 1 : omp_get_max_threads();
  const T scale = T(1) / std::sqrt(T(c.hd));
  std::fill(d_k_heads, d_k_heads + int64_t{c.H} * c.S * c.hd, T(0));
  std::fill(d_v_heads, d_v_heads + int64_t{c.H} * c.S * c.hd, T(0));
  for (int t = 0; t < c.num_tiles; ++t) {
    const auto [s0, s1, lo] = query_tile(t, c.S, c.Tq, c.Wk);
    const int m = s1 - s0, n = s1 - lo, rows = m * c.set.heads;
    const T* p_tile = probs + int64_t{s0} * c.H * c.Kt;  // rows (s, h), Kt apart
    // The saved probabilities were written in the forward, long before: this tile's block (the
    // first tile) and the next one's are fetched ahead of the GEMMs that read them, where this
    // thread reads them all (with a team, the hint would land in the wrong thread's cache).
    // So are the tile's query rows, which d_k's GEMMs read (as B), each head's hd values
    // of each row: runs too short for the hardware's prefetchers (d_k's GEMMs ran at 71-78 GF/s,
    // 106-114 with the hint, deepseek4-tiny 1 × 1, bench_step --gemm-sites).
    if (alone && t == 0) {
      prefetch_values(p_tile, size_t(m) * c.H * c.Kt);
      prefetch_values(q + int64_t{s0} * c.HD, size_t(m) * c.HD);
    }
    if (alone && s1 < c.S) {
      const int next = std::min(c.S - s1, c.Tq);
      prefetch_values(p_tile + int64_t{m} * c.H * c.Kt, size_t(next) * c.H * c.Kt);
      prefetch_values(q + int64_t{s1} * c.HD, size_t(next) * c.HD);
    }
    parallel_tasks(int64_t{c.sets} * parts, [&](int64_t task) {
      const int h0 = static_cast<int>(task / parts) * c.set.heads, g = h0 / c.group;
      const int part = static_cast<int>(task % parts);
      const int r0 = rows * part / parts, r1 = rows * (part + 1) / parts;
      if (r0 == r1) return;
      const int64_t at = int64_t{s0} * c.HD + h0 * c.hd + int64_t{r0} * c.set.row_stride;
      T* dz = d_p + int64_t{h0} * c.Kt + int64_t{r0} * c.ld_p;
      // o_{s,h} = Σ_j P[s, h, j]·v_j  ->  d_P = d_o·vᵀ
      gemm_ld(false, false, r1 - r0, n, c.hd, T(1), d_concat + at, c.set.row_stride,
              v_t + int64_t{g} * c.hd * c.S + lo, c.S, T(0), dz, c.ld_p);
      // P = softmax_row(z)  ->  d_z, in place of d_P
      softmax_rows_backward(dz, p_tile + int64_t{h0} * c.Kt + int64_t{r0} * c.ld_p, c.ld_p, r1 - r0,
                            n);
      // z = q·kᵀ/sqrt(hd)  ->  d_q = d_z·k/sqrt(hd) (each tile's rows written once)
      gemm_ld(false, false, r1 - r0, c.hd, n, scale, dz, c.ld_p, k + int64_t{lo} * c.KD + g * c.hd,
              c.KD, T(0), d_q + at, c.set.row_stride);
    });
    parallel_tasks(c.H, [&](int64_t task) {
      const int h = static_cast<int>(task);
      const T* d_o = d_concat + int64_t{s0} * c.HD + h * c.hd;
      // o_s = Σ_j P[s, j]·v_j  ->  d_v += Pᵀ·d_o
      gemm_ld(true, false, n, c.hd, m, T(1), p_tile + int64_t{h} * c.Kt, ld_head, d_o, c.HD, T(1),
              d_v_heads + (int64_t{h} * c.S + lo) * c.hd, c.hd);
      // z = q·kᵀ/sqrt(hd)  ->  d_k += d_zᵀ·q/sqrt(hd)
      gemm_ld(true, false, n, c.hd, m, scale, d_p + int64_t{h} * c.Kt, ld_head,
              q + int64_t{s0} * c.HD + h * c.hd, c.HD, T(1),
              d_k_heads + (int64_t{h} * c.S + lo) * c.hd, c.hd);
    });
  }
  for (int h = 0; h < c.H; ++h) {
    const int g = h / c.group;
    const T* d_k_h = d_k_heads + int64_t{h} * c.S * c.hd;
    const T* d_v_h = d_v_heads + int64_t{h} * c.S * c.hd;
    for (int s = 0; s < c.S; ++s) {
      T* dk = d_k + int64_t{s} * c.KD + g * c.hd;
      T* dv = d_v + int64_t{s} * c.KD + g * c.hd;
      for (int j = 0; j < c.hd; ++j) {
        dk[j] += d_k_h[int64_t{s} * c.hd + j];
        dv[j] += d_v_h[int64_t{s} * c.hd + j];
      }
    }
  }
}

template void attn_core_forward<float>(float*, float*, const float*, const float*, const float*,
                                       const AttnDims&);
template void attn_core_forward<double>(double*, double*, const double*, const double*,
                                        const double*, const AttnDims&);
template void attn_core_backward<float>(float*, float*, float*, float*, float*, float*,
                                        const float*, const float*, const float*, const float*,
                                        const float*, const AttnDims&);
template void attn_core_backward<double>(double*, double*, double*, double*, double*, double*,
                                         const double*, const double*, const double*, const double*,
                                         const double*, const AttnDims&);

}  // namespace moe
