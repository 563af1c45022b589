// Balance loss, bias update, extra routing policies and balance metrics.
#include "model/balance.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/config.hpp"
#include "model/rng.hpp"
#include "model/router.hpp"
#include "model/tree_sum.hpp"

namespace moe {

BalanceLossForm balance_loss_form_from_name(std::string_view name) {
  if (name == "deepseek") return BalanceLossForm::kDeepSeek;
  if (name == "maxtext") return BalanceLossForm::kMaxText;
  throw ConfigError("--balance-loss-form: unknown form '" + std::string(name) +
                    "' (valid: deepseek, maxtext)");
}

const char* balance_loss_form_name(BalanceLossForm form) {
  return form == BalanceLossForm::kDeepSeek ? "deepseek" : "maxtext";
}

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
    for (int e = 0; e < E; ++e) sum += pt[e] = std::exp(st[e] + bias[e] - mx);
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

template <class T>
void route_topk_grouped(int32_t* expert_idx, const T* scores, const float* bias, int N, int E,
                        int K, int groups, int group_topk) {
  if (groups <= 0 || E % groups != 0 || group_topk <= 0 || group_topk > groups ||
      K % group_topk != 0 || K / group_topk > E / groups ||
      group_topk * (E / groups) < K) {
    throw std::invalid_argument("route_topk_grouped: impossible grouping");
  }
  const int per_group = E / groups, top_in_group = K / group_topk;
  std::vector<T> biased(E), masked(E), group_score(groups);
  std::vector<int32_t> best(std::max(top_in_group, group_topk));
  for (int t = 0; t < N; ++t) {
    const T* st = scores + static_cast<size_t>(t) * E;
    for (int e = 0; e < E; ++e) biased[e] = st[e] + (bias ? T(bias[e]) : T(0));
    for (int g = 0; g < groups; ++g) {
      route_topk(best.data(), &biased[g * per_group], nullptr, 1, per_group, top_in_group);
      group_score[g] = 0;
      for (int j = 0; j < top_in_group; ++j) group_score[g] += biased[g * per_group + best[j]];
    }
    route_topk(best.data(), group_score.data(), nullptr, 1, groups, group_topk);
    // Experts of dropped groups can never win: place them below every kept expert.
    T floor_value = biased[0];
    for (int e = 0; e < E; ++e) floor_value = std::min(floor_value, biased[e]);
    std::fill(masked.begin(), masked.end(), floor_value - T(1) - std::abs(floor_value));
    for (int j = 0; j < group_topk; ++j) {
      const int g = best[j];
      std::copy_n(&biased[g * per_group], per_group, &masked[g * per_group]);
    }
    route_topk(expert_idx + static_cast<size_t>(t) * K, masked.data(), nullptr, 1, E, K);
  }
}

void route_random(int32_t* expert_idx, uint64_t stream, int64_t first_global_token, int N, int E,
                  int K, const RandomRouting& skew) {
  std::vector<double> base(E), weight(E);
  for (int e = 0; e < E; ++e) base[e] = std::pow(e + 1.0, -skew.zipf_alpha);
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

ForcedRouting forced_routing_from_name(std::string_view spec) {
  ForcedRouting f;
  // The same strict form as every numeric option: the whole rest is one decimal number.
  auto number_after = [&](std::string_view prefix, double lo, double hi) {
    const std::string_view text = spec.substr(prefix.size());
    double v = -1;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec != std::errc() || end != text.data() + text.size() || text.empty() ||
        !(v >= lo && v <= hi)) {
      char range[48];
      std::snprintf(range, sizeof range, "[%g, %g]", lo, hi);
      throw ConfigError("--force-balance: '" + std::string(spec) + "' needs a number in " + range +
                        " after '" + std::string(prefix) + "'");
    }
    return v;
  };
  if (spec == "none") return f;
  f.forced = true;
  if (spec == "round-robin") {
    f.round_robin = true;
  } else if (spec == "random") {
  } else if (spec.starts_with("zipf:")) {
    f.skew.zipf_alpha = number_after("zipf:", 0.0, 10.0);
  } else if (spec.starts_with("hot:")) {
    f.skew.hot_fraction = number_after("hot:", 0.0, 1.0);
  } else {
    throw ConfigError("--force-balance: unknown mode '" + std::string(spec) +
                      "' (valid: none, round-robin, random, zipf:ALPHA, hot:FRACTION)");
  }
  return f;
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

#define MOE_BALANCE_INSTANTIATE(T)                                                            \
  template double balance_loss_forward_backward<T>(T*, int32_t*, std::vector<double>&,        \
                                                   const T*, const int32_t*, const float*, int, \
                                                   int, int, int, double, BalanceLossForm);    \
  template void route_topk_grouped<T>(int32_t*, const T*, const float*, int, int, int, int, int);
MOE_BALANCE_INSTANTIATE(float)
MOE_BALANCE_INSTANTIATE(double)
#undef MOE_BALANCE_INSTANTIATE

}  // namespace moe
