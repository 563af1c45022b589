// Balance loss, bias update, extra routing policies and balance metrics.
#include "model/balance.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "model/config.hpp"
#include "model/rng.hpp"
#include "model/router.hpp"
#include "model/tree_sum.hpp"
#include "numeric/det_math.hpp"

namespace moe {

namespace {

// DeepSeek form for one sequence of S rows; returns Σ_e f_e·P_e and writes ∂/∂s times `weight`.
template <class T>
double deepseek_sequence(T* d_s, int32_t* topk, std::vector<double>& scratch, const T* s, int S,
                         int E, int K, double weight) {
  route_topk(topk, s, nullptr, S, E, K);
  scratch.assign(2 * static_cast<size_t>(E), 0.0);
  double* f = scratch.data();
  double* P = f + E;
  for (int i = 0; i < S * K; ++i) f[topk[i]] += 1.0;
  for (int e = 0; e < E; ++e) f[e] *= static_cast<double>(E) / (static_cast<double>(K) * S);
  for (int t = 0; t < S; ++t) {
    const T* st = s + static_cast<size_t>(t) * E;
    double sum = 0;
    for (int e = 0; e < E; ++e) sum += st[e];
    for (int e = 0; e < E; ++e) P[e] += st[e] / (sum * S);
  }
  double loss = 0;
  for (int e = 0; e < E; ++e) loss += f[e] * P[e];
  // P_e = (1/S)·Σ_t s_te/Σ_t  =>  ∂L/∂s_tj = w/(S·Σ_t)·(f_j − Σ_e f_e·s_te/Σ_t)
  for (int t = 0; t < S; ++t) {
    const T* st = s + static_cast<size_t>(t) * E;
    T* dt = d_s + static_cast<size_t>(t) * E;
    double sum = 0, fp = 0;
    for (int e = 0; e < E; ++e) sum += st[e];
    for (int e = 0; e < E; ++e) fp += f[e] * st[e] / sum;
    for (int e = 0; e < E; ++e) dt[e] = static_cast<T>(weight / (S * sum) * (f[e] - fp));
  }
  return loss;
}

// MaxText form for one sequence; p from softmax(s + b), d from the actual selection.
template <class T>
double maxtext_sequence(T* d_s, std::vector<double>& scratch, const T* s, const int32_t* sel,
                        const float* bias, int S, int E, int K, double weight) {
  scratch.assign((2 + static_cast<size_t>(S)) * E, 0.0);
  double* d = scratch.data();
  double* p = d + E;
  double* prob = p + E;  // [S, E] softmax(s + b)
  for (int i = 0; i < S * K; ++i) d[sel[i]] += 1.0 / S;
  for (int t = 0; t < S; ++t) {
    const T* st = s + static_cast<size_t>(t) * E;
    double* pt = &prob[static_cast<size_t>(t) * E];
    double mx = -1e300, sum = 0;
    for (int e = 0; e < E; ++e) mx = std::max(mx, static_cast<double>(st[e]) + bias[e]);
    for (int e = 0; e < E; ++e) sum += pt[e] = det::exp(st[e] + bias[e] - mx);
    for (int e = 0; e < E; ++e) p[e] += (pt[e] /= sum) / S;
  }
  double loss = 0;
  for (int e = 0; e < E; ++e) loss += E * d[e] * p[e];
  // p_e = (1/S)·Σ_t softmax_te  =>  ∂L/∂s_tj = w·E/S·prob_tj·(d_j − Σ_e d_e·prob_te)
  for (int t = 0; t < S; ++t) {
    const double* pt = &prob[static_cast<size_t>(t) * E];
    T* dt = d_s + static_cast<size_t>(t) * E;
    double dp = 0;
    for (int e = 0; e < E; ++e) dp += d[e] * pt[e];
    for (int e = 0; e < E; ++e) dt[e] = static_cast<T>(weight * E / S * pt[e] * (d[e] - dp));
  }
  return loss;
}

}  // namespace

template <class T>
double balance_loss_forward_backward(T* d_scores, int32_t* topk, std::vector<double>& scratch,
                                     const T* scores, const int32_t* selected, const float* bias,
                                     int B, int S, int E, int K, double weight,
                                     BalanceLossForm form) {
  // Each sequence's weighted loss, added along the fixed tree over sequences (model/tree_sum.hpp):
  // the same bits however the sequences are dealt out to ranks.
  TreeSumScalar total;
  for (int b = 0; b < B; ++b) {
    const size_t row = static_cast<size_t>(b) * S;
    total.push(weight * (form == BalanceLossForm::kDeepSeek
                             ? deepseek_sequence(d_scores + row * E, topk + row * K, scratch,
                                                 scores + row * E, S, E, K, weight)
                             : maxtext_sequence(d_scores + row * E, scratch, scores + row * E,
                                                selected + row * K, bias, S, E, K, weight)));
  }
  return total.finish();
}

void bias_update(std::span<float> bias, std::span<const int64_t> load, double rate, bool center) {
  const size_t E = bias.size();
  const double mean =
      static_cast<double>(std::accumulate(load.begin(), load.end(), int64_t{0})) / E;
  double shift = 0;
  std::vector<double> step(E);
  for (size_t e = 0; e < E; ++e) {
    const double diff = mean - static_cast<double>(load[e]);
    step[e] = rate * ((diff > 0) - (diff < 0));
    shift += step[e] / E;
  }
  for (size_t e = 0; e < E; ++e) bias[e] += static_cast<float>(center ? step[e] - shift : step[e]);
}

void shadow_bias_update(const ShadowRule& rule, std::span<float> bias,
                        std::span<const int64_t> load) {
  switch (rule.kind) {
    case ShadowKind::kNone:
      return;
    case ShadowKind::kSign:
    case ShadowKind::kSignCentered:
      bias_update(bias, load, rule.rate, rule.kind == ShadowKind::kSignCentered);
      return;
    case ShadowKind::kProportional: {
      const size_t E = bias.size();
      const double mean =
          static_cast<double>(std::accumulate(load.begin(), load.end(), int64_t{0})) / E;
      if (mean <= 0) return;
      for (size_t e = 0; e < E; ++e) {
        bias[e] += static_cast<float>(rule.rate * (mean - static_cast<double>(load[e])) / mean);
      }
      return;
    }
  }
}

BalanceMetrics balance_metrics(std::span<const int64_t> load) {
  BalanceMetrics m;
  const double E = static_cast<double>(load.size());
  double mean = 0;
  for (int64_t c : load) mean += static_cast<double>(c);
  mean /= E;
  double var = 0, mx = 0;
  for (int64_t c : load) {
    var += (c - mean) * (c - mean);
    mx = std::max(mx, static_cast<double>(c));
  }
  m.variance = var / E;
  if (mean > 0) {
    m.max_violation = (mx - mean) / mean;
    m.cv = std::sqrt(m.variance) / mean;
  }
  return m;
}

double overload_factor(std::span<const int64_t> rank_load) {
  double mean = 0, mx = 0;
  for (int64_t c : rank_load) {
    mean += static_cast<double>(c);
    mx = std::max(mx, static_cast<double>(c));
  }
  mean /= static_cast<double>(rank_load.size());
  return mean > 0 ? mx / mean : 1.0;
}

#define MOE_BALANCE_INSTANTIATE(T)                                                               \
  template double balance_loss_forward_backward<T>(T*, int32_t*, std::vector<double>&, const T*, \
                                                   const int32_t*, const float*, int, int, int,  \
                                                   int, double, BalanceLossForm);
MOE_BALANCE_INSTANTIATE(float)
MOE_BALANCE_INSTANTIATE(double)
#undef MOE_BALANCE_INSTANTIATE

}  // namespace moe
