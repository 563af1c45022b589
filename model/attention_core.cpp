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

}  // namespace

// Per query tile and set of heads (head_set): scores by one GEMM, the mask and row softmax in
// place (a query's rows of the set together: they see the same columns), then one GEMM P·v.
template <class T>
void attn_core_forward(T* concat, T* probs, const T* q, const T* k_t, const T* v,
                       const AttnDims& d) {
  const int S = d.S, hd = d.hd, H = d.H, HD = H * hd, KD = d.KVH * hd, Wk = attn_keys_per_row(d);
  const int Kt = attn_keys_per_tile(d), group = H / d.KVH, Tq = attn_query_tile_rows();
  const int num_tiles = (S + Tq - 1) / Tq;
  const HeadSet set = head_set(d);
  const int sets = H / set.heads;
  const int ld_p = sets * Kt;  // between rows (s, h) of one set's probabilities
  const T scale = T(1) / std::sqrt(T(hd));
  // Every (tile, set of heads) writes its own probabilities and its own block of concat:
  // independent tasks.
  parallel_tasks(int64_t{num_tiles} * sets, [&](int64_t task) {
    const int t = static_cast<int>(task / sets), h0 = static_cast<int>(task % sets) * set.heads;
    const int g = h0 / group;
    const auto [s0, s1, lo] = query_tile(t, S, Tq, Wk);
    const int m = s1 - s0, n = s1 - lo, rows = m * set.heads;
    T* p = probs + (int64_t{s0} * H + h0) * Kt;  // rows (s, h) of the set, ld_p apart
    // The next tile's block of probabilities, written next by this thread where it runs the tiles
    // in order (a sequence's tasks inside a task per sequence, or one thread): hinted by the
    // tile's last set. With a team sharing the tiles the next block is another thread's: no hint
    // then, which would pull that thread's lines away.
    if (h0 + set.heads == H && s1 < S && omp_get_num_threads() == 1) {
      prefetch_values<1>(probs + int64_t{s1} * H * Kt, size_t(std::min(S - s1, Tq)) * H * Kt);
    }
    // z[s, h, j] = q_{s,h}·k_j/sqrt(hd) for every query row of the tile and every key any sees
    gemm_ld(false, false, rows, n, hd, scale, q + int64_t{s0} * HD + h0 * hd, set.row_stride,
            k_t + int64_t{g} * hd * S + lo, S, T(0), p, ld_p);
    for (int s = s0; s < s1; ++s) {  // the set's rows of query s see the same columns
      const int first = std::max(0, s - Wk + 1) - lo, last = s - lo;
      softmax_rows_masked(p + (s - s0) * set.heads * ld_p, ld_p, set.heads, first, last, n);
    }
    // o_{s,h} = Σ_j P[s, h, j]·v_j
    gemm_ld(false, false, rows, hd, n, T(1), p, ld_p, v + int64_t{lo} * KD + g * hd, KD, T(0),
            concat + int64_t{s0} * HD + h0 * hd, set.row_stride);
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
  const int S = d.S, hd = d.hd, H = d.H, HD = H * hd, KD = d.KVH * hd, Wk = attn_keys_per_row(d);
  const int Kt = attn_keys_per_tile(d), group = H / d.KVH, Tq = attn_query_tile_rows();
  const int num_tiles = (S + Tq - 1) / Tq;
  const HeadSet set = head_set(d);
  const int sets = H / set.heads;
  const int ld_p = sets * Kt, ld_head = H * Kt;
  // This sequence's work runs on the calling thread alone inside a task per sequence, or with one
  // thread. Else a single set's rows (every head at once) go in one block per thread: each row of
  // d_P, d_z and d_q depends on that row alone.
  const bool alone = omp_in_parallel() || omp_get_max_threads() == 1;
  const int parts = alone || sets > 1 ? 1 : omp_get_max_threads();
  const T scale = T(1) / std::sqrt(T(hd));
  std::fill(d_k_heads, d_k_heads + int64_t{H} * S * hd, T(0));
  std::fill(d_v_heads, d_v_heads + int64_t{H} * S * hd, T(0));
  for (int t = 0; t < num_tiles; ++t) {
    const auto [s0, s1, lo] = query_tile(t, S, Tq, Wk);
    const int m = s1 - s0, n = s1 - lo, rows = m * set.heads;
    const T* p_tile = probs + int64_t{s0} * H * Kt;  // rows (s, h), Kt apart
    // The saved probabilities were written in the forward, long before: this tile's block (the
    // first tile) and the next one's are fetched ahead of the GEMMs that read them, where this
    // thread reads them all (with a team, the hint would land in the wrong thread's cache).
    if (alone && t == 0) prefetch_values(p_tile, size_t(m) * H * Kt);
    if (alone && s1 < S) {
      prefetch_values(p_tile + int64_t{m} * H * Kt, size_t(std::min(S - s1, Tq)) * H * Kt);
    }
    parallel_tasks(int64_t{sets} * parts, [&](int64_t task) {
      const int h0 = static_cast<int>(task / parts) * set.heads, g = h0 / group;
      const int part = static_cast<int>(task % parts);
      const int r0 = rows * part / parts, r1 = rows * (part + 1) / parts;
      if (r0 == r1) return;
      const int64_t at = int64_t{s0} * HD + h0 * hd + int64_t{r0} * set.row_stride;
      T* dz = d_p + int64_t{h0} * Kt + int64_t{r0} * ld_p;
      // o_{s,h} = Σ_j P[s, h, j]·v_j  ->  d_P = d_o·vᵀ
      gemm_ld(false, false, r1 - r0, n, hd, T(1), d_concat + at, set.row_stride,
              v_t + int64_t{g} * hd * S + lo, S, T(0), dz, ld_p);
      // P = softmax_row(z)  ->  d_z, in place of d_P
      softmax_rows_backward(dz, p_tile + int64_t{h0} * Kt + int64_t{r0} * ld_p, ld_p, r1 - r0, n);
      // z = q·kᵀ/sqrt(hd)  ->  d_q = d_z·k/sqrt(hd) (each tile's rows written once)
      gemm_ld(false, false, r1 - r0, hd, n, scale, dz, ld_p, k + int64_t{lo} * KD + g * hd, KD,
              T(0), d_q + at, set.row_stride);
    });
    parallel_tasks(H, [&](int64_t task) {
      const int h = static_cast<int>(task);
      const T* d_o = d_concat + int64_t{s0} * HD + h * hd;
      // o_s = Σ_j P[s, j]·v_j  ->  d_v += Pᵀ·d_o
      gemm_ld(true, false, n, hd, m, T(1), p_tile + int64_t{h} * Kt, ld_head, d_o, HD, T(1),
              d_v_heads + (int64_t{h} * S + lo) * hd, hd);
      // z = q·kᵀ/sqrt(hd)  ->  d_k += d_zᵀ·q/sqrt(hd)
      gemm_ld(true, false, n, hd, m, scale, d_p + int64_t{h} * Kt, ld_head,
              q + int64_t{s0} * HD + h * hd, HD, T(1), d_k_heads + (int64_t{h} * S + lo) * hd, hd);
    });
  }
  for (int h = 0; h < d.H; ++h) {
    const int g = h / group;
    const T* d_k_h = d_k_heads + int64_t{h} * S * hd;
    const T* d_v_h = d_v_heads + int64_t{h} * S * hd;
    for (int s = 0; s < S; ++s) {
      T* dk = d_k + int64_t{s} * KD + g * hd;
      T* dv = d_v + int64_t{s} * KD + g * hd;
      for (int c = 0; c < hd; ++c) {
        dk[c] += d_k_h[int64_t{s} * hd + c];
        dv[c] += d_v_h[int64_t{s} * hd + c];
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
