// Load balancing of top-k layers (docs/load-balancing.md): the sequence-wise balance loss with its
// gradient, the loss-free bias update, the extra routing policies (group-limited top-k, forced
// random), and the balance metrics computed from global loads.
//
// Legend: N = B·S local tokens in B sequences of S, E experts, K experts per token, L layers,
// W ranks, c[e] global load (assignments) of expert e in one layer.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

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
enum class BalanceLossForm { kDeepSeek, kMaxText };
BalanceLossForm balance_loss_form_from_name(std::string_view name);  // ConfigError otherwise
const char* balance_loss_form_name(BalanceLossForm form);

// One layer's balance loss over this rank's B sequences, fused with its gradient: returns
// weight·Σ_sequences Σ_e f_e·P_e (weight = α / global sequences, further / top-k layers for
// kMaxText) and writes d_scores = ∂(that)/∂scores. `selected` is the layer's actual selection
// and `bias` its bias (both used by kMaxText only). topk_scratch holds [N, K]; scratch is
// resized to at most (S + 2)·E doubles once and reused.
template <class T>
double balance_loss_forward_backward(T* d_scores,               // [N, E] (overwritten)
                                     int32_t* topk_scratch,     // [N, K]
                                     std::vector<double>& scratch,
                                     const T* scores,           // [N, E] unbiased s(t)
                                     const int32_t* selected,   // [N, K]
                                     const float* bias,         // [E]
                                     int B, int S, int E, int K, double weight,
                                     BalanceLossForm form);

// b[e] += rate·sign(mean(c) − c[e]); with `center`, the update is then shifted to mean zero so
// the biases do not drift together (a common variant; the selection is unchanged by a shift).
void bias_update(std::span<float> bias,            // [E]
                 std::span<const int64_t> load,    // [E]
                 double rate, bool center);

// Group-limited top-k (DeepSeek-V3 node-limited routing): the E experts form G equal groups; a
// group's score is the sum of its top K/M biased scores; the M best groups are kept and the K
// largest biased scores among their experts are selected (ties: lower index).
template <class T>
void route_topk_grouped(int32_t* expert_idx,  // [N, K]
                        const T* scores,      // [N, E]
                        const float* bias,    // [E] or nullptr
                        int N, int E, int K, int groups, int group_topk);

// Forced random routing for throughput runs: K distinct experts per token, a pure function of
// (stream, global token index), so any rank count draws the same experts for the same token.
// Expert e is drawn with weight (e + 1)^-zipf_alpha among those not yet taken (alpha 0: uniform);
// with probability h = hot_fraction a token's first slot is expert 0 (a "hot" expert), and
// otherwise its slots are drawn as without skew, expert 0 included: expert 0 holds h + (1 − h)/E
// of the first slots and serves h + (1 − h)·K/E of the tokens. Skew makes imbalance a controlled
// variable: plot step time against it.
struct RandomRouting {
  double zipf_alpha = 0.0;
  double hot_fraction = 0.0;
};
void route_random(int32_t* expert_idx,  // [N, K]
                  uint64_t stream, int64_t first_global_token, int N, int E, int K,
                  const RandomRouting& skew);

// Parses --force-balance: "none", "round-robin", "random", "zipf:ALPHA" (ALPHA >= 0) or
// "hot:FRACTION" (0..1). Throws ConfigError naming the option otherwise.
struct ForcedRouting {
  bool forced = false;       // false: natural routing
  bool round_robin = false;  // else random with `skew`
  RandomRouting skew;
};
ForcedRouting forced_routing_from_name(std::string_view spec);

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
