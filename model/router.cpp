// Routing math of the MoE layer: logits, score functions with gradients, every expert selection
// (top-k, group-limited, hash, forced), hash tables and combine weights with gradient. Plain row
// loops: E and K are small. Legend: N rows/tokens, D model width, E experts, K top-k, V vocab.
#include "model/router.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "model/config.hpp"
#include "model/parallel.hpp"
#include "model/rng.hpp"
#include "model/router_simd.hpp"
#include "model/swiglu.hpp"
#include "numeric/det_math.hpp"

namespace moe {
namespace {

// softplus(x) = log(1 + exp(x)) = max(x, 0) + log1p(exp(-|x|)): never overflows, and keeps full
// precision for very negative x, where it tends to exp(x) rather than rounding to 0 early.
// In double through numeric/det_math.hpp, so that its bits are the same on every machine.
template <class T> T stable_softplus(T x) {
  return std::max(x, T(0)) + static_cast<T>(det::log1p(det::exp(-std::abs(double(x)))));
}

// The strict total order of top-k: a ranks before b when its value is larger, or equal with a
// lower expert index. NaN ranks after every number (NaNs among themselves by index): a diverged
// row still routes, to valid experts, deterministically, and the step's non-finite loss then
// stops the run on every rank. Throwing here instead would stop only the ranks whose rows hold
// the NaN. Top-k meets the experts in index order, so it only ever asks whether a value ranks
// before one of a lower index: when it is larger, or a number where that one is a NaN (equal
// values, and two NaNs, rank by index: the lower first).
template <class T> bool ranks_before_lower_index(T value, T lower_index_value) {
  // Non-short-circuit: one branch for the caller, not one per test.
  const bool larger = value > lower_index_value, number = !std::isnan(value),
             after_nan = std::isnan(lower_index_value);
  return larger | (after_nan & number);
}

// body(n0, n1) over the rows [0, N) in chunks of 16, on the threads when there are enough rows:
// the vectorised kernels' calls, each over whole rows.
template <class Body> void for_row_chunks(int N, Body&& body) {
  constexpr int kRowsPerChunk = 16;
#pragma omp parallel for schedule(static) if (N >= kParallelRows)
  for (int n0 = 0; n0 < N; n0 += kRowsPerChunk) body(n0, std::min(N, n0 + kRowsPerChunk));
}

}  // namespace

// Why not a GEMM: the logits decide which experts a token goes to, and a different rounding can
// flip a near-tie. A BLAS library picks kernels and splits the D sum by matrix size and thread
// count, so the same token could round differently with a different batch size, rank count or
// --threads (model/gemm/'s chain would not, but this loop predates it and costs little). It adds d
// = 0..D-1 in order, in T, for each (row, expert) on its own: a row's logits depend on that row
// only, bit for bit, however the tokens are batched or spread over ranks (so the step-0 expert
// loads are exactly the same for W = 1, 2, 4, 8). N·D·E is small next to the experts' GEMMs. (The
// build must not use -ffast-math, which would let the compiler reorder this sum.)
template <class T>
void router_logits_forward(T* logits, const T* in, const T* w_gate, int N, int D, int E) {
  if constexpr (std::is_same_v<T, float>) {
    // At the CPU's vector width: each lane is one (row, expert) sum, the same products and adds.
    for_row_chunks(
        N, [&](int n0, int n1) { router_logits_rows_f32(logits, in, w_gate, n0, n1, D, E); });
  } else {
#pragma omp parallel for schedule(static) if (N >= kParallelRows)
    for (int n = 0; n < N; ++n) router_logits_rows(logits, in, w_gate, n, n + 1, D, E);
  }
}

template <class T> void score_forward(T* scores, const T* logits, int N, int E, ScoreFunc f) {
  if constexpr (std::is_same_v<T, float>) {
    if (f == ScoreFunc::kSqrtSoftplus) {  // the same bits as the loop below, vectorised
      for_row_chunks(N, [&](int n0, int n1) {
        const int64_t first = int64_t{n0} * E, count = int64_t{n1 - n0} * E;
        sqrt_softplus_rows_f32(scores + first, logits + first, count);
      });
      return;
    }
  }
#pragma omp parallel for schedule(static) if (N >= kParallelRows)
  for (int n = 0; n < N; ++n) {
    const T* x = logits + int64_t{n} * E;
    T* s = scores + int64_t{n} * E;
    switch (f) {
      case ScoreFunc::kSqrtSoftplus:
        for (int e = 0; e < E; ++e) s[e] = std::sqrt(stable_softplus(x[e]));
        break;
      case ScoreFunc::kSigmoid:
        for (int e = 0; e < E; ++e) s[e] = stable_sigmoid(x[e]);
        break;
      case ScoreFunc::kSoftmax: {
        // Subtracting the row maximum keeps every exp in (0, 1]: no overflow at any logit.
        const T max_x = *std::max_element(x, x + E);
        T sum = T(0);
        for (int e = 0; e < E; ++e) {
          s[e] = static_cast<T>(det::exp(double(x[e] - max_x)));
          sum += s[e];
        }
        for (int e = 0; e < E; ++e) s[e] /= sum;
        break;
      }
    }
  }
}

template <class T>
void score_backward(T* d_logits, const T* d_scores, const T* logits, const T* scores, int N, int E,
                    ScoreFunc f) {
  if constexpr (std::is_same_v<T, float>) {
    if (f == ScoreFunc::kSqrtSoftplus) {  // the same bits as the loop below, vectorised
      for_row_chunks(N, [&](int n0, int n1) {
        const int64_t first = int64_t{n0} * E, count = int64_t{n1 - n0} * E;
        sqrt_softplus_backward_rows_f32(d_logits + first, d_scores + first, logits + first,
                                        scores + first, count);
      });
      return;
    }
  }
#pragma omp parallel for schedule(static) if (N >= kParallelRows)
  for (int n = 0; n < N; ++n) {
    const T* x = logits + int64_t{n} * E;
    const T* s = scores + int64_t{n} * E;
    const T* ds = d_scores + int64_t{n} * E;
    T* dx = d_logits + int64_t{n} * E;
    switch (f) {
      case ScoreFunc::kSqrtSoftplus:
        for (int e = 0; e < E; ++e) {
          // s = sqrt(softplus(x))  ->  d_x += d_s·σ(x)/(2s). For x → -inf both σ(x) ≈ e^x and
          // s ≈ e^(x/2) vanish and the ratio e^(x/2)/2 → 0; once s has underflowed to 0 the
          // true gradient is below the smallest number too, so it is 0.
          if (s[e] > T(0)) dx[e] += ds[e] * stable_sigmoid(x[e]) / (T(2) * s[e]);
        }
        break;
      case ScoreFunc::kSigmoid:
        // s = σ(x)  ->  d_x += d_s·s·(1 − s)
        for (int e = 0; e < E; ++e) dx[e] += ds[e] * s[e] * (T(1) - s[e]);
        break;
      case ScoreFunc::kSoftmax: {
        // s = softmax(x)  ->  d_x_i += s_i·(d_s_i − Σ_j d_s_j·s_j)
        T dot = T(0);
        for (int e = 0; e < E; ++e) dot += ds[e] * s[e];
        for (int e = 0; e < E; ++e) dx[e] += s[e] * (ds[e] - dot);
        break;
      }
    }
  }
}

namespace {

// The best K of one row in order: one pass over the experts in index order keeps the best K so
// far (insertion), exactly the first K of the total order, ties and NaNs included. Once K are
// kept, an expert enters only if it ranks before the K-th, whose value is kept at hand (most
// experts stop at that one comparison). No scratch memory.
template <class T, bool kBias>
void topk_row_of(int32_t* top, const T* s, const float* bias, int E, int K) {
  auto value = [&](int e) {
    if constexpr (kBias) {
      return s[e] + T(bias[e]);
    } else {
      return s[e];
    }
  };
  int count = 0;
  T last = T(0);  // the K-th's value, once K are kept
  for (int e = 0; e < E; ++e) {
    const T v = value(e);
    if (count == K && !ranks_before_lower_index(v, last)) continue;
    int p = count < K ? count++ : K - 1;
    for (; p > 0 && ranks_before_lower_index(v, value(top[p - 1])); --p) top[p] = top[p - 1];
    top[p] = e;
    if (count == K) last = value(top[K - 1]);
  }
}

template <class T> void topk_row(int32_t* top, const T* s, const float* bias, int E, int K) {
  if (K <= 0) return;
  if (E <= kRankedMaxE) return topk_row_ranked(top, s, bias, E, K);
  if (bias != nullptr) {
    topk_row_of<T, true>(top, s, bias, E, K);
  } else {
    topk_row_of<T, false>(top, s, bias, E, K);
  }
}

}  // namespace

template <class T>
void route_topk(int32_t* expert_idx, const T* scores, const float* bias, int N, int E, int K) {
  if (K < 0 || K > E) {
    throw std::invalid_argument("route_topk: need 0 <= K <= E, got K=" + std::to_string(K) +
                                " E=" + std::to_string(E));
  }
#pragma omp parallel for schedule(static) if (N >= kParallelRows)
  for (int n = 0; n < N; ++n) {
    topk_row(expert_idx + int64_t{n} * K, scores + int64_t{n} * E, bias, E, K);
  }
}

void route_hash(int32_t* expert_idx, const int32_t* token_ids, const int32_t* table, int N, int K,
                int V) {
  for (int n = 0; n < N; ++n) {
    const int32_t id = token_ids[n];
    if (id < 0 || id >= V) {
      throw std::out_of_range("route_hash: token id " + std::to_string(id) + " (row " +
                              std::to_string(n) +
                              ") is outside the vocabulary [0, V=" + std::to_string(V) + ")");
    }
    std::copy_n(table + int64_t{id} * K, K, expert_idx + int64_t{n} * K);
  }
}

void route_round_robin(int32_t* expert_idx, int64_t first_global_token, int N, int E, int K) {
  if (E <= 0 || first_global_token < 0) {
    throw std::invalid_argument(
        "route_round_robin: need E > 0 and first_global_token >= 0, got E=" + std::to_string(E) +
        " first_global_token=" + std::to_string(first_global_token));
  }
  for (int n = 0; n < N; ++n) {
    const int64_t slot0 = (first_global_token + n) * K;  // int64: T·K may exceed int
    for (int j = 0; j < K; ++j) {
      expert_idx[int64_t{n} * K + j] = static_cast<int32_t>((slot0 + j) % E);
    }
  }
}

void hash_table_init(int32_t* table, int V, int E, int K, uint64_t seed, int layer) {
  if (K <= 0 || K > E || V < 0) {
    throw std::invalid_argument(
        "hash_table_init: need 0 < K <= E and V >= 0, got K=" + std::to_string(K) +
        " E=" + std::to_string(E) + " V=" + std::to_string(V));
  }
  const uint64_t stream = rng_stream(seed, "layers." + std::to_string(layer) + ".moe.tid2eid");
  // Partial Fisher-Yates per row: draw j picks uniformly among the E - j experts not yet taken.
  // Draw (row, j) uses counter row·K + j, so a row never depends on the rows before it.
  std::vector<int32_t> perm(E);
  for (int row = 0; row < V; ++row) {
    std::iota(perm.begin(), perm.end(), 0);
    for (int j = 0; j < K; ++j) {
      const uint64_t draw = uint64_t(row) * uint64_t(K) + uint64_t(j);
      const int pick = j + static_cast<int>(rng_below(stream, draw, uint64_t(E - j)));
      std::swap(perm[j], perm[pick]);
      table[int64_t{row} * K + j] = perm[j];
    }
  }
}

void hash_table_validate(const int32_t* table, int V, int E, int K) {
  for (int row = 0; row < V; ++row) {
    const int32_t* r = table + int64_t{row} * K;
    for (int j = 0; j < K; ++j) {
      if (r[j] < 0 || r[j] >= E) {
        throw std::invalid_argument("hash table row " + std::to_string(row) + ": expert " +
                                    std::to_string(r[j]) +
                                    " is outside [0, E=" + std::to_string(E) + ")");
      }
      for (int i = 0; i < j; ++i) {
        if (r[i] == r[j]) {
          throw std::invalid_argument(
              "hash table row " + std::to_string(row) + ": expert " + std::to_string(r[j]) +
              " appears twice; a token needs K=" + std::to_string(K) + " distinct experts");
        }
      }
    }
  }
}

template <class T>
void route_weights_forward(T* weights, const T* scores, const int32_t* expert_idx, int N, int E,
                           int K, float route_scale) {
  for (int n = 0; n < N; ++n) {
    const T* s = scores + int64_t{n} * E;
    const int32_t* sel = expert_idx + int64_t{n} * K;
    T* w = weights + int64_t{n} * K;
    T sum = T(0);
    for (int j = 0; j < K; ++j) sum += s[sel[j]];
    const T denom = sum + T(1e-20);  // 1e-20: no 0/0 if every selected score underflowed
    for (int j = 0; j < K; ++j) w[j] = s[sel[j]] / denom * T(route_scale);
  }
}

template <class T>
void route_weights_backward(T* d_scores, const T* d_weights, const T* scores,
                            const int32_t* expert_idx, int N, int E, int K, float route_scale) {
#pragma omp parallel for schedule(static) if (N >= kParallelRows)
  for (int n = 0; n < N; ++n) {
    const T* s = scores + int64_t{n} * E;
    const int32_t* sel = expert_idx + int64_t{n} * K;
    const T* dw = d_weights + int64_t{n} * K;
    T* ds = d_scores + int64_t{n} * E;
    T sum = T(0), dot = T(0);
    for (int j = 0; j < K; ++j) {
      sum += s[sel[j]];
      dot += dw[j] * s[sel[j]];
    }
    const T denom = sum + T(1e-20);
    const T scale = T(route_scale);
    for (int j = 0; j < K; ++j) {
      // w_j = c·s_j/(Σs + ε)  ->  d_s_j += c·(d_w_j/(Σs + ε) − Σ_i d_w_i·s_i/(Σs + ε)²)
      ds[sel[j]] += scale * (dw[j] / denom - dot / (denom * denom));
    }
  }
}

template <class T>
void route_topk_grouped(int32_t* expert_idx, const T* scores, const float* bias, int N, int E,
                        int K, int groups, int group_topk) {
  if (groups <= 1) {
    route_topk(expert_idx, scores, bias, N, E, K);
    return;
  }
  if (E % groups != 0 || group_topk <= 0 || group_topk > groups || K % group_topk != 0 ||
      K / group_topk > E / groups || group_topk * (E / groups) < K) {
    throw std::invalid_argument("route_topk_grouped: impossible grouping");
  }
  const int per_group = E / groups, top_in_group = K / group_topk;
  // Each thread its own scratch; every token is computed alone, so the threads change no bit.
#pragma omp parallel if (N >= kParallelRows)
  {
    std::vector<T> biased(E), masked(E), group_score(groups);
    std::vector<int32_t> best(std::max(top_in_group, group_topk));
#pragma omp for schedule(static)
    for (int t = 0; t < N; ++t) {
      const T* st = scores + static_cast<size_t>(t) * E;
      bool finite = true;
      for (int e = 0; e < E; ++e) {
        biased[e] = st[e] + (bias ? T(bias[e]) : T(0));
        finite = finite && std::isfinite(biased[e]);
      }
      for (int g = 0; g < groups; ++g) {
        if (finite && top_in_group == 2) {
          // A group's two best values by a running pair instead of a top-k: among numbers the
          // total order is the order of values (±0 tie, and any sum from +0 of zeros is +0), so
          // the same two values, added in the same order.
          const T* v = &biased[g * per_group];
          T first = -std::numeric_limits<T>::infinity(), second = first;
          for (int j = 0; j < per_group; ++j) {
            second = std::max(second, std::min(first, v[j]));
            first = std::max(first, v[j]);
          }
          group_score[g] = (T(0) + first) + second;
          continue;
        }
        topk_row(best.data(), &biased[g * per_group], nullptr, per_group, top_in_group);
        group_score[g] = 0;
        for (int j = 0; j < top_in_group; ++j) group_score[g] += biased[g * per_group + best[j]];
      }
      topk_row(best.data(), group_score.data(), nullptr, groups, group_topk);
      int32_t* out = expert_idx + static_cast<size_t>(t) * K;
      if (finite) {
        // Every value a number: the masked row below places the dropped groups' experts strictly
        // below every kept one, so its top K is the top K of the kept groups' experts alone. They
        // go side by side in index order (the groups sorted), so that ties rank as in the row.
        std::sort(best.begin(), best.begin() + group_topk);
        for (int j = 0; j < group_topk; ++j) {
          std::copy_n(&biased[best[j] * per_group], per_group, &masked[j * per_group]);
        }
        topk_row(out, masked.data(), nullptr, group_topk * per_group, K);
        for (int j = 0; j < K; ++j) {
          out[j] = best[out[j] / per_group] * per_group + out[j] % per_group;
        }
        continue;
      }
      // Experts of dropped groups can never win: place them below every kept expert.
      T floor_value = biased[0];
      for (int e = 0; e < E; ++e) floor_value = std::min(floor_value, biased[e]);
      std::fill(masked.begin(), masked.end(), floor_value - T(1) - std::abs(floor_value));
      for (int j = 0; j < group_topk; ++j) {
        const int g = best[j];
        std::copy_n(&biased[g * per_group], per_group, &masked[g * per_group]);
      }
      topk_row(out, masked.data(), nullptr, E, K);
    }
  }
}

void route_random(int32_t* expert_idx, uint64_t stream, int64_t first_global_token, int N, int E,
                  int K, const RandomRouting& skew) {
  std::vector<double> base(E), weight(E);
  for (int e = 0; e < E; ++e) base[e] = det::pow(e + 1.0, -skew.zipf_alpha);
  const uint64_t draws = static_cast<uint64_t>(K) + 1;  // K picks and the hot coin per token
  for (int t = 0; t < N; ++t) {
    const uint64_t token = static_cast<uint64_t>(first_global_token + t);
    int32_t* sel = expert_idx + static_cast<size_t>(t) * K;
    weight = base;
    int j = 0;
    if (skew.hot_fraction > 0 && rng_uniform(stream, token * draws + K) < skew.hot_fraction) {
      sel[j++] = 0;
      weight[0] = 0.0;
    }
    // Sequential sampling without replacement: each slot draws among the experts not yet taken.
    for (; j < K; ++j) {
      double total = 0;
      for (int e = 0; e < E; ++e) total += weight[e];
      double u = rng_uniform(stream, token * draws + j) * total;
      int pick = E - 1;
      for (int e = 0; e < E; ++e) {
        if (weight[e] > 0 && (u -= weight[e]) < 0) {
          pick = e;
          break;
        }
      }
      while (weight[pick] == 0) --pick;  // rounding at the top end: the last expert still free
      sel[j] = pick;
      weight[pick] = 0.0;
    }
  }
}

#define MOE_ROUTER_INSTANTIATE(T)                                                                \
  template void router_logits_forward<T>(T*, const T*, const T*, int, int, int);                 \
  template void score_forward<T>(T*, const T*, int, int, ScoreFunc);                             \
  template void score_backward<T>(T*, const T*, const T*, const T*, int, int, ScoreFunc);        \
  template void route_topk<T>(int32_t*, const T*, const float*, int, int, int);                  \
  template void route_weights_forward<T>(T*, const T*, const int32_t*, int, int, int, float);    \
  template void route_weights_backward<T>(T*, const T*, const T*, const int32_t*, int, int, int, \
                                          float);                                                \
  template void route_topk_grouped<T>(int32_t*, const T*, const float*, int, int, int, int, int);
MOE_ROUTER_INSTANTIATE(float)
MOE_ROUTER_INSTANTIATE(double)
#undef MOE_ROUTER_INSTANTIATE

}  // namespace moe
