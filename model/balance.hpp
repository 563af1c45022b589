// Load balancing of top-k layers (docs/load-balancing.md): the sequence-wise balance loss with its
// gradient, the loss-free bias update, and the balance metrics computed from global loads. Every
// expert selection (group-limited top-k and forced routing included) is in model/router.hpp.
//
// Legend: N = B·S local tokens in B sequences of S, E experts, K experts per token, L layers,
// W ranks, c[e] global load (assignments) of expert e in one layer.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/routing_config.hpp"

namespace moe {

// kDeepSeek (default), per sequence:
//   f_e = E/(K·S)·Σ_t 1[e ∈ TopK(s(t))]   (top-k of the unbiased scores)
//   P_e = (1/S)·Σ_t s(t)[e] / Σ_e' s(t)[e']
//   L   = α·Σ_e f_e·P_e, averaged over the step's sequences, summed over top-k layers.
// kMaxText (MaxText pull request #4190's form, for like-for-like comparisons), per sequence:
//   d_e = (1/S)·Σ_t 1[e ∈ sel(t)]          (the actual, biased selection)
//   p_e = (1/S)·Σ_t softmax(s(t) + b)[e]
//   L   = α·E·Σ_e d_e·p_e  (= K times the DeepSeek form's f·P), averaged over sequences and over
//   top-k layers.
// In both, the gradient flows through P (p), not through the counts.
// (BalanceLossForm and its names are in routing_config.hpp.)

// One layer's balance loss over this rank's B sequences, fused with its gradient: returns
// weight·Σ_sequences Σ_e f_e·P_e (weight = α / global sequences, further / top-k layers for
// kMaxText) and writes d_scores = ∂(that)/∂scores. `selected` is the layer's actual selection
// and `bias` its bias (both used by kMaxText only). topk_scratch holds [N, K]; scratch is
// resized to at most (S + 2)·E doubles once and reused.
template <class T>
double balance_loss_forward_backward(T* d_scores,            // [N, E] (overwritten)
                                     int32_t* topk_scratch,  // [N, K]
                                     std::vector<double>& scratch,
                                     const T* scores,          // [N, E] unbiased s(t)
                                     const int32_t* selected,  // [N, K]
                                     const float* bias,        // [E]
                                     int B, int S, int E, int K, double weight,
                                     BalanceLossForm form);

// b[e] += rate·sign(mean(c) − c[e]); with `center`, the update is then shifted to mean zero so
// the biases do not drift together (a common variant; the selection is unchanged by a shift).
void bias_update(std::span<float> bias,          // [E]
                 std::span<const int64_t> load,  // [E]
                 double rate, bool center);

// One shadow balancer's update of a layer's bias from the global loads its own routing gave
// (ShadowRule in routing_config.hpp). kSign and kSignCentered are bias_update(rate, center)
// itself, so a shadow with the run's own rule and rate holds the run's bias bit for bit;
// kProportional adds rate·(mean − c[e])/mean (nothing when no token was routed); kNone nothing.
void shadow_bias_update(const ShadowRule& rule, std::span<float> bias,  // [E]
                        std::span<const int64_t> load);                 // [E]

// Balance metrics of one layer from its global loads.
struct BalanceMetrics {
  double variance = 0;       // population variance of c over experts
  double max_violation = 0;  // (max c − mean c) / mean c
  double cv = 0;             // coefficient of variation: std / mean
};
BalanceMetrics balance_metrics(std::span<const int64_t> load);  // [E]

// max / mean of the rows each rank received (1 = perfectly even).
double overload_factor(std::span<const int64_t> rank_load);  // [W]

}  // namespace moe
